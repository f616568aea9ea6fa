// fake-device-plugin advertises accelerators that do not exist (for example
// nvidia.com/gpu=8) through the kubelet's device-plugin API, so pods that
// request GPUs are scheduled and admitted on the test node exactly as on a GPU
// node. No device is attached to the container: Allocate only sets an env var
// naming the fake device IDs, so tests can see that allocation happened.
//
// Patching Node.status.capacity would also make pods schedulable, but the
// kubelet resets extended resources it does not manage when it re-registers a
// node; a device plugin is what the kubelet itself keeps advertising.
//
//	fake-device-plugin -resource nvidia.com/gpu=8 -resource amd.com/gpu=8
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type resourceFlags []string

func (r *resourceFlags) String() string     { return strings.Join(*r, ",") }
func (r *resourceFlags) Set(v string) error { *r = append(*r, v); return nil }

func main() {
	var resources resourceFlags
	dir := flag.String("dir", pluginapi.DevicePluginPath, "kubelet device-plugin directory (holds kubelet.sock)")
	flag.Var(&resources, "resource", "NAME=COUNT to advertise, repeatable (default nvidia.com/gpu=8)")
	flag.Parse()
	if len(resources) == 0 {
		resources = resourceFlags{"nvidia.com/gpu=8"}
	}
	var plugins []*plugin
	for _, r := range resources {
		p, err := newPlugin(*dir, r)
		if err != nil {
			log.Fatalf("fake-device-plugin: %v", err)
		}
		plugins = append(plugins, p)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	for _, p := range plugins {
		go p.run(ctx)
	}
	<-ctx.Done()
	for _, p := range plugins {
		p.shutdown()
	}
}

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	dir, resource, socket, envName string
	devices                        []*pluginapi.Device
	server                         *grpc.Server
}

func newPlugin(dir, spec string) (*plugin, error) {
	name, countStr, ok := strings.Cut(spec, "=")
	count, err := strconv.Atoi(countStr)
	if !ok || err != nil || count < 1 || !strings.Contains(name, "/") {
		return nil, fmt.Errorf("parse -resource %q: want DOMAIN/NAME=COUNT with COUNT >= 1", spec)
	}
	safe := strings.NewReplacer("/", "_", ".", "_", "-", "_").Replace(name)
	p := &plugin{
		dir:      dir,
		resource: name,
		socket:   filepath.Join(dir, "et-fake-"+safe+".sock"),
		envName:  "ET_FAKE_DEVICES_" + strings.ToUpper(safe),
	}
	for i := range count {
		p.devices = append(p.devices, &pluginapi.Device{ID: fmt.Sprintf("fake-%d", i), Health: pluginapi.Healthy})
	}
	return p, nil
}

// run keeps the plugin registered: the kubelet deletes every socket in its
// device-plugin directory when it restarts, so a missing socket or a new
// kubelet.sock means "serve and register again".
func (p *plugin) run(ctx context.Context) {
	var kubeletID string
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		id := fileID(filepath.Join(p.dir, "kubelet.sock"))
		_, ownErr := os.Stat(p.socket)
		if id != "" && (id != kubeletID || ownErr != nil) {
			if err := p.serveAndRegister(ctx); err != nil {
				log.Printf("fake-device-plugin %s: %v (will retry)", p.resource, err)
			} else {
				kubeletID = id
				log.Printf("fake-device-plugin: registered %s x%d", p.resource, len(p.devices))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func fileID(path string) string {
	st, err := os.Stat(path)
	if err != nil {
		return ""
	}
	s := st.Sys().(*syscall.Stat_t)
	return fmt.Sprintf("%d/%d", s.Ino, st.ModTime().UnixNano())
}

func (p *plugin) serveAndRegister(ctx context.Context) error {
	p.shutdown()
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", p.dir, err)
	}
	lis, err := net.Listen("unix", p.socket)
	if err != nil {
		return fmt.Errorf("listen %s: %w", p.socket, err)
	}
	p.server = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(p.server, p)
	go func() { _ = p.server.Serve(lis) }()

	conn, err := grpc.NewClient("unix://"+filepath.Join(p.dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial kubelet: %w", err)
	}
	defer conn.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(rctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: p.resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	if err != nil {
		return fmt.Errorf("register with kubelet: %w", err)
	}
	return nil
}

func (p *plugin) shutdown() {
	if p.server != nil {
		p.server.Stop()
		p.server = nil
	}
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Printf("fake-device-plugin: remove %s: %v", p.socket, err)
	}
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the device list once; fake devices never change health.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return fmt.Errorf("send device list: %w", err)
	}
	<-s.Context().Done()
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{p.envName: strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Package tcpstoretest starts TCPStore servers for tests and benchmarks, as
// net/http/httptest starts HTTP servers: ours (internal/tcpstore) in the
// test's own process, and torch's own (torch_server.py) in a trainer root
// filesystem, the baseline that the conformance test
// (test/integration/tcpstore) and the c10d benchmarks (test/bench/sidecar)
// compare ours with.
//
// It imports internal/tcpstore, so that package's own tests use it from its
// external test package (tcpstore_test).
package tcpstoretest

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/elastic-training/elastic-training/internal/tcpstore"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

// Server is a tcpstore.Server serving on a loopback port until its test
// ends.
type Server struct {
	*tcpstore.Server
	Addr     string               // host:port
	Registry *prometheus.Registry // its metrics
	Log      *testenv.SyncBuffer  // its log, from level Debug
}

// Start serves a tcpstore.Server made with cfg, whose Log and Metrics it
// replaces with the Server's, on a free loopback port. The test's cleanup
// stops it, fails the test when Serve returned an error and, when the test
// failed, logs the server's log.
func Start(t testing.TB, cfg tcpstore.Config) *Server {
	t.Helper()
	s := &Server{Registry: prometheus.NewRegistry(), Log: &testenv.SyncBuffer{}}
	cfg.Log = slog.New(slog.NewTextHandler(s.Log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Metrics = s.Registry
	srv, err := tcpstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Server = srv
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = l.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if t.Failed() {
			t.Logf("server log:\n%s", s.Log.String())
		}
	})
	return s
}

// OpsServed is how many requests of each type the server served (its
// elastic_training_sidecar_tcpstore_ops_total counter by op), the types it served none of
// left out.
func (s *Server) OpsServed(t testing.TB) map[string]int {
	t.Helper()
	mfs, err := s.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, mf := range mfs {
		if mf.GetName() != "elastic_training_sidecar_tcpstore_ops_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if n := int(m.GetCounter().GetValue()); n > 0 {
				out[m.GetLabel()[0].GetValue()] = n
			}
		}
	}
	return out
}

// torchServer is torch_server.py, run with python3 -c.
//
//go:embed torch_server.py
var torchServer string

// StartTorch runs torch's own TCPStore server, the classic one (Debian's
// torch has no libuv), on a free loopback port in the trainer root
// filesystem root (testenv.Rootfs), and returns its address (host:port) and
// its process (whose PID is python's) once it listens.
func StartTorch(t testing.TB, root string) (string, *testenv.Proc) {
	t.Helper()
	return StartTorchWith(t, func(args ...string) *exec.Cmd { return testenv.InRootfs(root, "/usr/bin/python3", args...) })
}

// StartTorchWith is StartTorch with the python3 that python runs (given
// python3's arguments), for a python with torch outside a root filesystem.
func StartTorchWith(t testing.TB, python func(args ...string) *exec.Cmd) (string, *testenv.Proc) {
	t.Helper()
	port := testenv.FreePort(t)
	cmd := python("-c", torchServer, fmt.Sprint(port))
	cmd.Env = testenv.TorchEnv()
	p := testenv.Start(t, "torch-server", cmd)
	testenv.WaitOutput(t, p, "READY", 2*time.Minute)
	return fmt.Sprintf("127.0.0.1:%d", port), p
}

// Client is one raw TCPStore connection (tcpstore.Client).
type Client = tcpstore.Client

// Dial connects to addr (tcpstore.Dial).
func Dial(addr string) (*Client, error) { return tcpstore.Dial(addr) }

package sidecar

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/elastic-training/elastic-training/internal/etcdclient"
	"github.com/elastic-training/elastic-training/internal/storeproxy"
)

// JoinConfig configures join mode.
type JoinConfig struct {
	Options
	Client etcdclient.Config
	C10d   C10dProxyConfig
}

// C10dProxyConfig: the trainer reaches the job's c10d store through this
// pod's sidecar (storeproxy), which cuts its connections when the pod's
// registration ends.
type C10dProxyConfig struct {
	Addr     string // where the trainer connects (loopback); "" = no proxy
	Upstream string // the store: the rendezvous Service's host:port
	// Verify: carry the connections to the store only once it names itself a pod of this pod's job, there and
	// not to Upstream (verify.go). Needs Member.Register (this pod's stable name).
	Verify   bool
	Wait     time.Duration
	MaxConns int
}

// Join registers this pod and keeps its files current until ctx ends; then
// it deregisters at once.
func Join(ctx context.Context, cfg JoinConfig) error {
	var eps []string
	mets, err := cfg.begin(true, func() (err error) {
		if cfg.C10d.Addr != "" && cfg.C10d.Upstream == "" && !cfg.C10d.Verify {
			return errors.New("--c10d-upstream (or --c10d-verify) is required with --c10d-addr")
		}
		if cfg.C10d.Verify && !cfg.Member.Register {
			return errors.New("--c10d-verify needs --register=true: this pod's stable name tells which job's store it may reach")
		}
		eps, err = cfg.Client.EndpointURLs()
		return err
	})
	if err != nil {
		return err
	}
	cli, err := etcdclient.New(cfg.Client)
	if err != nil {
		return err
	}
	defer cli.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if cfg.C10d.Addr != "" {
		ln, err := net.Listen("tcp", cfg.C10d.Addr)
		if err != nil {
			return fmt.Errorf("--c10d-addr: %w", err)
		}
		plog := cfg.Log.With("component", "c10d-proxy")
		upstream := storeproxy.Fixed(cfg.C10d.Upstream)
		reset := func() {}
		if cfg.C10d.Verify {
			v := newVerifiedStore(cli, cfg.Member.Member.Host, plog, cfg.Metrics)
			upstream, reset = v.resolve, v.reset
		}
		proxy := storeproxy.New(upstream, cfg.C10d.Wait, cfg.C10d.MaxConns, plog)
		if cfg.Member.Register {
			cfg.Member.OnRegistered = chain(func() { reset(); proxy.SetOpen(true) }, cfg.Member.OnRegistered)
			cfg.Member.OnLost = chain(func() { proxy.SetOpen(false); reset() }, cfg.Member.OnLost)
		} else {
			proxy.SetOpen(true)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := proxy.Serve(ctx, ln); err != nil {
				cfg.Log.Error("c10d store proxy stopped", "err", err)
			}
		}()
	}
	st := &memberState{}
	if err := startCheckpoints(ctx, &wg, cfg.Checkpoint, cli, cfg.Member.Member.Host, st, cfg.Log); err != nil {
		return err
	}
	// The trainer's own way to the store: the proxy, which carries it only while this pod is a member.
	if err := startProgress(ctx, &wg, cfg.Progress, cmp.Or(loopbackOf(cfg.C10d.Addr), cfg.C10d.Upstream), cli, cfg.Member.Member.Host, cfg.Log); err != nil {
		return err
	}
	// Only now that the files are installed and the proxy listens: /startz starts the trainer (health.go).
	stopHealth, err := startHealth(cfg.HealthAddr, func() (bool, string) { return st.ready(cfg.Member.Register) }, cfg.Metrics, nil, cfg.Log)
	if err != nil {
		return err
	}
	defer stopHealth()
	cfg.Log.Info("joining rendezvous", "endpoints", strings.Join(eps, ","), "register", cfg.Member.Register,
		"member", cfg.Member.Member.Host, "files_dir", cfg.Member.FilesDir, "c10d_proxy", cfg.C10d.Addr)
	runMember(ctx, cli, cfg.Member, cfg.Log, st, mets)
	return nil
}

// chain calls f, then g if not nil.
func chain(f, g func()) func() {
	if g == nil {
		return f
	}
	return func() { f(); g() }
}

// Package sidecar is the rendezvous sidecar's modes: serve (embedded etcd
// with the v3 API and the v2 keys API on one client port), join (register
// this pod, keep the files current), their health endpoints, and the
// launcher's wait and hosts.
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"

	"github.com/elastic-training/elastic-training/internal/atomicfile"
	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/tcpstore"
	"github.com/elastic-training/elastic-training/internal/v2api"
)

// v2SnapshotFile holds the v2 keys between a graceful shutdown and the next
// start (the v2 store lives in memory).
const v2SnapshotFile = "v2-keys.json"

// ServeConfig configures serve mode.
type ServeConfig struct {
	Options
	Name                string
	DataDir             string
	ListenClientURLs    []url.URL
	AdvertiseClientURLs []url.URL
	ListenPeerURLs      []url.URL
	// Client TLS (all empty = plain HTTP; a certificate makes the client
	// URLs https).
	CertFile, KeyFile, TrustedCAFile string
	ClientCertAuth                   bool
	// MaxDirTTL caps v2 directory TTLs (see v2api's dirttl.go).
	MaxDirTTL     time.Duration
	UnsafeNoFsync bool
	EtcdLogLevel  string
	ReadyTimeout  time.Duration
	// C10dAddr is where torch's c10d TCPStore is served ("" = not at all).
	C10dAddr string
	// EventsJob names the Job on which each torch rendezvous round is recorded
	// as an Event ("" = none), with the in-cluster token in constants.TokenDir.
	EventsJob string
}

func (c ServeConfig) checkTLS() error {
	if (c.CertFile == "") != (c.KeyFile == "") {
		return errors.New("--cert-file and --key-file go together")
	}
	return nil
}

// Serve runs the embedded etcd until ctx ends (SIGTERM) or etcd fails.
// With Member.Register or Member.FilesDir this process is a member too.
func Serve(ctx context.Context, cfg ServeConfig) error {
	mets, err := cfg.begin(false, cfg.checkTLS)
	if err != nil {
		return err
	}
	log := cfg.Log
	var etcd atomic.Pointer[embed.Etcd]
	urls := make([]string, len(cfg.AdvertiseClientURLs))
	for i, u := range cfg.AdvertiseClientURLs {
		urls[i] = u.String()
	}
	rounds := newRoundLogger(log, mets)
	var c10dStore atomic.Pointer[tcpstore.Server]
	if cfg.EventsJob != "" {
		// The rendezvous matters more than its Events: without them it still serves.
		if ev, err := newRoundEvents(cfg.EventsJob, log.With("component", "events")); err != nil {
			log.Warn("recording no rendezvous Events", "err", err)
		} else {
			rounds.events = ev
			defer ev.stop()
		}
	}
	v2 := v2api.New(v2api.Config{
		ClusterID: func() string {
			if e := etcd.Load(); e != nil {
				return e.Server.Cluster().ID().String()
			}
			return ""
		},
		ClientURLs: func() []string { return urls },
		Raft: func() (uint64, uint64) {
			if e := etcd.Load(); e != nil {
				return e.Server.CommittedIndex(), e.Server.Term()
			}
			return 0, 0
		},
		MaxDirTTL: cfg.MaxDirTTL,
		Metrics:   mets.v2,
		OnWrite:   rounds.observe,
		Logger:    log,
	})

	// torch's state of a dynamic rendezvous: etcd_rendezvous_backend's and
	// c10d_rendezvous_backend's keys (base64 of the pickle).
	rounds.state = func(backend, runID string) ([]byte, bool) {
		switch backend {
		case constants.BackendEtcdV2:
			v, ok := v2.Value("/torch/elastic/rendezvous/" + runID)
			return []byte(v), ok
		case constants.BackendC10d:
			if c := c10dStore.Load(); c != nil {
				return c.Get("/torch.rendezvous." + runID)
			}
		}
		return nil, false
	}

	// A graceful shutdown leaves the v2 keys in the data dir; take them back
	// (once: the file is removed, so a crash never resurrects old state).
	snapPath := filepath.Join(cfg.DataDir, v2SnapshotFile)
	if data, err := os.ReadFile(snapPath); err == nil {
		if err := v2.Restore(data); err != nil {
			log.Warn("ignoring the v2 snapshot of the last shutdown", "err", err)
		} else {
			log.Info("restored v2 keys saved at the last graceful shutdown", "index", v2.Store().Index())
		}
		os.Remove(snapPath)
	}

	// torch 2.4/2.5's etcd-v2 backend fails on a store without this
	// directory ("Key not found : /torch/elastic/store"; fixed upstream later).
	if err := v2.EnsureDir("/torch/elastic/store"); err != nil {
		return fmt.Errorf("prepare v2 store: %w", err)
	}

	ec := embed.NewConfig()
	ec.Name = cfg.Name
	ec.Dir = cfg.DataDir
	ec.ListenClientUrls = slices.Clone(cfg.ListenClientURLs)
	if cfg.CertFile != "" {
		for i := range ec.ListenClientUrls {
			ec.ListenClientUrls[i].Scheme = "https"
		}
	}
	ec.AdvertiseClientUrls = cfg.AdvertiseClientURLs
	ec.ListenPeerUrls = cfg.ListenPeerURLs
	ec.AdvertisePeerUrls = cfg.ListenPeerURLs
	ec.InitialCluster = ec.InitialClusterFromName(cfg.Name)
	ec.UserHandlers = v2.Handlers()
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	var closing atomic.Bool
	if cfg.EtcdLogLevel == "" {
		cfg.EtcdLogLevel = "warn"
	}
	zl, err := etcdLogger(cfg.EtcdLogLevel, log.With("component", "etcd").Handler(), &closing)
	if err != nil {
		return fmt.Errorf("--etcd-log-level: %w", err)
	}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zl)
	ec.ClientTLSInfo.CertFile = cfg.CertFile
	ec.ClientTLSInfo.KeyFile = cfg.KeyFile
	ec.ClientTLSInfo.TrustedCAFile = cfg.TrustedCAFile
	ec.ClientTLSInfo.ClientCertAuth = cfg.ClientCertAuth
	// A rendezvous store holds little: keep the backend and the history small.
	ec.AutoCompactionMode = embed.CompactorModeRevision
	ec.AutoCompactionRetention = "1000"
	ec.SnapshotCount = 10000

	start := time.Now()
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	etcd.Store(e)
	closeEtcd := sync.OnceFunc(e.Close) // embed's Close is not idempotent
	defer closeEtcd()
	timeout := cfg.ReadyTimeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(timeout):
		e.Server.Stop()
		return fmt.Errorf("start etcd: not ready after %s", timeout)
	case err := <-e.Err():
		return fmt.Errorf("start etcd: %w", err)
	case <-ctx.Done():
		return nil
	}
	log.Info("rendezvous server ready", "client_urls", fmt.Sprint(urls), "data_dir", cfg.DataDir,
		"cluster_id", e.Server.Cluster().ID().String(), "startup", time.Since(start).Round(time.Millisecond).String(),
		"apis", "etcd v3 + etcd v2 keys (/v2/keys)")

	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() { defer wg.Done(); v2.RunExpiry(rctx, 100*time.Millisecond) }()

	if cfg.C10dAddr != "" {
		// After etcd is ready, so that a c10d client never meets a sidecar
		// that answers but is not ready.
		c10d, err := serveC10d(rctx, &wg, cfg.C10dAddr, log.With("component", "c10d"), cfg.Metrics, rounds.observeC10d)
		if err != nil {
			return err
		}
		c10dStore.Store(c10d)
	}

	st := &memberState{}
	if cfg.Member.active() {
		cli := v3client.New(e.Server)
		wg.Add(1)
		go func() { defer wg.Done(); defer cli.Close(); runMember(rctx, cli, cfg.Member, log, st, mets) }()
	}
	stopHealth, err := startHealth(cfg.HealthAddr, func() (bool, string) {
		select {
		case <-e.Server.ReadyNotify():
		default:
			return false, "etcd not ready"
		}
		if cfg.Member.active() {
			return st.ready(cfg.Member.Register)
		}
		return true, "ok"
	}, cfg.Metrics, map[string]http.HandlerFunc{"/rendezvous": rounds.serveView}, log)
	if err != nil {
		return err
	}
	defer stopHealth()

	select {
	case <-ctx.Done():
		log.Info("shutting down: deregistering, ending v2 waits, stopping etcd")
	case err := <-e.Err():
		return fmt.Errorf("etcd: %w", err)
	}
	cancel()
	wg.Wait()
	v2.Close()
	if data, err := v2.Snapshot(); err != nil {
		log.Warn("could not save the v2 keys", "err", err)
	} else if _, err := atomicfile.Write(cfg.DataDir, v2SnapshotFile, data, 0o600); err != nil {
		log.Warn("could not save the v2 keys", "err", err)
	}
	closing.Store(true)
	closeEtcd()
	log.Info("rendezvous server stopped")
	return nil
}

// serveC10d serves torch's c10d TCPStore on addr until ctx ends. Its keys
// live in memory only: after a restart the agents find an empty store and
// form a new round, as torch's own store hosted by an agent would make them.
func serveC10d(ctx context.Context, wg *sync.WaitGroup, addr string, log *slog.Logger, reg prometheus.Registerer, onSet func(string, []byte)) (*tcpstore.Server, error) {
	srv, err := tcpstore.New(tcpstore.Config{Log: log, Metrics: reg, OnSet: onSet})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("c10d store: %w", err)
	}
	log.Info("c10d store listening", "addr", ln.Addr().String())
	wg.Go(func() {
		if err := srv.Serve(ctx, ln); err != nil {
			log.Error("c10d store stopped", "err", err)
		}
	})
	return srv, nil
}

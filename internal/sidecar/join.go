package sidecar

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/elastic-training/elastic-training/internal/hostfile"
	"github.com/elastic-training/elastic-training/internal/membership"
)

// ClientConfig says how to reach the rendezvous server.
type ClientConfig struct {
	Endpoints   []string
	DialTimeout time.Duration
	// TLS (etcdctl's flag names: --cacert, --cert, --key).
	CAFile, CertFile, KeyFile string
}

// NewClient connects to the rendezvous server's v3 API.
func NewClient(c ClientConfig) (*clientv3.Client, error) {
	var tlsCfg *tls.Config
	if c.CAFile != "" || c.CertFile != "" {
		info := transport.TLSInfo{TrustedCAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile}
		var err error
		if tlsCfg, err = info.ClientConfig(); err != nil {
			return nil, fmt.Errorf("client TLS: %w", err)
		}
	}
	dt := c.DialTimeout
	if dt <= 0 {
		dt = 5 * time.Second
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: c.Endpoints, DialTimeout: dt, TLS: tlsCfg,
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 3 * time.Second,
		Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", strings.Join(c.Endpoints, ","), err)
	}
	return cli, nil
}

// JoinConfig configures join mode.
type JoinConfig struct {
	Client     ClientConfig
	HealthAddr string
	Member     MemberConfig
	Log        *slog.Logger
}

// Join registers this pod and keeps its files current until ctx ends; then
// it deregisters at once.
func Join(ctx context.Context, cfg JoinConfig) error {
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	cli, err := NewClient(cfg.Client)
	if err != nil {
		return err
	}
	defer cli.Close()
	st := &memberState{}
	if cfg.HealthAddr != "" {
		hs := &http.Server{Addr: cfg.HealthAddr, Handler: healthMux(func() (bool, string) {
			return st.ready(cfg.Member.Register)
		}), ReadHeaderTimeout: 10 * time.Second}
		if err := startHTTP(hs, log); err != nil {
			return err
		}
		defer hs.Close()
	}
	log.Info("joining rendezvous", "endpoints", strings.Join(cfg.Client.Endpoints, ","), "register", cfg.Member.Register,
		"member", cfg.Member.Member.Host, "files_dir", cfg.Member.FilesDir)
	runMember(ctx, cli, cfg.Member, log, st)
	return nil
}

// WaitMembers blocks until at least n members are registered or timeout
// passes; the error then says how many are there and who.
func WaitMembers(ctx context.Context, cli *clientv3.Client, prefix string, n int, timeout time.Duration) ([]hostfile.Member, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan []hostfile.Member, 1)
	go membership.Watch(ctx, cli, prefix, 2*time.Second, nil, func(ms []hostfile.Member) {
		if len(ms) >= n {
			select {
			case done <- ms:
			default:
			}
		}
	})
	select {
	case ms := <-done:
		return ms, nil
	case <-ctx.Done():
		lctx, lcancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer lcancel()
		ms, _, err := membership.List(lctx, cli, prefix)
		if err != nil && ms == nil {
			return nil, fmt.Errorf("wait for %d members: none listed after %s (%v)", n, timeout, err)
		}
		return ms, fmt.Errorf("wait for %d members: only %s after %s", n, membership.Describe(ms), timeout)
	}
}

// InstallSelf copies this executable into dir as name (mode 0555), so a
// launcher in any image can run `<dir>/rdzv-sidecar wait ...`. It streams
// the copy (the binary is tens of MiB; reading it whole would stay in RSS).
func InstallSelf(dir, name string) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("install sidecar binary: %w", err)
	}
	src, err := os.Open(exe)
	if err != nil {
		return fmt.Errorf("install sidecar binary: %w", err)
	}
	defer src.Close()
	if err := hostfile.WriteAtomicFrom(dir, name, src, 0o555); err != nil {
		return fmt.Errorf("install sidecar binary: %w", err)
	}
	return nil
}

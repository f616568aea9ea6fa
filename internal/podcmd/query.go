// Package podcmd is the commands a pod runs from the rdzv-sidecar binary the
// sidecar installs into it (/etc/elastic-training/rdzv-sidecar): wait and
// hosts (a launcher script's view of the membership), supervise and launch
// (an MPI launcher's mpirun, stopped and run again as members leave and
// join), and progress (the job chart's helm test). Each is a client of the
// job's rendezvous server; none serves anything.
package podcmd

import (
	"context"
	"fmt"
	"io"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/elastic-training/elastic-training/internal/etcdclient"
	"github.com/elastic-training/elastic-training/internal/hostfile"
	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/membership/etcdmembers"
)

// QueryConfig is what wait and hosts share: where the members are
// registered, how long to try and how to print them.
type QueryConfig struct {
	Client  etcdclient.Config
	Prefix  string
	Flavour hostfile.Flavour
	Timeout time.Duration
}

// connect checks the flavour and connects.
func (q QueryConfig) connect() (*clientv3.Client, error) {
	if _, err := hostfile.ParseFlavour(string(q.Flavour)); err != nil {
		return nil, fmt.Errorf("--hostfile-flavour: %w", err)
	}
	return etcdclient.New(q.Client)
}

func (q QueryConfig) print(w io.Writer, ms []membership.Member) error {
	out, err := hostfile.Render(q.Flavour, ms)
	if err != nil {
		return err
	}
	_, err = w.Write(out)
	return err
}

// WaitConfig configures wait mode.
type WaitConfig struct {
	QueryConfig
	Members int
	Quiet   bool // print nothing on success
}

// Wait waits until at least cfg.Members members are registered, then prints
// them to stdout (progress goes to stderr).
func Wait(ctx context.Context, cfg WaitConfig, stdout, stderr io.Writer) error {
	if cfg.Members < 1 {
		return fmt.Errorf("--members must be ≥ 1, got %d", cfg.Members)
	}
	cli, err := cfg.connect()
	if err != nil {
		return err
	}
	defer cli.Close()
	fmt.Fprintf(stderr, "rdzv-sidecar wait: waiting up to %s for %d members at %s\n", cfg.Timeout, cfg.Members, cfg.Client.Endpoints)
	ms, err := waitMembers(ctx, cli, cfg.Prefix, cfg.Members, cfg.Timeout)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "rdzv-sidecar wait: %s\n", membership.Describe(ms))
	if cfg.Quiet {
		return nil
	}
	return cfg.print(stdout, ms)
}

// Hosts prints the registered members to stdout; cfg.Timeout bounds the
// request.
func Hosts(ctx context.Context, cfg QueryConfig, stdout io.Writer) error {
	cli, err := cfg.connect()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	ms, _, err := etcdmembers.List(ctx, cli, cfg.Prefix)
	if err != nil && ms == nil {
		return err
	}
	return cfg.print(stdout, ms)
}

// waitMembers blocks until at least n members are registered or timeout
// passes; the error then says how many are there and who.
func waitMembers(ctx context.Context, cli *clientv3.Client, prefix string, n int, timeout time.Duration) ([]membership.Member, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan []membership.Member, 1)
	go etcdmembers.Watch(ctx, cli, prefix, 2*time.Second, nil, func(ms []membership.Member) {
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
		ms, _, err := etcdmembers.List(lctx, cli, prefix)
		if err != nil && ms == nil {
			return nil, fmt.Errorf("wait for %d members: none listed after %s (%v)", n, timeout, err)
		}
		return ms, fmt.Errorf("wait for %d members: only %s after %s", n, membership.Describe(ms), timeout)
	}
}

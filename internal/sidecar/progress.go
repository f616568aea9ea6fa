package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/time/rate"

	"github.com/elastic-training/elastic-training/internal/constants"

	"github.com/elastic-training/elastic-training/internal/progress"
	"github.com/elastic-training/elastic-training/internal/rdzv/c10drounds"
	"github.com/elastic-training/elastic-training/internal/tcpstore"
)

// ProgressConfig: this pod's ranks tell its sidecar of their steps (elastic_training.progress, or a datagram of
// the shell's), which reports them to the serving sidecar through the job's store (docs/hangs.md).
type ProgressConfig struct {
	// Addr is the UDP address the trainer sends to (loopback: only the pod's own processes), or "unix:" and the
	// path of a Unix datagram socket (host networking, where the loopback is the node's); "" = none.
	Addr string
	// RunID is the job's rendezvous run (the agents' --rdzv-id): the reports go to the c10d store, under the run's
	// keys. "": into the job's etcd (constants.ProgressPrefix), where an MPI launcher's supervise judges them.
	RunID string
	// Every is how often a changed report is sent (0: a second).
	Every time.Duration
}

func (c ProgressConfig) check() error {
	if c.Addr == "" {
		return nil
	}
	if path, ok := unixPath(c.Addr); ok {
		return checkUnixPath("--progress-addr", path)
	}
	if host, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("--progress-addr: %w", err)
	} else if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--progress-addr %s: want a loopback address (only the pod's own processes report)", c.Addr)
	}
	return nil
}

// startProgress hears this pod's ranks at c.Addr and reports them, when they changed, to the c10d store at store
// or, without c.RunID, into the job's etcd through etcd (host is this pod's member), until ctx ends. Without c.Addr
// it does nothing.
func startProgress(ctx context.Context, wg *sync.WaitGroup, c ProgressConfig, store string, etcd *clientv3.Client, host string, log *slog.Logger) error {
	if c.Addr == "" {
		return nil
	}
	if c.RunID == "" && etcd == nil {
		return errors.New("--progress-addr without --run-id reports into the job's etcd, which this sidecar has no client of")
	}
	// A candidate that begins to serve binds the address its follow (a join) held until a moment ago (a Unix
	// socket: takes its place at once).
	listen := func() (net.PacketConn, error) {
		if path, ok := unixPath(c.Addr); ok {
			_, pc, err := listenUnix("unixgram", path)
			return pc, err
		}
		return net.ListenPacket("udp", c.Addr)
	}
	pc, err := listen()
	for deadline := time.Now().Add(5 * time.Second); err != nil && time.Now().Before(deadline) && ctx.Err() == nil; {
		time.Sleep(100 * time.Millisecond)
		pc, err = listen()
	}
	if err != nil {
		return fmt.Errorf("--progress-addr: %w", err)
	}
	if c.Every <= 0 {
		c.Every = time.Second
	}
	log = log.With("component", "progress")
	var mu sync.Mutex
	local := progress.NewLocal()
	wg.Go(func() { <-ctx.Done(); pc.Close() })
	wg.Go(func() {
		bad := rate.NewLimiter(rate.Every(time.Minute), 3)
		buf := make([]byte, progress.MaxUpdate+1)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				if ctx.Err() == nil {
					log.Error("progress: the trainer's updates are no longer heard", "err", err)
				}
				return
			}
			u, err := progress.ParseUpdate(buf[:n])
			if err == nil {
				mu.Lock()
				if !local.Observe(u, time.Now()) {
					err = fmt.Errorf("rank %d: this pod reports at most %d ranks", u.Rank, progress.MaxRanks)
				}
				mu.Unlock()
			}
			if err != nil && bad.Allow() {
				log.Warn("progress: ignoring an update", "err", err)
			}
		}
	})
	send, to, stop := c10dReporter(store, c10drounds.Prefix+c.RunID+"/progress/"+host)
	if c.RunID == "" {
		send, to, stop = etcdReporter(etcd, constants.ProgressPrefix+host)
	}
	wg.Go(func() {
		defer stop()
		failed := rate.NewLimiter(rate.Every(time.Minute), 1)
		unsent := false // the last report did not reach the store
		tick(ctx, c.Every, func() {
			mu.Lock()
			if !local.Changed() && !unsent {
				mu.Unlock()
				return
			}
			value := local.Report(time.Now()).Encode()
			mu.Unlock()
			err := send(value)
			if unsent = err != nil; unsent && failed.Allow() {
				log.Warn("progress: cannot report to the job's store; retrying", "store", to, "err", err)
			}
		})
	})
	log.Info("hearing the trainer's progress", "addr", c.Addr, "reports_to", to)
	return nil
}

// c10dReporter writes the reports to key in the c10d store at addr, on one connection; stop closes it.
func c10dReporter(addr, key string) (send func([]byte) error, to string, stop func()) {
	var cli *tcpstore.Client
	return func(value []byte) error { return report(&cli, addr, key, value) }, addr, func() {
		if cli != nil {
			cli.Close()
		}
	}
}

// etcdReporter puts the reports at key in the job's etcd; stop deletes it, so that a pod that ends leaves no
// report behind (the launcher forgets its ranks).
func etcdReporter(cli *clientv3.Client, key string) (send func([]byte) error, to string, stop func()) {
	return func(value []byte) error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := cli.Put(ctx, key, string(value))
			return err
		}, "etcd " + key, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, _ = cli.Delete(ctx, key)
		}
}

// report writes key to the store at addr on *cli, dialing it first when there is none; a failed write drops the
// connection.
func report(cli **tcpstore.Client, addr, key string, value []byte) error {
	if *cli == nil {
		c, err := tcpstore.Dial(addr)
		if err != nil {
			return err
		}
		*cli = c
	}
	(*cli).Conn().SetWriteDeadline(time.Now().Add(5 * time.Second))
	err := (*cli).Send(&tcpstore.Request{Op: tcpstore.OpSet, Key: key, Value: value})
	if err != nil {
		(*cli).Close()
		*cli = nil
	}
	return err
}

// loopbackOf is addr with an unspecified host made the loopback: where this pod's own processes reach a server
// that listens on every interface.
func loopbackOf(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

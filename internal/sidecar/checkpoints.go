package sidecar

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/elastic-training/elastic-training/internal/checkpoint"
	"github.com/elastic-training/elastic-training/internal/checkpoint/holder"
	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/torchview/jobevents"
)

// CheckpointConfig: this pod's part of the job's in-memory checkpoints
// (docs/checkpoints.md); off without Dir.
type CheckpointConfig struct {
	Dir  string // the memory-backed directory the trainer saves into ($ET_CHECKPOINT_DIR)
	Addr string // the holder's server: peers and, on loopback, the trainer ($ET_CHECKPOINT_URL)
	// Local, when set, is a Unix socket where the trainer's routes are served instead, and Addr serves peers only
	// (host networking: the node's loopback is not the pod's).
	Local    string
	Replicas int
	Memory   int64 // bytes
}

// Share is what the checkpoint volume may hold (0: no checkpoints): its pages count against the container's
// memory limit.
func (c CheckpointConfig) Share() int64 {
	if c.Dir == "" {
		return 0
	}
	return c.Memory
}

func (c CheckpointConfig) check(m MemberConfig) error {
	if c.Dir == "" {
		return nil
	}
	if !m.Register {
		return errors.New("--checkpoint-dir needs --register=true: the pieces are announced under this member's name")
	}
	if c.Replicas < 0 {
		return fmt.Errorf("--checkpoint-replicas: %d is negative", c.Replicas)
	}
	if c.Memory <= 0 {
		return fmt.Errorf("--checkpoint-memory: %d bytes", c.Memory)
	}
	if c.Local != "" {
		return checkUnixPath("--checkpoint-local", c.Local)
	}
	return nil
}

// startCheckpoints runs the holder and its server until ctx ends.
func startCheckpoints(ctx context.Context, wg *sync.WaitGroup, c CheckpointConfig, cli *clientv3.Client, self string, st *memberState, log *slog.Logger) error {
	if c.Dir == "" {
		return nil
	}
	// Before the trainer starts (this runs before /startz answers): the trainer's saves go in this directory, and
	// this sidecar, another user, must be able to remove them: everyone's, not sticky.
	if err := os.MkdirAll(c.Dir, 0o777); err != nil {
		return fmt.Errorf("--checkpoint-dir: %w", err)
	}
	if err := os.Chmod(c.Dir, 0o777); err != nil {
		return fmt.Errorf("--checkpoint-dir: %w", err)
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("--checkpoint-addr: %w", err)
	}
	var local net.Listener
	if c.Local != "" {
		if local, _, err = listenUnix("unix", c.Local); err != nil {
			ln.Close()
			return fmt.Errorf("--checkpoint-local: %w", err)
		}
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	peerPort, _ := strconv.Atoi(port)
	log = log.With("component", "checkpoints")
	h := holder.New(holder.Config{Dir: c.Dir, Self: self, Replicas: c.Replicas, Memory: c.Memory, Client: cli,
		Prefix: constants.CheckpointsPrefix, IncidentKey: constants.CheckpointIncidentsPrefix + self, PeerPort: peerPort, Log: log,
		Members: func() []checkpoint.Holder {
			ms := st.listed()
			out := make([]checkpoint.Holder, len(ms))
			for i, m := range ms {
				out[i] = checkpoint.Holder{Host: m.Host, Node: m.Node}
			}
			return out
		}})
	serve := func(ln net.Listener, handler http.Handler) {
		wg.Go(func() {
			if err := h.ServeHandler(ctx, ln, handler); err != nil {
				log.Error("checkpoint server stopped", "addr", ln.Addr().String(), "err", err)
			}
		})
	}
	if local == nil {
		serve(ln, h.Handler())
	} else {
		serve(ln, h.PeerHandler())
		serve(local, h.LocalHandler())
	}
	wg.Go(func() { h.Run(ctx) })
	log.Info("in-memory checkpoints", "dir", c.Dir, "addr", ln.Addr().String(), "trainer", cmp.Or(c.Local, "loopback"), "replicas", c.Replicas, "memory_bytes", c.Memory)
	return nil
}

// watchIncidents makes every incident a pod's holder writes into the job's store (a save or a copy that did not
// fit in its checkpoint.memory) a Warning Event on the Job, until ctx ends; a value that does not parse (any pod may
// write there) is logged and dropped. The recorder's own spam filter bounds the Events of a pod that keeps failing.
func watchIncidents(ctx context.Context, cli *clientv3.Client, w warner, log *slog.Logger) {
	for ctx.Err() == nil {
		for wr := range cli.Watch(clientv3.WithRequireLeader(ctx), constants.CheckpointIncidentsPrefix, clientv3.WithPrefix()) {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				in, err := checkpoint.ParseIncident(ev.Kv.Value)
				if err != nil {
					log.Warn("a checkpoint incident in the job's store is not usable", "key", string(ev.Kv.Key), "err", err)
					continue
				}
				w.Warning(jobevents.ReasonCheckpointDoesNotFit, in.Message())
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

package sidecar

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/elastic-training/elastic-training/internal/hostfile"
	"github.com/elastic-training/elastic-training/internal/membership"
)

// MemberConfig is what both serve and join do for their pod: register it
// (unless Register is false) and keep the files in FilesDir current.
type MemberConfig struct {
	Prefix   string
	Register bool
	Member   hostfile.Member
	LeaseTTL time.Duration
	FilesDir string // empty: write no files
	Flavour  hostfile.Flavour
	Resync   time.Duration
}

// Validate checks the member flags before anything starts.
func (c MemberConfig) Validate() error {
	if c.Register {
		if err := hostfile.Validate([]hostfile.Member{c.Member}); err != nil {
			return fmt.Errorf("--member-*: %w", err)
		}
	}
	if c.FilesDir != "" {
		if _, err := hostfile.ParseFlavour(string(c.Flavour)); err != nil {
			return fmt.Errorf("--hostfile-flavour: %w", err)
		}
	}
	return nil
}

// memberState is what /readyz of join reports and what tests wait on.
type memberState struct {
	mu         sync.Mutex
	registered bool
	synced     bool // files written at least once
	members    []hostfile.Member
}

func (s *memberState) set(f func(*memberState)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func (s *memberState) ready(register bool) (bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if register && !s.registered {
		return false, "not registered yet"
	}
	if !s.synced {
		return false, "membership not listed yet"
	}
	return true, fmt.Sprintf("ok: %d members", len(s.members))
}

// runMember registers and watches until ctx ends. On return the member has
// been deregistered.
func runMember(ctx context.Context, cli *clientv3.Client, cfg MemberConfig, log *slog.Logger, st *memberState) {
	m := getMetrics()
	var wg sync.WaitGroup
	if cfg.Register {
		reg := &membership.Registration{
			Client: cli, Prefix: cfg.Prefix, Member: cfg.Member, TTL: cfg.LeaseTTL, Log: log,
			OnRegistered: func() { st.set(func(s *memberState) { s.registered = true }) },
		}
		wg.Add(1)
		go func() { defer wg.Done(); reg.Run(ctx) }()
	}
	files := hostfile.Files{Dir: cfg.FilesDir, Flavour: cfg.Flavour}
	var before []hostfile.Member
	first := true
	membership.Watch(ctx, cli, cfg.Prefix, cfg.Resync, log, func(ms []hostfile.Member) {
		joined, left := membership.Diff(before, ms)
		switch {
		case first:
			log.Info("membership", "summary", membership.Describe(ms))
		default:
			log.Info("membership changed", "joined", strings.Join(joined, ","), "left", strings.Join(left, ","), "summary", membership.Describe(ms))
			m.membershipChanges.Inc()
		}
		first = false
		before = ms
		m.members.Set(float64(len(ms)))
		if cfg.FilesDir != "" {
			changed, err := files.Write(ms)
			if err != nil {
				log.Error("writing hostfile failed", "dir", cfg.FilesDir, "err", err)
			} else if changed {
				m.filesWritten.Inc()
			}
		}
		st.set(func(s *memberState) { s.members = ms; s.synced = true })
	})
	wg.Wait()
}

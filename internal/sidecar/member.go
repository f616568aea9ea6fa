package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/hostfile"
	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/membership/etcdmembers"
)

// MemberConfig is what both serve and join do for their pod: register it
// (unless Register is false) and keep the files in FilesDir current.
type MemberConfig struct {
	Prefix   string
	Register bool
	Member   membership.Member
	LeaseTTL time.Duration
	FilesDir string // empty: write no files
	Flavour  hostfile.Flavour
	// InstallHelper copies this binary into FilesDir, for a launcher that
	// runs `rdzv-sidecar wait|hosts`.
	InstallHelper bool
	Resync        time.Duration
	// Listener, if not nil, is told of each change after the first listing
	// (serve's membershipFanOut).
	Listener MembershipListener
	// OnRegistered and OnLost, if not nil, are told when this pod's
	// registration starts and ends; Abandon is etcdmembers.Registration's.
	OnRegistered, OnLost func()
	Abandon              <-chan struct{}
}

// active says whether this process is a member at all (serve without
// member flags is a plain server).
func (c MemberConfig) active() bool { return c.Register || c.FilesDir != "" }

// check validates the member flags before anything starts. Without
// requireHost (serve), Register without a host means a plain server.
func (c *MemberConfig) check(requireHost bool) error {
	if c.Register && c.Member.Host == "" {
		if requireHost {
			return errors.New("--member-host (or $" + constants.EnvMemberHost + ") is required with --register=true")
		}
		c.Register = false
	}
	if c.LeaseTTL < 2*time.Second {
		return fmt.Errorf("--lease-ttl: %s is below etcd's minimum of 2s", c.LeaseTTL)
	}
	if c.Register {
		if err := hostfile.Validate([]membership.Member{c.Member}); err != nil {
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

// memberState is what /readyz reports and what tests wait on.
type memberState struct {
	mu         sync.Mutex
	registered bool
	synced     bool // files written at least once
	members    []membership.Member
	byHost     map[string]membership.Member // members by host, made with members
}

func (s *memberState) set(f func(*memberState)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

// slots is the slots of the member at host, as last listed: a map, since the
// view asks for every node of a round (1,024 at a time).
func (s *memberState) slots(host string) (int, bool) {
	m, ok := s.member(host)
	return m.Slots, ok
}

// listed is the members as last listed.
func (s *memberState) listed() []membership.Member {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.members
}

// member is the member at host, as last listed (the elastic-training backend's ranks
// follow its group and index).
func (s *memberState) member(host string) (membership.Member, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.byHost[host]
	return m, ok
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
func runMember(ctx context.Context, cli *clientv3.Client, cfg MemberConfig, log *slog.Logger, st *memberState, m *metrics) {
	var wg sync.WaitGroup
	if cfg.Register {
		reg := &etcdmembers.Registration{
			Client: cli, Prefix: cfg.Prefix, Member: cfg.Member, TTL: cfg.LeaseTTL, Log: log,
			OnRegistered: func() {
				st.set(func(s *memberState) { s.registered = true })
				if cfg.OnRegistered != nil {
					cfg.OnRegistered()
				}
			},
			OnLost:  cfg.OnLost,
			Abandon: cfg.Abandon,
		}
		wg.Add(1)
		go func() { defer wg.Done(); reg.Run(ctx) }()
	}
	files := hostFiles{dir: cfg.FilesDir, flavour: cfg.Flavour}
	var before []membership.Member
	first := true
	etcdmembers.Watch(ctx, cli, cfg.Prefix, cfg.Resync, log, func(ms []membership.Member) {
		joined, left := membership.Diff(before, ms)
		// The listeners read the members by host: the state first.
		byHost := make(map[string]membership.Member, len(ms))
		for _, m := range ms {
			byHost[m.Host] = m
		}
		st.set(func(s *memberState) { s.members, s.byHost = ms, byHost })
		switch {
		case first:
			log.Info("membership", "summary", membership.Describe(ms))
		default:
			log.Info("membership changed", "joined", strings.Join(joined, ","), "left", strings.Join(left, ","), "summary", membership.Describe(ms))
			m.membershipChanges.Inc()
			if cfg.Listener != nil {
				cfg.Listener.MembersChanged(joined, left)
			}
		}
		first = false
		before = ms
		m.members.Set(float64(len(ms)))
		if cfg.FilesDir != "" {
			changed, err := files.write(ms)
			if err != nil {
				log.Error("writing hostfile failed", "dir", cfg.FilesDir, "err", err)
			} else if changed {
				m.filesWritten.Inc()
			}
		}
		st.set(func(s *memberState) { s.synced = true })
	})
	wg.Wait()
}

// Package etcdmembers registers training members in etcd (v3 API, one key
// per member bound to a lease) and follows the membership as a sorted
// []membership.Member.
package etcdmembers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/elastic-training/elastic-training/internal/membership"
)

// Registration keeps one member registered.
type Registration struct {
	Client *clientv3.Client
	Prefix string
	Member membership.Member
	// TTL of the lease: how long a member that died without deregistering
	// (kill -9, node loss) stays listed.
	TTL time.Duration
	Log *slog.Logger
	// OnRegistered is called after each (re-)registration; OnLost when that
	// registration ends (its lease lost, or ctx ended).
	OnRegistered, OnLost func()
	// Abandon, if not nil and closed before ctx ends, makes Run return without
	// deregistering: the server is gone, or another one takes over (a
	// rendezvous candidate that serves now), and waiting for its answer would
	// only delay what comes next.
	Abandon <-chan struct{}
}

// Run registers the member and keeps it registered until ctx ends; then it
// deletes the key at once (revoking the lease) and returns. When the lease is
// lost (the server restarted with an empty data dir, or was unreachable for
// longer than the TTL) it registers again.
func (r *Registration) Run(ctx context.Context) error {
	if err := r.Member.Validate(); err != nil {
		return fmt.Errorf("register member: %w", err)
	}
	log := r.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	key := membership.Key(r.Prefix, r.Member.Host)
	ttl := int64(r.TTL / time.Second)
	if ttl < 2 {
		ttl = 2
	}
	backoff := 100 * time.Millisecond
	first := true
	for ctx.Err() == nil {
		lease, err := r.register(ctx, key, ttl)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			log.Warn("member registration failed; retrying", "member", r.Member.Host, "retry_in", backoff.String(), "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 2*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if first {
			log.Info("member registered", "member", r.Member.Host, "slots", r.Member.Slots, "group", r.Member.Group, "index", r.Member.Index, "lease_ttl", fmt.Sprintf("%ds", ttl))
		} else {
			log.Info("member registered again after losing its lease", "member", r.Member.Host)
		}
		first = false
		if r.OnRegistered != nil {
			r.OnRegistered()
		}
		if err := r.keepAlive(ctx, lease); err != nil && ctx.Err() == nil {
			log.Warn("member lease lost", "member", r.Member.Host, "err", err)
		}
		if r.OnLost != nil {
			r.OnLost()
		}
		if ctx.Err() != nil && !closed(r.Abandon) {
			r.deregister(lease, key, log)
		}
	}
	return nil
}

func (r *Registration) register(ctx context.Context, key string, ttl int64) (clientv3.LeaseID, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	g, err := r.Client.Grant(cctx, ttl)
	if err != nil {
		return 0, fmt.Errorf("grant lease: %w", err)
	}
	// Only where nobody is registered: a pod whose node was cut off, and whose lease ended meanwhile, must not take
	// the name back from its replacement when the node returns (its deregistration would then remove the live
	// replacement). A restarted sidecar of the same pod waits for its old lease to end (the TTL).
	resp, err := r.Client.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, membership.Encode(r.Member), clientv3.WithLease(g.ID))).Commit()
	if err != nil {
		r.Client.Revoke(context.Background(), g.ID) //nolint:errcheck // it expires anyway
		return 0, fmt.Errorf("put %s: %w", key, err)
	}
	if !resp.Succeeded {
		r.Client.Revoke(context.Background(), g.ID) //nolint:errcheck // it expires anyway
		return 0, fmt.Errorf("%s is registered by another pod (or this one's previous lease, which ends within the TTL)", key)
	}
	return g.ID, nil
}

// keepAlive returns when ctx ends or the lease is gone.
func (r *Registration) keepAlive(ctx context.Context, lease clientv3.LeaseID) error {
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := r.Client.KeepAlive(kctx, lease)
	if err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-ch:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("keep-alive ended (lease expired or revoked)")
			}
		}
	}
}

func (r *Registration) deregister(lease clientv3.LeaseID, key string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err := r.Client.Revoke(ctx, lease) // deletes the key with the lease, and never a key another pod holds
	if err != nil {
		_, err = r.Client.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(key), "=", lease)).Then(clientv3.OpDelete(key)).Commit()
	}
	if err != nil {
		log.Warn("member deregistration failed; it will expire with its lease", "member", r.Member.Host, "err", err)
		return
	}
	log.Info("member deregistered", "member", r.Member.Host)
}

// List returns the members registered now, in hostfile order. Entries that
// do not decode or validate are skipped and reported in the error.
func List(ctx context.Context, cli *clientv3.Client, prefix string) ([]membership.Member, int64, error) {
	ms, rev, _, err := list(ctx, cli, prefix)
	return ms, rev, err
}

// list also returns every key under prefix, malformed ones included.
func list(ctx context.Context, cli *clientv3.Client, prefix string) ([]membership.Member, int64, map[string]bool, error) {
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, nil, fmt.Errorf("list members: %w", err)
	}
	keys := make(map[string]bool, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		keys[string(kv.Key)] = true
	}
	set := map[string]membership.Member{}
	var errs []error
	for _, kv := range resp.Kvs {
		m, err := membership.Decode(string(kv.Key), kv.Value)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		set[string(kv.Key)] = m
	}
	return sorted(set), resp.Header.Revision, keys, errors.Join(errs...)
}

func sorted(set map[string]membership.Member) []membership.Member {
	ms := make([]membership.Member, 0, len(set))
	for _, m := range set {
		ms = append(ms, m)
	}
	return membership.Sorted(ms)
}

// Watch calls onChange with the full, sorted membership once at start and
// after every change, until ctx ends. It survives server restarts: when the
// watch breaks, or a periodic check (every resync) finds the server's
// revision went backwards or the list differs, it lists again.
func Watch(ctx context.Context, cli *clientv3.Client, prefix string, resync time.Duration, log *slog.Logger, onChange func([]membership.Member)) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if resync <= 0 {
		resync = 5 * time.Second
	}
	var last []membership.Member
	emit := func(ms []membership.Member) {
		if last != nil && slices.Equal(last, ms) {
			return
		}
		last = ms
		onChange(ms)
	}
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ms, rev, keys, err := list(lctx, cli, prefix)
		cancel()
		if err != nil && ms == nil {
			if ctx.Err() == nil {
				log.Warn("listing members failed; retrying", "err", err, "retry_in", backoff.String())
				select {
				case <-ctx.Done():
				case <-time.After(backoff):
				}
				backoff = min(backoff*2, 2*time.Second)
			}
			continue
		} else if err != nil {
			log.Warn("ignoring malformed member entries", "err", err)
		}
		backoff = 100 * time.Millisecond
		set := map[string]membership.Member{}
		for _, m := range ms {
			set[membership.Key(prefix, m.Host)] = m
		}
		emit(ms)
		watchFrom(ctx, cli, prefix, rev, keys, resync, set, log, emit)
	}
}

// watchFrom follows changes after rev until the watch breaks or a resync
// finds it stale.
func watchFrom(ctx context.Context, cli *clientv3.Client, prefix string, rev int64, keys map[string]bool, resync time.Duration,
	set map[string]membership.Member, log *slog.Logger, emit func([]membership.Member)) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	tick := time.NewTicker(resync)
	defer tick.Stop()
	var clusterID uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			// A cheap check (count only; with 1,000 members, 1,000 watchers
			// must not each list everything every few seconds): a server that
			// restarted empty has another cluster ID or an older revision.
			lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := cli.Get(lctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			lcancel()
			if err != nil {
				continue
			}
			if clusterID == 0 {
				clusterID = resp.Header.ClusterId
			}
			if resp.Header.ClusterId != clusterID || resp.Header.Revision < rev || int(resp.Count) != len(keys) {
				log.Info("membership watch was stale; listing again", "revision", resp.Header.Revision,
					"watched_revision", rev, "count", resp.Count, "known", len(set))
				return
			}
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil || resp.Canceled {
				return
			}
			apply(resp, set, keys, log)
			rev = resp.Header.Revision
			// Coalesce a burst (many members joining at once) into one
			// emit, so the files are rewritten once, not once per event.
			if !drain(wch, set, keys, &rev, log) {
				return
			}
			emit(sorted(set))
		}
	}
}

func apply(resp clientv3.WatchResponse, set map[string]membership.Member, keys map[string]bool, log *slog.Logger) {
	for _, ev := range resp.Events {
		k := string(ev.Kv.Key)
		if ev.Type == clientv3.EventTypeDelete {
			delete(set, k)
			delete(keys, k)
			continue
		}
		keys[k] = true
		m, err := membership.Decode(k, ev.Kv.Value)
		if err != nil {
			log.Warn("ignoring malformed member entry", "key", k, "err", err)
			delete(set, k)
			continue
		}
		set[k] = m
	}
}

// drain applies every watch response already queued; false means the watch
// broke.
func drain(wch clientv3.WatchChan, set map[string]membership.Member, keys map[string]bool, rev *int64, log *slog.Logger) bool {
	for {
		select {
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil || resp.Canceled {
				return false
			}
			apply(resp, set, keys, log)
			*rev = resp.Header.Revision
		default:
			return true
		}
	}
}

// closed says whether c, if not nil, is closed.
func closed(c <-chan struct{}) bool {
	if c == nil {
		return false
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}

package etcdmembers

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/testenv/etcdtest"
)

func startEtcd(t *testing.T) *clientv3.Client { return etcdtest.Embedded(t) }

type recorder struct {
	mu   sync.Mutex
	last []membership.Member
}

func (r *recorder) set(ms []membership.Member) { r.mu.Lock(); r.last = ms; r.mu.Unlock() }
func (r *recorder) hosts() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var hs []string
	for _, m := range r.last {
		hs = append(hs, m.Host)
	}
	return hs
}

func TestRegisterWatchDeregister(t *testing.T) {
	cli := startEtcd(t)
	const prefix = "/elastic-training/members/"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &recorder{}
	go Watch(ctx, cli, prefix, time.Second, nil, rec.set)

	regCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	r := &Registration{Client: cli, Prefix: prefix, TTL: 2 * time.Second,
		Member: membership.Member{Host: "b.job", Slots: 2, Group: "worker", Index: 1}}
	go func() { r.Run(regCtx); close(done) }()
	_, err := cli.Put(ctx, prefix+"a.job", membership.Encode(membership.Member{Host: "a.job", Slots: 1, Group: "worker", Index: 0}))
	require.NoError(t, err)
	_, err = cli.Put(ctx, prefix+"bad", "{not json")
	require.NoError(t, err)

	testenv.Eventually(t, 10*time.Second, "both members listed in order, the bad entry skipped", func() error {
		if got := fmt.Sprint(rec.hosts()); got != "[a.job b.job]" {
			return fmt.Errorf("members %s", got)
		}
		return nil
	})

	// Someone deletes the lease (as a fresh server would have none): the
	// member registers again.
	leases, err := cli.Leases(ctx)
	require.NoError(t, err)
	require.Len(t, leases.Leases, 1)
	_, err = cli.Revoke(ctx, leases.Leases[0].ID)
	require.NoError(t, err)
	testenv.Eventually(t, 10*time.Second, "member back after its lease was revoked", func() error {
		resp, err := cli.Get(ctx, prefix+"b.job")
		if err != nil || len(resp.Kvs) != 1 {
			return fmt.Errorf("not registered: %v", err)
		}
		return nil
	})

	stop()
	<-done
	resp, err := cli.Get(ctx, prefix+"b.job")
	require.NoError(t, err)
	require.Empty(t, resp.Kvs, "deregistered at once on stop")
	testenv.Eventually(t, 10*time.Second, "watch sees the leave", func() error {
		if got := fmt.Sprint(rec.hosts()); got != "[a.job]" {
			return fmt.Errorf("members %s", got)
		}
		return nil
	})
}

func TestRegistrationRefusesInvalidMember(t *testing.T) {
	r := &Registration{Member: membership.Member{Host: "bad_name", Slots: 1}}
	require.ErrorContains(t, r.Run(context.Background()), "not allowed")
}

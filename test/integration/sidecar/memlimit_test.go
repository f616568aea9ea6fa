package sidecar_test

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"golang.org/x/sync/errgroup"

	"github.com/elastic-training/elastic-training/internal/membudget"
	"github.com/elastic-training/elastic-training/internal/tcpstore"
	"github.com/elastic-training/elastic-training/internal/tcpstore/tcpstoretest"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/testenv/etcdtest"
)

// TestServeUnderMemoryLimit: serve in a memory cgroup of the limit the webhook gives a 1,024-node etcd-v2 job, as in
// a container with that limit, takes 1,200 compare-and-set writes of a
// 1,024-node torch state through the v2 API (140 KB base64, as torch's
// etcd-v2 backend writes it at every heartbeat and join), of which its v2
// store keeps the last 1,000, and stays up under the limit. Go's heap would
// double past the limit before collecting (without the soft limit that
// serve sets from its cgroup, the kernel killed it at write 988 in one run, 1,175
// in another).
func TestServeUnderMemoryLimit(t *testing.T) {
	// The limit the webhook gives a 1,024-node job on etcd-v2 (membudget.LimitFor): its v2 store's share holds the
	// 1,000 writes of 140 KB that its history keeps.
	limit := membudget.LimitFor(0, 0, true, 1024)
	s := newServe(t, "--c10d-addr=")
	s.cgroup = testenv.MemoryCgroup(t, limit)
	s.start(t)
	require.Contains(t, s.Output(), fmt.Sprintf("gomemlimit=%d", membudget.GoLimit(limit, 0)), "serve did not set its heap's soft limit from its cgroup")

	raw := make([]byte, 105_000) // torch's state of 1,024 nodes, about 140 KB once base64-encoded
	rand.Read(raw)
	state := base64.StdEncoding.EncodeToString(raw)
	key := s.URL + "/v2/keys/torch/elastic/rendezvous/scale/state"
	prev := ""
	for i := range 1200 {
		next := fmt.Sprintf("%s%08d", state[:len(state)-8], i)
		form := url.Values{"value": {next}}
		if prev != "" {
			form.Set("prevValue", prev)
		}
		req, err := http.NewRequest(http.MethodPut, key, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err, "write %d: serve gone?\n%s", i, s.Output())
		resp.Body.Close()
		require.Contains(t, []int{http.StatusOK, http.StatusCreated}, resp.StatusCode, "write %d", i)
		prev = next
	}
	hwm, err := testenv.StatusBytes(s.Cmd.Process.Pid, "VmHWM")
	require.NoError(t, err, "serve gone?\n%s", s.Output())
	t.Logf("serve's peak RSS after 1,200 writes of %d bytes: %.1f MiB (cgroup limit %d MiB)", len(state), float64(hwm)/(1<<20), limit>>20)
	require.Less(t, hwm, limit, "serve's peak RSS")
	waitReady(t, s.Proc, s.Health)
}

// TestServeFilledUnderMemoryLimit: serve in a memory cgroup of the webhook's default limit (512 MiB), every quota its
// share of that limit (no quota flag: internal/membudget), while hostile clients fill every quota, one after the
// other and then all full together: the c10d store's replies with GETs that are never read of a value replaced
// meanwhile (so that only those replies hold it), the store with 64 KiB values, its waits with WAITs of 10,000 keys, the v2
// store, v2 recursive GETs that are never read, and last the c10d connections. Each is refused at its quota (the
// refused counters), the process stays up, the cgroup never reaches its limit (no OOM kill, its peak below the
// limit), and a well-behaved c10d client's PINGs are answered throughout. Before the quotas were shares of the
// limit, the c10d and v2 stores' 256 MiB each filled it alone.
func TestServeFilledUnderMemoryLimit(t *testing.T) {
	const limit = 512 << 20
	s := newServe(t, "--backend=elastic-training")
	s.cgroup = testenv.MemoryCgroup(t, limit)
	s.start(t)
	b, err := membudget.Split(limit, 0, false)
	require.NoError(t, err)
	require.Contains(t, s.Output(), `msg="memory budget"`)
	require.Contains(t, s.Output(), fmt.Sprintf("c10d_max_connections=%d", b.Connections()))
	live := startLiveClient(t, s.C10d)
	fill := func(name string, f func() int) {
		t.Logf("%s: %d taken before the first refusal", name, f())
	}
	refused := func(series string) bool { return metricLabeled(t, s.Health, series) > 0 }

	// First, while the store has room for the value that the unread replies hold.
	fill("c10d replies never read, 1 MiB each", func() int {
		w := dialStore(t, s.C10d)
		for i := 0; ; i++ {
			// A new value each time: the old one is held by the unread reply alone.
			require.NoError(t, w.Do(&tcpstore.Request{Op: tcpstore.OpSet, Key: "/reply", Value: bytes.Repeat([]byte{byte(i)}, 1<<20)}))
			c := dialStore(t, s.C10d)
			require.NoError(t, c.Send(&tcpstore.Request{Op: tcpstore.OpGet, Key: "/reply"}))
			if closedWithin(c.Conn(), 500*time.Millisecond) {
				return i
			}
		}
	})
	fill("c10d store, 64 KiB values", func() int {
		c := dialStore(t, s.C10d)
		v := bytes.Repeat([]byte("s"), 64<<10)
		for i := 0; ; i++ {
			if c.Do(&tcpstore.Request{Op: tcpstore.OpSet, Key: fmt.Sprintf("/fill/%d", i), Value: v}) != nil {
				return i
			}
		}
	})
	fill("c10d waits of 10,000 keys", func() int {
		for i := 0; ; i++ {
			keys := make([]string, 10_000)
			for j := range keys {
				keys[j] = fmt.Sprintf("/wait/%d/%032d", i, j)
			}
			c := dialStore(t, s.C10d)
			if c.Send(&tcpstore.Request{Op: tcpstore.OpWait, Keys: keys}) != nil || closedWithin(c.Conn(), 500*time.Millisecond) {
				return i
			}
		}
	})
	fill("v2 store, 64 KiB values in 3 directories", func() int {
		v := strings.Repeat("v", 64<<10)
		for i := 0; ; i++ {
			if code, _ := v2put(t, fmt.Sprintf("%s/v2/keys/fill/d%d/%d", s.URL, i%3, i), v); code != http.StatusCreated {
				return i
			}
		}
	})
	fill("v2 recursive GETs never read, a third of the store each", func() int {
		host := strings.TrimPrefix(s.URL, "http://")
		for i := 0; i < 30; i++ {
			nc, err := net.Dial("tcp", host)
			require.NoError(t, err)
			t.Cleanup(func() { nc.Close() })
			_, err = fmt.Fprintf(nc, "GET /v2/keys/fill/d%d?recursive=true HTTP/1.1\r\nHost: %s\r\n\r\n", i%3, host)
			require.NoError(t, err)
			time.Sleep(100 * time.Millisecond) // built and being written
			if refused(`elastic_training_sidecar_v2_refused_total{reason="replies_full"}`) {
				return i
			}
		}
		return -1
	})
	fill("etcd v3 writes of 60 KiB, 8 writers (the raft log keeps each until a snapshot)", func() int {
		cli := etcdtest.Client(t, s.URL)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// A request larger than the job's own is refused.
		_, err := cli.Put(ctx, "/big", strings.Repeat("b", membudget.EtcdMaxRequestBytes))
		require.ErrorIs(t, err, rpctypes.ErrRequestTooLarge)
		// etcd's defaults kept the last 10,000 to 15,000 entries in the heap, each of up to 1.5 MiB: no snapshot in
		// these 1,000 writes (59 MiB), where serve's snapshot count takes several.
		v := strings.Repeat("e", 60<<10)
		var g errgroup.Group
		for w := range 8 {
			g.Go(func() error {
				for range 125 {
					if _, err := cli.Put(ctx, fmt.Sprintf("/raft/%d", w), v); err != nil {
						return err
					}
				}
				return nil
			})
		}
		require.NoError(t, g.Wait())
		snapshots := metricLabeled(t, strings.TrimPrefix(s.URL, "http://"), "etcd_debugging_snap_save_total_duration_seconds_count")
		require.GreaterOrEqual(t, snapshots, 1000/int(b.EtcdLimits().SnapshotCount+b.EtcdLimits().SnapshotCatchUp), "etcd's snapshots, which end the raft log that the heap holds")
		return 1000
	})
	fill("c10d connections", func() int {
		for i := 0; ; i++ {
			c, err := tcpstoretest.Dial(s.C10d) // a refused connection may fail its VALIDATE already
			if err != nil {
				return i
			}
			t.Cleanup(func() { c.Close() })
			if c.Do(&tcpstore.Request{Op: tcpstore.OpPing, Nonce: 0x5eed}) != nil {
				return i
			}
		}
	})

	for _, reason := range []string{"store_full", "too_many_waiting_keys", "replies_full", "too_many_connections"} {
		require.True(t, refused(fmt.Sprintf(`elastic_training_sidecar_tcpstore_refused_total{reason=%q}`, reason)), "no c10d refusal %s", reason)
	}
	for _, reason := range []string{"store_full", "replies_full"} {
		require.True(t, refused(fmt.Sprintf(`elastic_training_sidecar_v2_refused_total{reason=%q}`, reason)), "no v2 refusal %s", reason)
	}
	require.NoError(t, s.Cmd.Process.Signal(syscall.Signal(0)), "serve died:\n%s", s.Output())
	waitReady(t, s.Proc, s.Health)
	peak, ooms := cgroupPeak(t, filepath.Dir(s.cgroup))
	t.Logf("every quota full at once: the cgroup's peak %.1f MiB of its %d MiB (%d OOM kills), serve's peak RSS %.1f MiB; budget %s; live client: %d PINGs, p99 %s, max %s",
		float64(peak)/(1<<20), limit>>20, ooms, float64(peakRSS(t, s.Cmd.Process.Pid))/(1<<20), b, live.count(), live.p99(), live.max())
	require.Zero(t, ooms, "the kernel killed something in serve's cgroup")
	require.Less(t, peak, int64(limit), "serve's cgroup reached its limit")
	require.Zero(t, live.errors(), "the live client's PINGs failed")
}

// closedWithin says whether the server closes nc within d (a refused request: the c10d protocol has no error reply).
func closedWithin(nc net.Conn, d time.Duration) bool {
	nc.SetReadDeadline(time.Now().Add(d))
	_, err := nc.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// metricLabeled is a metric of serve's /metrics named with its labels; 0 when it has none yet.
func metricLabeled(t *testing.T, health, series string) int {
	t.Helper()
	for _, l := range strings.Split(string(metricsBody(t, health)), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			n, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return int(n)
		}
	}
	return 0
}

// cgroupPeak is a memory cgroup's peak usage and its OOM kills (cgroup v2: memory.peak, memory.events; v1:
// memory.max_usage_in_bytes, memory.oom_control).
func cgroupPeak(t *testing.T, dir string) (peak int64, ooms int) {
	t.Helper()
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return ""
		}
		return string(b)
	}
	p := cmp.Or(read("memory.peak"), read("memory.max_usage_in_bytes"))
	require.NotEmpty(t, p, "no peak usage in %s", dir)
	peak, err := strconv.ParseInt(strings.TrimSpace(p), 10, 64)
	require.NoError(t, err)
	for _, l := range strings.Split(cmp.Or(read("memory.events"), read("memory.oom_control")), "\n") {
		if v, ok := strings.CutPrefix(l, "oom_kill "); ok {
			ooms, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return peak, ooms
}

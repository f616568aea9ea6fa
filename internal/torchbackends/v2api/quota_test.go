package v2api

import (
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
)

// storeCost counts what the store holds now the way the quota charges it, walking every node: the quota's running
// account, less the values it still retains for the history, must equal it after every change.
func storeCost(t *testing.T, st v2store.Store) int64 {
	t.Helper()
	ev, err := st.Get("/", true, false)
	require.NoError(t, err)
	var walk func(*v2store.NodeExtern) int64
	walk = func(n *v2store.NodeExtern) int64 {
		var c int64
		for _, k := range n.Nodes {
			c += int64(len(k.Key)) + nodeOverhead + walk(k)
			if k.Value != nil {
				c += int64(len(*k.Value))
			}
		}
		return c
	}
	return walk(ev.Node)
}

func checkAccount(t *testing.T, s *Server) {
	t.Helper()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	require.Equal(t, storeCost(t, s.store), s.quota.used-s.quota.held, "the quota's account of the store's nodes and values")
	var held int64
	for _, r := range s.quota.retained {
		held += r.bytes
	}
	require.Equal(t, held, s.quota.held)
}

// The account follows every kind of write etcd's store knows, including what it does on its own (directories made
// for a key, a directory's subtree deleted with it, keys expiring), so that the quota is exact.
func TestQuotaAccount(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	s := &testServer{New(Config{Now: clock.now})}
	h := s.mux()
	steps := []struct{ method, target, body string }{
		{"PUT", "/v2/keys/a/b/c", "value=one"},                         // two directories made for it
		{"PUT", "/v2/keys/a/b/c", "value=longer+value"},                // replaced: the old value retained
		{"PUT", "/v2/keys/a/b/c?prevValue=longer+value", "value=cas"},  // compare-and-swap
		{"PUT", "/v2/keys/a/b/c?prevExist=true", "value=updated"},      // update
		{"PUT", "/v2/keys/a/b/c?prevExist=true&refresh=true", "ttl=5"}, // refresh: same value
		{"POST", "/v2/keys/a/queue", "value=first"},                    // in order
		{"POST", "/v2/keys/a/queue", "value=second"},
		{"PUT", "/v2/keys/d?dir=true", ""},
		{"PUT", "/v2/keys/d/e/f", "value=deep"},
		{"PUT", "/v2/keys/ttl/key", "value=expires&ttl=2"},
		{"PUT", "/v2/keys/ttl/other", "value=stays"},
		{"DELETE", "/v2/keys/a/queue?recursive=true", ""},
		{"DELETE", "/v2/keys/a/b/c?prevValue=updated", ""},
		{"DELETE", "/v2/keys/d?recursive=true", ""},
		{"PUT", "/v2/keys/empty?dir=true", ""},
		{"DELETE", "/v2/keys/empty?dir=true", ""},
	}
	for _, st := range steps {
		code, body := do(t, h, st.method, st.target, st.body)
		require.Less(t, code, 300, "%s %s: %s", st.method, st.target, body)
		checkAccount(t, s.Server)
	}
	used := s.quota.used
	clock.t = clock.t.Add(3 * time.Second) // ttl/key expires, a/b/c (refreshed to 5 s) not yet
	s.ExpireNow()
	checkAccount(t, s.Server)
	_, ok := s.Value("/ttl/key")
	require.False(t, ok)
	require.Equal(t, used-int64(len("/1/ttl/key"))-nodeOverhead, s.quota.used, "the expired node's path and overhead are freed, its value stays with the history")
	clock.t = clock.t.Add(3 * time.Second)
	s.ExpireNow()
	checkAccount(t, s.Server)

	// Once the history has moved on by 1,000 changes, nothing is retained.
	for i := range historyLen {
		do(t, h, "PUT", "/v2/keys/churn", "value="+fmt.Sprint(i%2))
	}
	do(t, h, "PUT", "/v2/keys/last", "value=x") // the release happens at the next write
	checkAccount(t, s.Server)
	require.LessOrEqual(t, s.quota.held, int64(historyLen), "only the churn's own one-byte values are retained")
}

// FuzzQuotaAccount: any sequence of writes, deletes and expiry keeps the account exact.
func FuzzQuotaAccount(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})
	f.Add([]byte{3, 3, 3, 9, 9, 0, 0, 7, 7, 2})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 200 {
			ops = ops[:200]
		}
		clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
		s := &testServer{New(Config{Now: clock.now})}
		h := s.mux()
		keys := []string{"/a", "/a/b", "/a/b/c", "/d", "/d/e"}
		for i, b := range ops {
			k := "/v2/keys" + keys[int(b>>4)%len(keys)]
			v := url.Values{"value": {strings.Repeat("v", int(b)%7)}}
			switch b % 10 {
			case 0:
				do(t, h, "PUT", k, v.Encode())
			case 1:
				v.Set("ttl", fmt.Sprint(int(b)%3))
				do(t, h, "PUT", k, v.Encode())
			case 2:
				do(t, h, "PUT", k+"?dir=true", "")
			case 3:
				do(t, h, "DELETE", k+"?recursive=true", "")
			case 4:
				do(t, h, "DELETE", k, "")
			case 5:
				do(t, h, "POST", k, v.Encode())
			case 6:
				do(t, h, "PUT", k+"?prevExist=true&refresh=true", "ttl=1")
			case 7:
				do(t, h, "PUT", k+"?prevExist=true", v.Encode())
			case 8:
				do(t, h, "PUT", k+"?dir=true&ttl=1", "")
			case 9:
				clock.t = clock.t.Add(time.Duration(i%3) * time.Second)
				s.ExpireNow()
			}
			checkAccount(t, s.Server)
		}
	})
}

// A store full of a client's own keys refuses it and still takes torch's; deleted values count until the history
// forgets them, so that filling and emptying the store over and over holds no more than the quota.
func TestQuotaRefuses(t *testing.T) {
	const max = 4 << 20
	s := &testServer{New(Config{Limits: Limits{MaxBytes: max, MaxValueLen: 512 << 10, MaxKeyLen: 64}})}
	h := s.mux()
	big := url.Values{"value": {strings.Repeat("x", 512<<10)}}.Encode()

	code, body := do(t, h, "PUT", "/v2/keys/k", url.Values{"value": {strings.Repeat("x", 512<<10+1)}}.Encode())
	require.Equal(t, 400, code)
	require.Contains(t, body, `"errorCode":209`)
	require.Contains(t, body, "the value is 524289 bytes, more than the 524288 this store accepts (--v2-max-value-bytes)")
	code, body = do(t, h, "PUT", "/v2/keys/"+strings.Repeat("k", 65), "value=1")
	require.Equal(t, 400, code)
	require.Contains(t, body, "--v2-max-key-bytes")

	var n int
	for ; ; n++ {
		code, body = do(t, h, "PUT", fmt.Sprintf("/v2/keys/mine/%d", n), big)
		if code != 201 {
			break
		}
	}
	require.Equal(t, 500, code)
	require.Contains(t, body, `"errorCode":300`)
	require.Contains(t, body, "store full")
	require.Contains(t, body, "the last eighth is kept for torch's keys, /torch/elastic/*, /torchelastic/*")
	require.Equal(t, 6, n, "7/8 of 4 MiB hold six values of 512 KiB with their keys")
	checkAccount(t, s.Server)
	for _, k := range []string{"/v2/keys/torch/elastic/rendezvous/run", "/v2/keys/torchelastic/p2p/run_x/rdzv/active_version"} {
		code, body = do(t, h, "PUT", k, url.Values{"value": {strings.Repeat("s", 200<<10)}}.Encode())
		require.Equal(t, 201, code, "torch's key %s: %s", k, body)
	}

	// Deleted, the values stay counted: the history mentions them.
	code, _ = do(t, h, "DELETE", "/v2/keys/mine?recursive=true", "")
	require.Equal(t, 200, code)
	code, _ = do(t, h, "PUT", "/v2/keys/again", big)
	require.Equal(t, 500, code, "the deleted values are still in etcd's history")
	_, err := s.Store().Watch("/1/mine/0", false, false, 2)
	require.NoError(t, err, "and a watcher may still read them from there")
	checkAccount(t, s.Server)

	// 1,000 small changes later (torch's keep-alives would be these), the history no longer holds them.
	for i := range historyLen {
		code, body = do(t, h, "PUT", "/v2/keys/torch/elastic/rendezvous/run", "value="+fmt.Sprint(i%2))
		require.Less(t, code, 300, body)
	}
	code, body = do(t, h, "PUT", "/v2/keys/again", big)
	require.Equal(t, 201, code, body)
	checkAccount(t, s.Server)
}

// TestReplyQuota: replies being written count against Limits.MaxReplyBytes together; a read whose reply would pass
// it is refused (etcd's error 300, counted), a write's reply never is (the write is done), and the room comes back
// once a reply is written.
func TestReplyQuota(t *testing.T) {
	s := &testServer{New(Config{Limits: Limits{MaxReplyBytes: 16 << 10}})}
	h := s.mux()
	for i := range 4 {
		code, body := do(t, h, "PUT", fmt.Sprintf("/v2/keys/tree/%d", i), url.Values{"value": {strings.Repeat("x", 2<<10)}}.Encode())
		require.Equal(t, 201, code, "a write's reply of 2 KiB and more: %s", body)
	}
	code, body := do(t, h, "GET", "/v2/keys/tree?recursive=true", "")
	require.Equal(t, 200, code, "the tree's 8 KiB alone fit: %s", body)
	s.replies.Add(14 << 10) // other clients' replies of 14 KiB, not yet read
	code, body = do(t, h, "GET", "/v2/keys/tree?recursive=true", "")
	require.Equal(t, 500, code)
	require.Contains(t, body, `"errorCode":300`)
	require.Contains(t, body, "replies full")
	require.Contains(t, body, "--v2-max-reply-bytes")
	code, _ = do(t, h, "GET", "/v2/keys/tree/0", "")
	require.Equal(t, 500, code, "2 KiB more do not fit either")
	code, body = do(t, h, "PUT", "/v2/keys/tree/0", "value=small")
	require.Equal(t, 200, code, "a write is answered whatever the replies: %s", body)
	s.replies.Add(-14 << 10)
	code, body = do(t, h, "GET", "/v2/keys/tree/1", "")
	require.Equal(t, 200, code, body)
	require.Zero(t, s.replies.Load(), "every reply written gave its bytes back")
}

// The case, measured in this process: values written and deleted are let go once 1,000 more changes have
// passed (etcd's history kept 206 MiB of 24 deleted 8 MB values for as long as nobody wrote). Live heap after a
// collection, against the same store before the writes, with its history already full of small changes.
func TestHistoryLetsGo(t *testing.T) {
	s := &testServer{New(Config{})}
	h := s.mux()
	churn := func() {
		for i := range historyLen {
			code, body := do(t, h, "PUT", "/v2/keys/torch/elastic/rendezvous/run", "value="+fmt.Sprint(i%2))
			require.Less(t, code, 300, body)
		}
	}
	churn()
	before := liveHeap()
	big := url.Values{"value": {strings.Repeat("x", DefaultMaxValueLen)}}.Encode()
	for i := range 24 {
		code, body := do(t, h, "PUT", fmt.Sprintf("/v2/keys/big/%d", i), big)
		require.Equal(t, 201, code, body)
	}
	code, _ := do(t, h, "DELETE", "/v2/keys/big?recursive=true", "")
	require.Equal(t, 200, code)
	held := liveHeap()
	churn()
	after := liveHeap()
	t.Logf("live heap: %d KiB before, %d KiB with 24 MiB written and deleted, %d KiB 1,000 changes later", before>>10, held>>10, after>>10)
	require.Greater(t, held, before+20<<20, "the history still holds the deleted values (so a watcher may read them)")
	require.Less(t, after, before+before/10, "the history let them go")
	require.LessOrEqual(t, s.quota.held, int64(historyLen), "and the quota no longer counts them (only the churn's one-byte values)")
}

func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

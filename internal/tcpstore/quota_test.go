package tcpstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// newQuotaStore is a store with quotas, served to one connection that
// gathers the replies.
func newQuotaStore(t *testing.T, q Quotas) (*store, func(*Request) error) {
	t.Helper()
	m, err := newMetrics(nil)
	require.NoError(t, err)
	s := newStore(m, DefaultLimits(), q.withDefaults())
	c := &conn{}
	return s, func(r *Request) error {
		_, _, _, err := s.do(c, r)
		return err
	}
}

func TestStoreQuotas(t *testing.T) {
	full := func(err error) bool { var e *StoreFullError; return errors.As(err, &e) }
	t.Run("each key costs ItemCost", func(t *testing.T) {
		s, do := newQuotaStore(t, Quotas{Bytes: 300}) // 263 for keys outside the rendezvous' reserve: two of 130
		require.NoError(t, do(&Request{Op: OpSet, Key: "a", Value: []byte("1")}))
		require.NoError(t, do(&Request{Op: OpAdd, Key: "b", Delta: 1}))
		require.True(t, full(do(&Request{Op: OpSet, Key: "c", Value: []byte("1")})))
		require.True(t, full(do(&Request{Op: OpQueuePush, Key: "q", Value: []byte("1")})))
		require.True(t, full(do(&Request{Op: OpBarrier, Key: "c", WorldSize: 2})))
		require.NoError(t, do(&Request{Op: OpSet, Key: "a", Value: []byte("2")}), "a new value of a key is no new key")
		require.NoError(t, do(&Request{Op: OpDeleteKey, Key: "a"}))
		require.NoError(t, do(&Request{Op: OpSet, Key: "c", Value: []byte("1")}))
		require.NotContains(t, s.kv, "q")
		require.Equal(t, int64(2*(ItemCost+2)), s.bytes)
	})
	t.Run("bytes", func(t *testing.T) {
		s, do := newQuotaStore(t, Quotas{Bytes: 169})                                       // ItemCost + 20 outside the reserve (169 - 169/8)
		require.NoError(t, do(&Request{Op: OpSet, Key: "a", Value: make([]byte, 9)}))       // 10
		require.NoError(t, do(&Request{Op: OpAppend, Key: "a", Value: make([]byte, 5)}))    // 15
		require.True(t, full(do(&Request{Op: OpAppend, Key: "a", Value: make([]byte, 6)}))) // 21
		require.Len(t, s.kv["a"], 14, "a refused APPEND changes nothing")
		require.True(t, full(do(&Request{Op: OpQueuePush, Key: "q", Value: nil})), "a second item costs another ItemCost")
		require.NoError(t, do(&Request{Op: OpDeleteKey, Key: "a"}))
		require.NoError(t, do(&Request{Op: OpQueuePush, Key: "q", Value: make([]byte, 4)})) // 5
		require.NoError(t, do(&Request{Op: OpQueuePop, Key: "q"}))                          // 0
		require.True(t, full(do(&Request{Op: OpCompareSet, Key: "b", Value: make([]byte, 20)})))
		require.NotContains(t, s.kv, "b")
		require.NoError(t, do(&Request{Op: OpSet, Key: "a", Value: nil})) // 1
		require.Equal(t, int64(ItemCost+1), s.bytes)
	})
	t.Run("the rendezvous' reserve", func(t *testing.T) {
		const item = ItemCost + 32 // a key of 32 bytes, no value
		junk := func(i int) string { return fmt.Sprintf("junk%028d", i) }
		s, do := newQuotaStore(t, Quotas{Bytes: 16 * item})
		for i := range 14 { // 16 - 16/8: the keys of anyone
			require.NoError(t, do(&Request{Op: OpSet, Key: junk(i), Value: nil}))
		}
		err := do(&Request{Op: OpSet, Key: junk(14), Value: nil})
		require.True(t, full(err))
		require.Contains(t, err.Error(), "the last eighth is kept for torch's rendezvous keys")
		require.True(t, full(do(&Request{Op: OpMultiSet, Keys: []string{"/torch.rendezvous.r", junk(14)}, Values: [][]byte{nil, nil}})),
			"a MULTI_SET with one key outside the rendezvous' is held to the smaller quota")
		require.NoError(t, do(&Request{Op: OpSet, Key: "/torch.rendezvous.run-1", Value: []byte("state")}), "torch's state still goes in")
		require.NoError(t, do(&Request{Op: OpSet, Key: BackendKeyPrefix + "run-1/ready/w-0", Value: nil}), "and the elastic-training backend' keys")
		require.True(t, full(do(&Request{Op: OpSet, Key: "/torch.rendezvous.run-1.0/x", Value: nil})), "all of it taken")
		require.Equal(t, 16, s.items)
	})
	t.Run("a MULTI_SET is all or nothing", func(t *testing.T) {
		s, do := newQuotaStore(t, Quotas{Bytes: 350}) // 307 outside the reserve: two keys of 130, not three
		require.NoError(t, do(&Request{Op: OpSet, Key: "a", Value: []byte("1")}))
		err := do(&Request{Op: OpMultiSet, Keys: []string{"b", "c"}, Values: [][]byte{[]byte("1"), []byte("2")}})
		require.True(t, full(err))
		require.Len(t, s.kv, 1)
		// One new key named twice: one key, the last value's bytes.
		require.NoError(t, do(&Request{Op: OpMultiSet, Keys: []string{"b", "b", "a"}, Values: [][]byte{make([]byte, 50), make([]byte, 10), nil}}))
		require.Equal(t, 2, s.items)
		require.Equal(t, int64(2*ItemCost+1+0+1+10), s.bytes)
	})
	t.Run("everything deleted is nothing", func(t *testing.T) {
		s, do := newQuotaStore(t, Quotas{})
		for _, r := range []*Request{
			{Op: OpSet, Key: "a", Value: []byte("xyz")}, {Op: OpAppend, Key: "a", Value: []byte("!")},
			{Op: OpAdd, Key: "n", Delta: 5}, {Op: OpBarrier, Key: "b", WorldSize: 1},
			{Op: OpQueuePush, Key: "q", Value: []byte("e")}, {Op: OpCompareSet, Key: "c", Value: []byte("v")},
			{Op: OpQueuePop, Key: "q"}, {Op: OpDeleteKey, Key: "a"}, {Op: OpDeleteKey, Key: "n"},
			{Op: OpDeleteKey, Key: "b"}, {Op: OpDeleteKey, Key: "c"},
		} {
			require.NoError(t, do(r))
		}
		require.Zero(t, s.items)
		require.Zero(t, s.bytes)
	})
}

// serveLoopback serves srv on a loopback port until the test ends.
func serveLoopback(t *testing.T, srv *Server) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return l.Addr().String()
}

func rawDial(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	_, err = nc.Write(AppendRequest(nil, &Request{Op: OpValidate, Magic: Magic}))
	require.NoError(t, err)
	return nc
}

// TestOnCompareSet: a COMPARE_SET that stores its value reaches the hook;
// one that does not, and every other op, do not.
func TestOnCompareSet(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv, err := New(Config{OnCompareSet: func(key string, value []byte) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, key+"="+string(value))
	}})
	require.NoError(t, err)
	nc := rawDial(t, serveLoopback(t, srv))
	var b []byte
	for _, q := range []*Request{
		{Op: OpCompareSet, Key: "s", Value: []byte("1")},                        // stored: new key
		{Op: OpCompareSet, Key: "s", Expected: []byte("0"), Value: []byte("2")}, // not: expected differs
		{Op: OpCompareSet, Key: "s", Expected: []byte("1"), Value: []byte("3")}, // stored
		{Op: OpCompareSet, Key: "m", Expected: []byte("x"), Value: []byte("4")}, // not: missing key
		{Op: OpSet, Key: "t", Value: []byte("5")}, {Op: OpPing, Nonce: 1},
	} {
		b = AppendRequest(b, q)
	}
	_, err = nc.Write(b)
	require.NoError(t, err)
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	// 4 replies of bytes (8-byte length + 1 byte) and the PING's nonce.
	_, err = io.ReadFull(nc, make([]byte, 4*9+4))
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	if d := cmp.Diff([]string{"s=1", "s=3"}, got); d != "" {
		t.Errorf("OnCompareSet calls (-want +got):\n%s", d)
	}
}

// TestConnectionQuota: connections past the quota are closed as they come;
// those within it are served.
func TestConnectionQuota(t *testing.T) {
	srv, err := New(Config{Quotas: Quotas{Connections: 2}})
	require.NoError(t, err)
	addr := serveLoopback(t, srv)
	ping := func(nc net.Conn) error {
		if _, err := nc.Write(AppendRequest(nil, &Request{Op: OpPing, Nonce: 9})); err != nil {
			return err
		}
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := io.ReadFull(nc, make([]byte, 4))
		return err
	}
	a, b := rawDial(t, addr), rawDial(t, addr)
	require.NoError(t, ping(a))
	require.NoError(t, ping(b))
	c := rawDial(t, addr)
	require.Error(t, ping(c), "a third connection was served")
	require.Equal(t, 1.0, testutil.ToFloat64(srv.m.refused.WithLabelValues(refusedConnLimit)))
	a.Close()
	require.Eventually(t, func() bool { d := rawDial(t, addr); return ping(d) == nil }, 10*time.Second, 50*time.Millisecond)
}

// TestSlowReaderCutOff: a client that sends requests and never reads the
// replies makes its connection wait once replyBudget is queued, and is cut off
// when it reads nothing for writeTimeout; the server holds at most the
// budget and one reply for it meanwhile.
func TestSlowReaderCutOff(t *testing.T) {
	defer func(d time.Duration) { writeTimeout = d }(writeTimeout)
	writeTimeout = 300 * time.Millisecond
	srv, err := New(Config{})
	require.NoError(t, err)
	nc := rawDial(t, serveLoopback(t, srv))
	key := string(make([]byte, 8<<10))
	_, err = nc.Write(AppendRequest(nil, &Request{Op: OpSet, Key: key, Value: []byte("v")}))
	require.NoError(t, err)
	flood := make([]byte, 4096)
	for i := range flood {
		flood[i] = byte(OpListKeys)
	}
	nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	for {
		if _, err := nc.Write(flood); err != nil {
			break // cut off: the server closed the connection
		}
	}
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(srv.m.refused.WithLabelValues(refusedSlowReader)) == 1
	}, 10*time.Second, 20*time.Millisecond)
}

// TestServerCompareSet: the in-process COMPARE_SET stores only over the
// expected value of a key that exists, and is not reported to OnCompareSet.
func TestServerCompareSet(t *testing.T) {
	var hooked atomic.Int32
	srv, err := New(Config{OnCompareSet: func(string, []byte) { hooked.Add(1) }})
	require.NoError(t, err)
	nc := rawDial(t, serveLoopback(t, srv))

	stored, err := srv.CompareSet("k", nil, []byte("v"))
	require.NoError(t, err)
	require.False(t, stored, "a missing key is never created")

	// A client sets k (its PING's reply says the SET was served).
	_, err = nc.Write(AppendRequest(AppendRequest(nil, &Request{Op: OpSet, Key: "k", Value: []byte("1")}),
		&Request{Op: OpPing, Nonce: 7}))
	require.NoError(t, err)
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadFull(nc, make([]byte, 4))
	require.NoError(t, err)

	stored, err = srv.CompareSet("k", []byte("0"), []byte("2"))
	require.NoError(t, err)
	require.False(t, stored, "expected value differs")
	stored, err = srv.CompareSet("k", []byte("1"), []byte("2"))
	require.NoError(t, err)
	require.True(t, stored)
	v, _ := srv.Get("k")
	require.Equal(t, "2", string(v))
	require.Zero(t, hooked.Load())
}

// TestReplyQuota: replies that their clients have not read count against Quotas.ReplyBytes together; a request
// whose reply would pass it is refused before anything of it is built or stored, small replies never are, and the
// room comes back once the replies are written or their connection is gone.
func TestReplyQuota(t *testing.T) {
	m, err := newMetrics(nil)
	require.NoError(t, err)
	s := newStore(m, DefaultLimits(), Quotas{ReplyBytes: 3000}.withDefaults())
	a, b := &conn{}, &conn{}
	do := func(c *conn, q *Request) error { _, _, _, err := s.do(c, q); return err }
	quota := func(err error) bool { var e *ReplyQuotaError; return errors.As(err, &e) }
	require.NoError(t, do(a, &Request{Op: OpSet, Key: "big", Value: make([]byte, 1000)}))
	require.NoError(t, do(a, &Request{Op: OpGet, Key: "big"}))
	require.NoError(t, do(b, &Request{Op: OpGet, Key: "big"}))
	require.Equal(t, int64(2*1008), s.replies, "two replies not yet written")
	require.True(t, quota(do(a, &Request{Op: OpMultiGet, Keys: []string{"big"}})))
	require.True(t, quota(do(b, &Request{Op: OpCompareSet, Key: "big", Expected: make([]byte, 1000), Value: make([]byte, 10)})))
	require.Len(t, s.kv["big"], 1000, "a refused COMPARE_SET stores nothing")
	require.NoError(t, do(b, &Request{Op: OpQueuePush, Key: "q", Value: make([]byte, 990)}))
	require.True(t, quota(do(b, &Request{Op: OpQueuePop, Key: "q"})))
	require.Len(t, s.queues["q"], 1, "a refused QUEUE_POP takes nothing")
	require.NoError(t, do(b, &Request{Op: OpPing, Nonce: 1}), "a small reply is never refused")
	s.drop(b)
	require.Equal(t, int64(1008), s.replies, "a dropped connection's replies are given back")
	require.NoError(t, do(a, &Request{Op: OpQueuePop, Key: "q"}))
	require.Equal(t, int64(1008+16+990), s.replies)
}

// TestCosts keeps ItemCost, WaitKeyCost and ConnCost above what they stand for: the heap that 100,000 stored keys,
// 100,000 waited-for keys and 1,000 connections hold beyond the bytes their clients sent (a memory figure, not a
// time). ConnCost's measure is both ends' (the client's sockets are in this process too), its kernel send buffer
// aside.
func TestCosts(t *testing.T) {
	heap := func() int64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc + ms.StackInuse)
	}
	const n = 100_000
	s, do := newQuotaStore(t, Quotas{Bytes: 1 << 40, WaitBytes: 1 << 40})
	h0 := heap()
	for i := range n {
		require.NoError(t, do(&Request{Op: OpSet, Key: fmt.Sprintf("k%07d", i), Value: []byte("v")}))
	}
	h1 := heap()
	item := float64(h1-h0-(s.bytes-n*ItemCost)) / n
	for c := range 100 {
		keys := make([]string, n/100)
		for i := range keys {
			keys[i] = fmt.Sprintf("w%07d", c*len(keys)+i)
		}
		_, _, _, err := s.do(&conn{}, &Request{Op: OpWait, Keys: keys})
		require.NoError(t, err)
	}
	h2 := heap()
	wait := float64(h2-h1)/n - 8 // the key's own 8 bytes are its length's, not WaitKeyCost's
	runtime.KeepAlive(s)

	srv, err := New(Config{})
	require.NoError(t, err)
	addr := serveLoopback(t, srv)
	const conns = 1000
	h3 := heap()
	for range conns {
		nc := rawDial(t, addr)
		_, err := nc.Write(AppendRequest(nil, &Request{Op: OpPing, Nonce: 1}))
		require.NoError(t, err)
		_, err = io.ReadFull(nc, make([]byte, 4)) // served: its goroutine runs
		require.NoError(t, err)
	}
	conn := float64(heap()-h3) / conns
	t.Logf("measured: a stored key %.0f B (ItemCost %d), a waited-for key %.0f B (WaitKeyCost %d), a connection %.0f B of heap, both ends (ConnCost %d less the kernel's %d)",
		item, ItemCost, wait, WaitKeyCost, conn, ConnCost, 2*sendBuffer)
	require.Less(t, item, float64(ItemCost))
	require.Less(t, wait, float64(WaitKeyCost))
	require.Less(t, conn, float64(ConnCost-2*sendBuffer-replyBudget))
}

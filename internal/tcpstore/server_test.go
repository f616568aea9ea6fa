package tcpstore_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	// The tests of the package itself, written outside it only because
	// tcpstoretest imports it.
	. "github.com/elastic-training/elastic-training/internal/tcpstore"
	"github.com/elastic-training/elastic-training/internal/tcpstore/tcpstoretest"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

// testServer is a tcpstoretest server with the metrics the tests read.
type testServer struct {
	*tcpstoretest.Server
	m TestMetrics
}

func startServer(t *testing.T, lim Limits) *testServer {
	t.Helper()
	return startServerWith(t, Config{Limits: lim})
}

// startServerWith starts a server with cfg, its log and metrics the test's
// (tcpstoretest.Start).
func startServerWith(t *testing.T, cfg Config) *testServer {
	t.Helper()
	s := tcpstoretest.Start(t, cfg)
	return &testServer{Server: s, m: s.TestMetrics()}
}

func (ts *testServer) gauge(g prometheus.Gauge) int { return int(testutil.ToFloat64(g)) }

// eventually waits for the gauge g to read want.
func (ts *testServer) eventually(t *testing.T, what string, g prometheus.Gauge, want int) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, fmt.Sprintf("%s = %d", what, want), func() error {
		if got := ts.gauge(g); got != want {
			return fmt.Errorf("%s = %d", what, got)
		}
		return nil
	})
}

func TestOps(t *testing.T) {
	ts := startServer(t, Limits{})
	c := dial(t, ts.Addr)
	wantBytes := func(what string, got []byte, want string) {
		t.Helper()
		if string(got) != want {
			t.Errorf("%s = %q, want %q", what, got, want)
		}
	}
	wantInt := func(what string, got, want int64) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %d, want %d", what, got, want)
		}
	}

	c.set("/k", "v")
	wantBytes("GET /k", c.get("/k"), "v")
	wantBytes("GET /missing", c.get("/missing"), "") // torch's libuv server; its classic one closes
	c.send(&Request{Op: OpSet, Key: "/bin", Value: []byte{0, 0xff, 0x10}})
	wantBytes("GET /bin", c.get("/bin"), "\x00\xff\x10")

	c.send(&Request{Op: OpAdd, Key: "/cnt", Delta: 5})
	wantInt("ADD /cnt 5", c.i64(), 5)
	c.send(&Request{Op: OpAdd, Key: "/cnt", Delta: -2})
	wantInt("ADD /cnt -2", c.i64(), 3)
	wantBytes("GET /cnt", c.get("/cnt"), "3")
	c.set("/loose", " \t+12abc") // std::stoll: white space, a sign, digits, and the rest ignored
	c.send(&Request{Op: OpAdd, Key: "/loose", Delta: 1})
	wantInt("ADD on ' +12abc'", c.i64(), 13)

	cs := func(key, expected, desired string) []byte {
		c.send(&Request{Op: OpCompareSet, Key: key, Expected: []byte(expected), Value: []byte(desired)})
		return c.bytes()
	}
	wantBytes("COMPARE_SET absent, expected ''", cs("/cs", "", "new"), "new")
	wantBytes("COMPARE_SET absent, expected 'exp'", cs("/cs2", "exp", "new"), "exp")
	c.send(&Request{Op: OpCheck, Keys: []string{"/cs2"}})
	wantInt("CHECK /cs2 after a failed COMPARE_SET", int64(c.byte1()), CheckNotReady)
	wantBytes("COMPARE_SET match", cs("/cs", "new", "newer"), "newer")
	wantBytes("COMPARE_SET mismatch", cs("/cs", "zzz", "other"), "newer")
	wantBytes("COMPARE_SET present, expected ''", cs("/cs", "", "other"), "newer")

	check := func(keys ...string) byte { c.send(&Request{Op: OpCheck, Keys: keys}); return c.byte1() }
	wantInt("CHECK []", int64(check()), CheckReady)
	wantInt("CHECK [/k]", int64(check("/k")), CheckReady)
	wantInt("CHECK [/k /missing]", int64(check("/k", "/missing")), CheckNotReady)
	c.send(&Request{Op: OpWait, Keys: []string{"/k", "/cnt"}})
	wantInt("WAIT on present keys", int64(c.byte1()), StopWaiting)
	c.send(&Request{Op: OpWait})
	wantInt("WAIT []", int64(c.byte1()), StopWaiting)

	c.send(&Request{Op: OpGetNumKeys})
	wantInt("GETNUMKEYS", c.i64(), 5) // /k /bin /cnt /loose /cs
	c.send(&Request{Op: OpDeleteKey, Key: "/bin"}, &Request{Op: OpDeleteKey, Key: "/bin"})
	wantInt("DELETE_KEY present", c.i64(), 1)
	wantInt("DELETE_KEY absent", c.i64(), 0)

	c.send(&Request{Op: OpAppend, Key: "/ap", Value: []byte("a")}, &Request{Op: OpAppend, Key: "/ap", Value: []byte("bc")})
	wantBytes("GET /ap", c.get("/ap"), "abc")

	big := strings.Repeat("B", 100<<10) // goes out by reference
	c.send(&Request{Op: OpMultiSet, Keys: []string{"/m1", "/m2", "/big"}, Values: [][]byte{[]byte("x"), []byte("yy"), []byte(big)}})
	c.send(&Request{Op: OpMultiGet, Keys: []string{"/m1", "/big", "/m2", "/nope", "/big"}})
	for i, want := range []string{"x", big, "yy", "", big} {
		wantBytes(fmt.Sprintf("MULTI_GET [%d]", i), c.bytes(), want)
	}

	c.send(&Request{Op: OpListKeys})
	var keys []string
	for n := c.i64(); n > 0; n-- {
		keys = append(keys, string(c.bytes()))
	}
	wantBytes("LIST_KEYS", []byte(strings.Join(keys, " ")), "/ap /big /cnt /cs /k /loose /m1 /m2")

	// Queues: torch's libuv server's semantics.
	c.send(&Request{Op: OpQueueLen, Key: "/q"})
	wantInt("QUEUE_LEN unknown", c.i64(), 0)
	c.send(&Request{Op: OpQueuePush, Key: "/q", Value: []byte("a")}, &Request{Op: OpQueuePush, Key: "/q", Value: []byte(big)})
	wantInt("CHECK [/q] with a queue", int64(check("/q")), CheckReady)
	c.send(&Request{Op: OpQueueLen, Key: "/q"})
	wantInt("QUEUE_LEN", c.i64(), 2)
	c.send(&Request{Op: OpQueuePop, Key: "/q"})
	wantInt("QUEUE_POP length", c.i64(), 2)
	wantBytes("QUEUE_POP value", c.bytes(), "a")
	c.send(&Request{Op: OpQueuePop, Key: "/q"})
	wantInt("QUEUE_POP length", c.i64(), 1)
	wantBytes("QUEUE_POP value", c.bytes(), big)
	c.send(&Request{Op: OpQueuePop, Key: "/q"})
	wantInt("QUEUE_POP empty", c.i64(), 0)
	wantInt("CHECK [/q] emptied", int64(check("/q")), CheckNotReady)

	c.send(&Request{Op: OpBarrier, Key: "/b1", WorldSize: 1})
	wantInt("BARRIER of one", int64(c.byte1()), StopWaiting)
	wantBytes("GET /b1", c.get("/b1"), "1")
	c.send(&Request{Op: OpCancelWait})
	wantInt("CANCEL_WAIT with nothing pending", int64(c.byte1()), WaitCanceled)

	// Pipelined in one write, answered in order.
	c.send(&Request{Op: OpSet, Key: "/p", Value: []byte("1")}, &Request{Op: OpGet, Key: "/p"},
		&Request{Op: OpAdd, Key: "/p", Delta: 1}, &Request{Op: OpPing, Nonce: 9})
	wantBytes("pipelined GET", c.bytes(), "1")
	wantInt("pipelined ADD", c.i64(), 2)
	wantInt("pipelined PING", int64(c.u32()), 9)

	if got := testutil.ToFloat64(ts.m.Ops[OpSet]); got != 4 {
		t.Errorf("ops_total{op=SET} = %v, want 4", got)
	}
	ts.eventually(t, "keys", ts.m.Keys, 10)
	if testutil.ToFloat64(ts.m.BytesIn) == 0 || testutil.ToFloat64(ts.m.BytesOut) < 200<<10 {
		t.Errorf("bytes in %v, out %v", testutil.ToFloat64(ts.m.BytesIn), testutil.ToFloat64(ts.m.BytesOut))
	}
	if n, err := testutil.GatherAndCount(ts.Registry); err != nil || n == 0 {
		t.Errorf("gather: %d metrics, %v", n, err)
	}
}

func TestRefused(t *testing.T) {
	key := func(s string) []byte { return append(u64le(uint64(len(s))), s...) }
	validate := AppendRequest(nil, &Request{Op: OpValidate, Magic: Magic})
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for _, tc := range []struct {
		name, reason string
		in           []byte
	}{
		{"bad magic", RefusedBadMagic, AppendRequest(nil, &Request{Op: OpValidate, Magic: 0xdeadbeef})},
		{"GETNUMKEYS before VALIDATE", RefusedNoValidate, []byte{byte(OpGetNumKeys)}},
		{"PING before VALIDATE", RefusedNoValidate, AppendRequest(nil, &Request{Op: OpPing, Nonce: 1})},
		{"HTTP", RefusedNoValidate, []byte("GET / HTTP/1.1\r\n\r\n")},
		{"VALIDATE twice", RefusedNoValidate, cat(validate, validate)},
		{"unknown opcode 0x13", RefusedUnknownOp, cat(validate, []byte{0x13})},
		{"unknown opcode 0xff", RefusedUnknownOp, cat(validate, []byte{0xff, 1, 2, 3})},
		{"key of 2^62 bytes", RefusedTooLarge, cat(validate, []byte{byte(OpSet)}, u64le(1<<62))},
		{"value of 2^62 bytes", RefusedTooLarge, cat(validate, []byte{byte(OpSet)}, key("/k"), u64le(1<<62))},
		{"2^62 keys", RefusedTooLarge, cat(validate, []byte{byte(OpMultiSet)}, u64le(1<<62))},
		{"value past the limit", RefusedTooLarge, cat(validate, []byte{byte(OpSet)}, key("/k"), u64le(1001))},
		{"APPEND past the limit", RefusedTooLarge, cat(validate, AppendRequest(nil, &Request{Op: OpAppend, Key: "/long", Value: []byte("x")}))},
		{"ADD on a non-number", RefusedNotNumber, cat(validate, AppendRequest(nil, &Request{Op: OpAdd, Key: "/txt", Delta: 1}))},
		{"BARRIER on a non-number", RefusedNotNumber, cat(validate, AppendRequest(nil, &Request{Op: OpBarrier, Key: "/txt", WorldSize: 2}))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, Limits{MaxValueLen: 1000})
			other := dial(t, ts.Addr)
			other.set("/txt", "abc")
			other.set("/long", strings.Repeat("l", 1000))
			other.sync()
			c := dialRaw(t, ts.Addr)
			c.sendRaw(tc.in)
			c.expectClosed()
			// Only that connection: the other is served, and the store is as it was.
			if got := string(other.get("/txt")); got != "abc" {
				t.Errorf("GET /txt = %q after the refused request, want abc", got)
			}
			if got := len(other.get("/long")); got != 1000 {
				t.Errorf("len(/long) = %d after the refused request, want 1000", got)
			}
			if got := testutil.ToFloat64(ts.m.Refused.WithLabelValues(tc.reason)); got != 1 {
				t.Errorf("refused_total{reason=%s} = %v, want 1", tc.reason, got)
			}
			testenv.Eventually(t, 5*time.Second, "a warning naming the client", func() error {
				log := ts.Log.String()
				want := fmt.Sprintf("remote=%s reason=%s", c.nc.LocalAddr(), tc.reason)
				if !strings.Contains(log, "level=WARN") || !strings.Contains(log, want) {
					return fmt.Errorf("no %q in the log:\n%s", want, log)
				}
				return nil
			})
			ts.eventually(t, "connections", ts.m.Connections, 1)
		})
	}
}

// waitRegistered waits until the server counts n pending waits.
func (ts *testServer) waitRegistered(t *testing.T, n int) {
	t.Helper()
	ts.eventually(t, "waiters", ts.m.Waiters, n)
}

func TestWaitWokenBy(t *testing.T) {
	for _, tc := range []struct {
		name  string
		wake  *Request
		reply int // bytes the waker gets back
	}{
		{"SET", &Request{Op: OpSet, Key: "/w", Value: []byte("v")}, 0},
		{"ADD", &Request{Op: OpAdd, Key: "/w", Delta: 1}, 8},
		{"APPEND", &Request{Op: OpAppend, Key: "/w", Value: []byte("v")}, 0},
		{"MULTI_SET", &Request{Op: OpMultiSet, Keys: []string{"/x", "/w"}, Values: [][]byte{{}, {}}}, 0},
		// Torch's classic server does not wake here; its libuv server does.
		{"COMPARE_SET creating the key", &Request{Op: OpCompareSet, Key: "/w", Expected: []byte{}, Value: []byte("v")}, 9},
		{"QUEUE_PUSH", &Request{Op: OpQueuePush, Key: "/w", Value: []byte("v")}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, Limits{})
			a, b := dial(t, ts.Addr), dial(t, ts.Addr)
			a.send(&Request{Op: OpWait, Keys: []string{"/w"}})
			ts.waitRegistered(t, 1)
			b.send(tc.wake)
			b.read(tc.reply)
			b.sync()
			if got := a.byte1(); got != StopWaiting {
				t.Fatalf("waiter read 0x%02x, want STOP_WAITING", got)
			}
			ts.waitRegistered(t, 0)
			a.sync()
		})
	}
	t.Run("not by COMPARE_SET that stores nothing", func(t *testing.T) {
		ts := startServer(t, Limits{})
		a, b := dial(t, ts.Addr), dial(t, ts.Addr)
		a.send(&Request{Op: OpWait, Keys: []string{"/w"}})
		ts.waitRegistered(t, 1)
		b.send(&Request{Op: OpCompareSet, Key: "/w", Expected: []byte("x"), Value: []byte("v")})
		b.bytes()
		ts.waitRegistered(t, 1)
		a.send(&Request{Op: OpCancelWait})
		if got := a.byte1(); got != WaitCanceled {
			t.Fatalf("read 0x%02x, want WAIT_CANCELED", got)
		}
	})
}

func TestWaitForSeveralKeys(t *testing.T) {
	ts := startServer(t, Limits{})
	a, b := dial(t, ts.Addr), dial(t, ts.Addr)
	b.set("/present", "1")
	b.sync()
	a.send(&Request{Op: OpWait, Keys: []string{"/present", "/y", "/z", "/z"}})
	ts.waitRegistered(t, 1)
	b.set("/y", "1")
	b.sync()
	ts.waitRegistered(t, 1) // still waiting for /z
	b.set("/z", "1")
	if got := a.byte1(); got != StopWaiting {
		t.Fatalf("read 0x%02x, want STOP_WAITING", got)
	}
	ts.waitRegistered(t, 0)
	a.sync()
}

func TestCancelWait(t *testing.T) {
	ts := startServer(t, Limits{})
	a, b := dial(t, ts.Addr), dial(t, ts.Addr)

	// A timed-out wait (T8): CANCEL_WAIT answers WAIT_CANCELED, and a later SET
	// of the key sends nothing.
	a.send(&Request{Op: OpWait, Keys: []string{"/never"}})
	ts.waitRegistered(t, 1)
	a.send(&Request{Op: OpCancelWait})
	if got := a.byte1(); got != WaitCanceled {
		t.Fatalf("read 0x%02x, want WAIT_CANCELED", got)
	}
	ts.waitRegistered(t, 0)
	b.set("/never", "1")
	b.sync()
	a.sync() // fails on a stray STOP_WAITING

	// The race the client handles: woken, then cancelled; STOP_WAITING comes
	// first, then WAIT_CANCELED.
	a.send(&Request{Op: OpWait, Keys: []string{"/race"}})
	ts.waitRegistered(t, 1)
	b.set("/race", "1")
	b.sync()
	a.send(&Request{Op: OpCancelWait})
	if got := a.read(2); !bytes.Equal(got, []byte{StopWaiting, WaitCanceled}) {
		t.Fatalf("read %x, want 00 01", got)
	}
	a.sync()

	// A second WAIT replaces the first.
	a.send(&Request{Op: OpWait, Keys: []string{"/first"}}, &Request{Op: OpWait, Keys: []string{"/second"}})
	testenv.Eventually(t, 5*time.Second, "the second wait registered", func() error {
		if got := testutil.ToFloat64(ts.m.Ops[OpWait]); got != 4 {
			return fmt.Errorf("%v WAITs served", got)
		}
		return nil
	})
	ts.waitRegistered(t, 1)
	b.set("/first", "1")
	b.set("/second", "1")
	b.sync()
	if got := a.byte1(); got != StopWaiting {
		t.Fatalf("read 0x%02x, want STOP_WAITING", got)
	}
	a.sync()
}

func TestQueuePushWakesOne(t *testing.T) {
	ts := startServer(t, Limits{})
	a, b, p := dial(t, ts.Addr), dial(t, ts.Addr), dial(t, ts.Addr)
	a.send(&Request{Op: OpWait, Keys: []string{"/q"}})
	ts.waitRegistered(t, 1)
	b.send(&Request{Op: OpWait, Keys: []string{"/q"}})
	ts.waitRegistered(t, 2)
	p.send(&Request{Op: OpQueuePush, Key: "/q", Value: []byte("1")})
	if got := a.byte1(); got != StopWaiting { // the first to wait
		t.Fatalf("read 0x%02x, want STOP_WAITING", got)
	}
	ts.waitRegistered(t, 1)
	a.send(&Request{Op: OpQueuePop, Key: "/q"})
	if n, v := a.i64(), a.bytes(); n != 1 || string(v) != "1" {
		t.Fatalf("QUEUE_POP = %d %q, want 1 \"1\"", n, v)
	}
	p.send(&Request{Op: OpQueuePush, Key: "/q", Value: []byte("2")})
	if got := b.byte1(); got != StopWaiting {
		t.Fatalf("read 0x%02x, want STOP_WAITING", got)
	}
	ts.waitRegistered(t, 0)
}

func TestBarrier(t *testing.T) {
	ts := startServer(t, Limits{})
	a, b, c := dial(t, ts.Addr), dial(t, ts.Addr), dial(t, ts.Addr)
	a.send(&Request{Op: OpBarrier, Key: "/bb", WorldSize: 3})
	ts.waitRegistered(t, 1)
	b.send(&Request{Op: OpBarrier, Key: "/bb", WorldSize: 3})
	ts.waitRegistered(t, 2)
	if got := string(c.get("/bb")); got != "2" {
		t.Fatalf("barrier counter %q, want 2", got)
	}
	c.send(&Request{Op: OpBarrier, Key: "/bb", WorldSize: 3})
	for _, x := range []*client{c, a, b} {
		if got := x.byte1(); got != StopWaiting {
			t.Fatalf("read 0x%02x, want STOP_WAITING", got)
		}
	}
	ts.waitRegistered(t, 0)
	// The counter is never reset: a later barrier on the key returns at once.
	a.send(&Request{Op: OpBarrier, Key: "/bb", WorldSize: 3})
	if got := a.byte1(); got != StopWaiting {
		t.Fatalf("read 0x%02x, want STOP_WAITING", got)
	}
	if got := string(c.get("/bb")); got != "4" {
		t.Fatalf("barrier counter %q, want 4", got)
	}
	// A client that gives up: CANCEL_WAIT, and the count stays.
	a.send(&Request{Op: OpBarrier, Key: "/bt", WorldSize: 2})
	ts.waitRegistered(t, 1)
	a.send(&Request{Op: OpCancelWait})
	if got := a.byte1(); got != WaitCanceled {
		t.Fatalf("read 0x%02x, want WAIT_CANCELED", got)
	}
	ts.waitRegistered(t, 0)
	if got := string(c.get("/bt")); got != "1" {
		t.Fatalf("barrier counter %q, want 1", got)
	}
}

func TestDisconnectDropsWaiters(t *testing.T) {
	ts := startServer(t, Limits{})
	a, b := dial(t, ts.Addr), dial(t, ts.Addr)
	a.send(&Request{Op: OpWait, Keys: []string{"/gone", "/gone2"}})
	b.send(&Request{Op: OpBarrier, Key: "/bar", WorldSize: 5})
	ts.waitRegistered(t, 2)
	a.nc.Close()
	b.nc.Close()
	ts.waitRegistered(t, 0)
	ts.eventually(t, "connections", ts.m.Connections, 0)
	c := dial(t, ts.Addr)
	c.set("/gone", "1")
	c.set("/gone2", "1")
	c.sync()
	if left := ts.WaitingKeys(); left != 0 {
		t.Fatalf("%d keys still have waiters listed", left)
	}
}

func TestConcurrentAdds(t *testing.T) {
	ts := startServer(t, Limits{})
	const clients, adds = 64, 100
	seen := make(chan int64, clients*adds)
	var wg sync.WaitGroup
	for range clients {
		c := dial(t, ts.Addr)
		wg.Go(func() {
			for range adds {
				c.send(&Request{Op: OpAdd, Key: "/ctr", Delta: 1})
				seen <- c.i64()
			}
		})
	}
	wg.Wait()
	close(seen)
	got := map[int64]bool{}
	for v := range seen {
		if got[v] {
			t.Fatalf("ADD returned %d twice", v)
		}
		got[v] = true
	}
	if v := string(dial(t, ts.Addr).get("/ctr")); v != fmt.Sprint(clients*adds) {
		t.Fatalf("counter %s, want %d", v, clients*adds)
	}
}

// Idle connections cost a goroutine each, and nothing once they are gone:
// waiting, woken (a flush goroutine for a moment) or not.
func TestGoroutinesReturnToBaseline(t *testing.T) {
	ts := startServer(t, Limits{})
	base := runtime.NumGoroutine()
	const n = 200
	var clients []*client
	for i := range n {
		c := dial(t, ts.Addr)
		if i%2 == 0 {
			c.send(&Request{Op: OpWait, Keys: []string{"/k"}})
		} else if i%4 == 1 {
			c.send(&Request{Op: OpWait, Keys: []string{"/never"}})
		}
		clients = append(clients, c)
	}
	ts.eventually(t, "connections", ts.m.Connections, n)
	ts.waitRegistered(t, n/2+n/4)
	if g := runtime.NumGoroutine() - base; g > n+5 {
		t.Errorf("%d goroutines for %d connections", g, n)
	}
	clients[1].set("/k", "1")
	for i, c := range clients {
		if i%2 == 0 {
			if got := c.byte1(); got != StopWaiting {
				t.Fatalf("client %d read 0x%02x", i, got)
			}
		}
	}
	ts.waitRegistered(t, n/4)
	for _, c := range clients {
		c.nc.Close()
	}
	ts.eventually(t, "connections", ts.m.Connections, 0)
	ts.waitRegistered(t, 0)
	testenv.Eventually(t, 10*time.Second, "goroutines back to the baseline", func() error {
		if g := runtime.NumGoroutine(); g > base {
			return fmt.Errorf("%d goroutines, baseline %d", g, base)
		}
		return nil
	})
}

func TestServeEndsWithContext(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()
	a := dial(t, l.Addr().String())
	a.send(&Request{Op: OpWait, Keys: []string{"/w"}})
	a.sync()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve still running 10s after its context ended")
	}
	a.expectClosed()
	// Asked of the listener itself: a dial to its port may reach another test's listener, which the kernel may
	// hand the freed port at once (CI under -race: "the listener still accepts").
	if err := l.(*net.TCPListener).SetDeadline(time.Now()); err == nil {
		t.Error("the listener is still open")
	}
	testenv.Eventually(t, 10*time.Second, "goroutines back to the baseline", func() error {
		if g := runtime.NumGoroutine(); g > base {
			return fmt.Errorf("%d goroutines, baseline %d", g, base)
		}
		return nil
	})
}

func TestMetricsRegisterOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(Config{Metrics: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Metrics: reg}); err == nil {
		t.Fatal("a second server on the same registry: no error")
	}
}

// An idle connection costs its goroutine, its read buffer and little else:
// measured here with the clients' side (a net.Conn each) included.
func TestIdleConnectionMemory(t *testing.T) {
	ts := startServer(t, Limits{})
	const n = 1000
	var ms runtime.MemStats
	used := func() uint64 {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc + ms.StackInuse
	}
	before := used()
	conns := make([]net.Conn, 0, n)
	hello := AppendRequest(AppendRequest(nil, &Request{Op: OpValidate, Magic: Magic}), &Request{Op: OpPing, Nonce: 1})
	for range n {
		nc, err := net.Dial("tcp", ts.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if _, err := nc.Write(hello); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(nc, make([]byte, 4)); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, nc)
	}
	ts.eventually(t, "connections", ts.m.Connections, n)
	per := (int64(used()) - int64(before)) / n
	t.Logf("%d idle connections: %d bytes each (heap and stacks, both ends)", n, per)
	if per > 32<<10 {
		t.Errorf("%d bytes per idle connection, want at most 32 KiB", per)
	}
	runtime.KeepAlive(conns)
}

// Requests that came before a refused one in the same write are answered
// first, as torch's server answers them.
func TestRefusedAfterPipelinedRequests(t *testing.T) {
	ts := startServer(t, Limits{})
	for _, bad := range [][]byte{{0x13}, AppendRequest(nil, &Request{Op: OpAdd, Key: "/txt", Delta: 1})} {
		c := dial(t, ts.Addr)
		b := AppendRequest(nil, &Request{Op: OpSet, Key: "/txt", Value: []byte("abc")})
		b = AppendRequest(b, &Request{Op: OpGet, Key: "/txt"})
		c.sendRaw(append(b, bad...))
		if got := string(c.bytes()); got != "abc" {
			t.Fatalf("GET = %q, want abc", got)
		}
		c.expectClosed()
	}
}

// A reply goes out before the server waits for more bytes: a client that
// sent a request and part of the next one gets its reply.
func TestReplyBeforeWaitingForTheRest(t *testing.T) {
	ts := startServer(t, Limits{})
	c := dial(t, ts.Addr)
	c.set("/a", "1")
	b := AppendRequest(nil, &Request{Op: OpGet, Key: "/a"})
	next := AppendRequest(nil, &Request{Op: OpSet, Key: "/b", Value: []byte("2")})
	c.sendRaw(append(b, next[:5]...))
	if got := string(c.bytes()); got != "1" {
		t.Fatalf("GET = %q, want 1", got)
	}
	c.sendRaw(next[5:])
	if got := string(c.get("/b")); got != "2" {
		t.Fatalf("GET /b = %q, want 2", got)
	}
}

// TestOnSet: every key a client SETs, alone or in a MULTI_SET, reaches the
// hook once the store has it; other writes do not.
func TestOnSet(t *testing.T) {
	var mu sync.Mutex
	var got []string
	ts := startServerWith(t, Config{OnSet: func(key string, value []byte) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, key+"="+string(value))
	}})
	c := dial(t, ts.Addr)
	c.set("torch.rendezvous.r.0/MASTER_ADDR", "w-0.job")
	c.send(&Request{Op: OpMultiSet, Keys: []string{"a", "b"}, Values: [][]byte{[]byte("1"), []byte("2")}})
	c.send(&Request{Op: OpAdd, Key: "n", Delta: 1})
	c.i64()
	c.send(&Request{Op: OpCompareSet, Key: "cas", Value: []byte("x")})
	c.bytes()
	c.sync()
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]string{"torch.rendezvous.r.0/MASTER_ADDR=w-0.job", "a=1", "b=2"}, got); diff != "" {
		t.Errorf("OnSet calls (-want +got):\n%s", diff)
	}
}

// TestInProcessWriter: the elastic-training backend writes and deletes from the
// sidecar's process: a SET from there wakes a client's WAIT, a prefix's keys
// go and give their room back, and neither reaches OnSet.
func TestInProcessWriter(t *testing.T) {
	var sets atomic.Int32
	ts := startServerWith(t, Config{OnSet: func(string, []byte) { sets.Add(1) }})
	c := dial(t, ts.Addr)
	c.send(&Request{Op: OpWait, Keys: []string{"/elastic-training/r/round/1/w-0"}})
	ts.waitRegistered(t, 1)
	require.NoError(t, ts.Set("/elastic-training/r/round/1/w-0", []byte("0 2")))
	require.NoError(t, ts.Set("/elastic-training/r/round/1/w-1", []byte("1 2")))
	require.NoError(t, ts.Set("/elastic-training/r/round/10/w-0", []byte("0 1")))
	if got := c.byte1(); got != StopWaiting {
		t.Fatalf("waiter read 0x%02x, want STOP_WAITING", got)
	}
	require.Equal(t, "0 2", string(c.get("/elastic-training/r/round/1/w-0")))
	require.Equal(t, 3, ts.gauge(ts.m.Keys))
	require.Equal(t, 2, ts.DeletePrefix("/elastic-training/r/round/1/"))
	require.Equal(t, 1, ts.gauge(ts.m.Keys))
	_, ok := ts.Get("/elastic-training/r/round/10/w-0")
	require.True(t, ok, "round 10 is not round 1")
	require.Zero(t, sets.Load(), "the writer knows what it wrote")
}

package v2api

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

type testServer struct {
	*Server
}

func newTestServer(t *testing.T) *testServer {
	s := New(Config{
		ClusterID:  func() string { return "cdf818194e3a8c32" },
		ClientURLs: func() []string { return []string{"http://localhost:2379"} },
		Metrics:    NewMetrics(prometheus.NewRegistry()),
	})
	ctx, cancel := context.WithCancel(context.Background())
	go s.RunExpiry(ctx, 100*time.Millisecond)
	t.Cleanup(func() { cancel(); s.Close() })
	return &testServer{s}
}

func (s *testServer) mux() *http.ServeMux {
	mux := http.NewServeMux()
	for p, h := range s.Handlers() {
		mux.Handle(p, h)
	}
	return mux
}

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func do(t *testing.T, h http.Handler, method, target, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, rd)
	if body != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// A TTL directory expires when its TTL has passed and nothing under it was
// written for a whole TTL; writes under it (a live job's keep-alives) keep it.
func TestDirectoryTTL(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	s := New(Config{Now: clk.now})
	h := (&testServer{s}).mux()

	code, body := do(t, h, "PUT", "/v2/keys/p/run_1", "dir=true&prevExist=false&ttl=10")
	require.Equal(t, 201, code, body)
	require.Contains(t, body, `"ttl":10`)

	// Keep-alives under the directory every 5 s for a minute: it must stay.
	for i := 0; i < 12; i++ {
		clk.t = clk.t.Add(5 * time.Second)
		code, body = do(t, h, "PUT", "/v2/keys/p/run_1/rank_0", "ttl=10&value=")
		require.Equal(t, http.StatusOK/100, code/100, body)
		s.ExpireNow()
		code, body = do(t, h, "GET", "/v2/keys/p/run_1", "")
		require.Equal(t, 200, code, "run dir expired under a live job at step %d: %s", i, body)
	}

	// The job stops writing: the keep-alive key expires after 10 s and the
	// directory with it.
	clk.t = clk.t.Add(10 * time.Second)
	s.ExpireNow()
	code, _ = do(t, h, "GET", "/v2/keys/p/run_1", "")
	require.Equal(t, 404, code)

	// A live TTL key under the directory keeps it even without writes for
	// longer than the directory's TTL (keep-alives every 5 s, dir TTL 2 s).
	do(t, h, "PUT", "/v2/keys/p/run_5", "dir=true&prevExist=false&ttl=2")
	for i := 0; i < 12; i++ {
		if i%5 == 0 {
			do(t, h, "PUT", "/v2/keys/p/run_5/rank_0", "ttl=10&value=")
		}
		clk.t = clk.t.Add(time.Second)
		s.ExpireNow()
		code, body = do(t, h, "GET", "/v2/keys/p/run_5", "")
		require.Equal(t, 200, code, "step %d: %s", i, body)
	}
	clk.t = clk.t.Add(11 * time.Second)
	s.ExpireNow() // the key expires
	s.ExpireNow() // then the directory
	code, _ = do(t, h, "GET", "/v2/keys/p/run_5", "")
	require.Equal(t, 404, code)

	// A refresh moves the deadline.
	do(t, h, "PUT", "/v2/keys/p/run_2", "dir=true&prevExist=false&ttl=10")
	clk.t = clk.t.Add(8 * time.Second)
	code, body = do(t, h, "PUT", "/v2/keys/p/run_2", "refresh=true&prevExist=true&ttl=10")
	require.Equal(t, 200, code, body)
	clk.t = clk.t.Add(8 * time.Second)
	s.ExpireNow()
	code, _ = do(t, h, "GET", "/v2/keys/p/run_2", "")
	require.Equal(t, 200, code)
	clk.t = clk.t.Add(3 * time.Second)
	s.ExpireNow()
	code, _ = do(t, h, "GET", "/v2/keys/p/run_2", "")
	require.Equal(t, 404, code)

	// Update without ttl makes it permanent, as in etcd.
	do(t, h, "PUT", "/v2/keys/p/run_3", "dir=true&prevExist=false&ttl=10")
	code, body = do(t, h, "PUT", "/v2/keys/p/run_3", "prevExist=true&dir=true")
	require.Equal(t, 200, code, body)
	clk.t = clk.t.Add(time.Hour)
	s.ExpireNow()
	code, _ = do(t, h, "GET", "/v2/keys/p/run_3", "")
	require.Equal(t, 200, code)

	// A directory recreated under the same name does not inherit the old TTL.
	do(t, h, "PUT", "/v2/keys/p/run_4", "dir=true&prevExist=false&ttl=10")
	do(t, h, "DELETE", "/v2/keys/p/run_4?dir=true", "")
	do(t, h, "PUT", "/v2/keys/p/run_4", "dir=true&prevExist=false")
	clk.t = clk.t.Add(time.Hour)
	s.ExpireNow()
	code, _ = do(t, h, "GET", "/v2/keys/p/run_4", "")
	require.Equal(t, 200, code)
}

// A long-poll wait ends when the client goes away and when the server closes.
func TestWaitEnds(t *testing.T) {
	s := newTestServer(t)
	srv := httptest.NewServer(s.mux())
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/v2/keys/x?wait=true", nil)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, "1", requireGauge(t, s.cfg.Metrics))
	cancel()
	resp.Body.Close()
	testenv.Eventually(t, 5*time.Second, "wait to end after the client left", func() error {
		if g := requireGauge(t, s.cfg.Metrics); g != "0" {
			return fmt.Errorf("active waits %s", g)
		}
		return nil
	})

	resp, err = http.Get(srv.URL + "/v2/keys/x?wait=true")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { _, err := io.ReadAll(resp.Body); done <- err }()
	s.Close()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("wait did not end when the server closed")
	}
}

func requireGauge(t *testing.T, m *Metrics) string {
	return fmt.Sprint(testutil.ToFloat64(m.ActiveWaits))
}

// FuzzHandler: no request, however malformed, may crash the handler or get
// anything but an etcd-style answer.
func FuzzHandler(f *testing.F) {
	f.Add("PUT", "/v2/keys/a/b", "value=x&ttl=5&prevExist=false")
	f.Add("GET", "/v2/keys/a?wait=true&waitIndex=1&recursive=true", "")
	f.Add("PUT", "/v2/keys/a", "refresh=true&prevExist=true&ttl=9999999999999999999")
	f.Add("DELETE", "/v2/keys/?dir=true&recursive=true", "")
	f.Add("POST", "/v2/keys/q", "value=%zz")
	f.Add("PUT", "/v2/keys/../../a", "dir=true&ttl=1")
	f.Add("PUT", "/v2/keys/a", "prevIndex=1&prevValue=x&dir=true&ttl=0")
	f.Fuzz(func(t *testing.T, method, target, body string) {
		if !strings.HasPrefix(target, "/") || strings.ContainsAny(target, " \r\n\t#") {
			return
		}
		u, err := url.ParseRequestURI(target)
		if err != nil {
			return
		}
		if u.Query().Get("wait") != "" || strings.Contains(body, "wait") {
			return // a valid wait blocks; waits are tested above
		}
		s := New(Config{})
		h := (&testServer{s}).mux()
		do(t, h, "PUT", "/v2/keys/a/b", "value=1")
		for _, m := range []string{"GET", "PUT", "POST", "DELETE", "HEAD", method} {
			if _, err := http.NewRequest(m, "http://x/", nil); err != nil || m == "" {
				continue // not an HTTP method; net/http never hands us one
			}
			code, out := do(t, h, m, target, body)
			if code >= 500 {
				t.Fatalf("%s %s %q: %d %s", m, target, body, code, out)
			}
			if code >= 400 && code != 404 && code != 405 && strings.HasPrefix(u.Path, "/v2/keys") && !strings.Contains(out, `"errorCode"`) {
				t.Fatalf("%s %s %q: %d without an etcd error: %s", m, target, body, code, out)
			}
		}
		s.ExpireNow()
	})
}

func TestSnapshotRestore(t *testing.T) {
	a := &testServer{New(Config{})}
	h := a.mux()
	do(t, h, "PUT", "/v2/keys/p/run_1", "dir=true&prevExist=false&ttl=100")
	do(t, h, "PUT", "/v2/keys/p/run_1/k", "value=v&ttl=50")
	snap, err := a.Snapshot()
	require.NoError(t, err)

	b := &testServer{New(Config{})}
	require.NoError(t, b.Restore(snap))
	code, body := do(t, b.mux(), "GET", "/v2/keys/p?recursive=true", "")
	require.Equal(t, 200, code)
	require.Contains(t, body, `"key":"/p/run_1/k","value":"v"`)
	require.Contains(t, body, `"ttl":100`, "directory TTL restored")
	require.Equal(t, a.Store().Index(), b.Store().Index())
	require.Error(t, b.Restore([]byte("{")))
}

func TestEnsureDir(t *testing.T) {
	s := &testServer{New(Config{})}
	require.NoError(t, s.EnsureDir("/torch/elastic/store"))
	require.NoError(t, s.EnsureDir("/torch/elastic/store"), "idempotent")
	code, body := do(t, s.mux(), "GET", "/v2/keys/torch/elastic/store", "")
	require.Equal(t, 200, code)
	require.Contains(t, body, `"dir":true`)
	do(t, s.mux(), "PUT", "/v2/keys/file", "value=x")
	require.Error(t, s.EnsureDir("/file/sub"))
}

// A reply that its client does not read is let go after WriteTimeout (the connection closed), instead of being held
// for as long as the client stays connected: a recursive GET of a tree of some MiB, unread for longer than that,
// then read, comes out short.
func TestUnreadReplyLetGo(t *testing.T) {
	s := New(Config{WriteTimeout: 300 * time.Millisecond})
	t.Cleanup(s.Close)
	srv := httptest.NewUnstartedServer((&testServer{s}).mux())
	closed := make(chan struct{}, 1)
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			select {
			case closed <- struct{}{}:
			default:
			}
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	value := strings.Repeat("v", 64<<10)
	for i := range 128 { // 8 MiB of values
		code, body := do(t, srv.Config.Handler, "PUT", fmt.Sprintf("/v2/keys/tree/k%d", i), "value="+value)
		require.Equal(t, 201, code, body)
	}
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_, err = fmt.Fprintf(c, "GET /v2/keys/tree?recursive=true HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	// Read nothing meanwhile: the server's writes fill the socket's buffers and block until the deadline cuts them.
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("the server still holds the unread reply's connection after 20 s (WriteTimeout 300 ms)")
	}
	require.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Second)))
	got, _ := io.ReadAll(c)
	require.Less(t, len(got), 128*len(value), "the whole reply went out to a client that read nothing of it")
}

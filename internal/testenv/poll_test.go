package testenv

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestPickFreePort(t *testing.T) {
	port, err := PickFreePort()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("port %d is not free: %v", port, err)
	}
	l.Close()
	if p := FreePort(t); p <= 0 {
		t.Fatalf("FreePort = %d", p)
	}
}

func TestPoll(t *testing.T) {
	t.Run("holds after a few tries", func(t *testing.T) {
		n := 0
		err := Poll(context.Background(), time.Second, time.Millisecond, func(context.Context) (bool, error) {
			n++
			return n == 3, errors.New("not yet")
		})
		if err != nil || n != 3 {
			t.Fatalf("err %v after %d tries, want nil after 3", err, n)
		}
	})
	t.Run("true ends the wait even with an error", func(t *testing.T) {
		err := Poll(context.Background(), time.Second, time.Millisecond, func(context.Context) (bool, error) {
			return true, errors.New("ignored")
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("timeout names the last error", func(t *testing.T) {
		n := 0
		err := Poll(context.Background(), 30*time.Millisecond, time.Millisecond, func(context.Context) (bool, error) {
			n++
			if n == 1 {
				return false, errors.New("first")
			}
			return false, nil // no news: the last error stays
		})
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "gave up after") ||
			!strings.Contains(err.Error(), "last error: first") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("a try cut short by the deadline keeps the error before it", func(t *testing.T) {
		n := 0
		err := Poll(context.Background(), 30*time.Millisecond, time.Millisecond, func(ctx context.Context) (bool, error) {
			if n++; n == 1 {
				return false, errors.New("503")
			}
			<-ctx.Done()
			return false, ctx.Err()
		})
		if err == nil || !strings.Contains(err.Error(), "last error: 503") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("a done context ends the wait", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := Poll(ctx, time.Minute, time.Millisecond, func(context.Context) (bool, error) { return false, nil })
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v", err)
		}
	})
}

func TestEventually(t *testing.T) {
	n := 0
	Eventually(t, time.Second, "three tries", func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if n != 3 {
		t.Fatalf("%d tries, want 3", n)
	}
}

func TestCheckHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ok" {
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	if err := CheckHTTP(ctx, srv.URL+"/ok", http.StatusOK); err != nil {
		t.Errorf("200 for 200: %v", err)
	}
	if err := CheckHTTP(ctx, srv.URL+"/readyz", 0); err != nil {
		t.Errorf("503 for any status: %v", err)
	}
	if err := CheckHTTP(ctx, srv.URL+"/readyz", http.StatusOK); err == nil || err.Error() != "503 starting\n" {
		t.Errorf("503 for 200: got %v, want the status and body", err)
	}
	if err := PollHTTP(ctx, time.Second, time.Millisecond, srv.URL+"/ok", http.StatusOK); err != nil {
		t.Errorf("PollHTTP: %v", err)
	}
	if err := PollHTTP(ctx, 200*time.Millisecond, time.Millisecond, srv.URL+"/readyz", http.StatusOK); err == nil ||
		!strings.Contains(err.Error(), "last error: 503 starting") {
		t.Errorf("PollHTTP on a 503: got %v", err)
	}
}

// FreePort never hands out a port twice in one process, even when the kernel offers one it just freed.
// Its 2,000 ports are forgotten again at the end: held over -count=4, 8,000 of them left the kernel's picks (even
// ports first) mostly taken, and the fourth run found no fresh one in 100 tries.
func TestFreePortDistinct(t *testing.T) {
	seen := map[int]bool{}
	t.Cleanup(func() {
		given.Lock()
		defer given.Unlock()
		for p := range seen {
			delete(given.ports, p)
		}
	})
	for range 2000 {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}

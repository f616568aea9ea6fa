package testenv

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// eventuallyInterval is how often Eventually and WaitHTTP try again.
const eventuallyInterval = 20 * time.Millisecond

// Poll calls cond every interval until it returns true, and returns nil then;
// when timeout passes or ctx is done first, it returns an error saying how long
// it waited, with ctx's error and the last error cond returned (not one from a
// try the deadline cut short, when an earlier try said more). An error with
// false means "not yet, because...": polling goes on. True ends the wait even
// with an error. cond runs in the caller's goroutine (it may call t.Fatal) and
// gets a context that ends with the wait.
func Poll(ctx context.Context, timeout, interval time.Duration, cond func(ctx context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	start := time.Now()
	var last error
	for {
		// A condition that holds is success, whatever else it says: the error only explains a "not yet".
		ok, err := cond(ctx)
		if ok {
			return nil
		}
		// A try the deadline cut short says less than the one before it.
		if err != nil && (last == nil || ctx.Err() == nil) {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("gave up after %s: %w (last error: %v)", time.Since(start).Round(time.Millisecond), ctx.Err(), last)
			}
			return fmt.Errorf("gave up after %s: %w", time.Since(start).Round(time.Millisecond), ctx.Err())
		case <-tick.C:
		}
	}
}

// Eventually polls cond every eventuallyInterval until it returns nil, and
// fails the test when timeout passes first, naming what it waited for and
// cond's last error.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	var last error
	err := Poll(context.Background(), timeout, eventuallyInterval, func(context.Context) (bool, error) {
		last = cond()
		return last == nil, last
	})
	if err != nil {
		t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, last)
	}
}

// CheckHTTP sends one GET to url (giving up after a second) and returns nil
// when it is answered with status, or with any status when status is 0; else
// the error, or the status and body it got.
func CheckHTTP(ctx context.Context, url string, status int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if status != 0 && resp.StatusCode != status {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%d %s", resp.StatusCode, b)
	}
	return nil
}

// PollHTTP is Poll with CheckHTTP, for code without a test: it returns nil
// once url answers with status (0: any status).
func PollHTTP(ctx context.Context, timeout, interval time.Duration, url string, status int) error {
	return Poll(ctx, timeout, interval, func(ctx context.Context) (bool, error) {
		err := CheckHTTP(ctx, url, status)
		return err == nil, err
	})
}

// WaitHTTP polls url (CheckHTTP) until it answers with status (0: any
// status), and fails the test when p exits first or timeout passes.
func WaitHTTP(t testing.TB, p *Proc, url string, status int, timeout time.Duration) {
	t.Helper()
	waitWhileRunning(t, p, timeout, " to answer "+url, func() error {
		return CheckHTTP(context.Background(), url, status)
	})
}

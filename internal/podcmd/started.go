package podcmd

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// StartedConfig is `rdzv-sidecar started`, the sidecar's postStart hook: it
// returns once the sidecar's own /startz answers, which holds the kubelet's
// sync of the pod, so the trainer starts in the sync right after it.
type StartedConfig struct {
	URL      string // the sidecar's http://127.0.0.1:<health port>/startz
	Timeout  time.Duration
	Interval time.Duration
}

// startedRequestTimeout bounds each GET: the sidecar answers /startz from
// memory, so a slow answer is a wedged sidecar, and the next try says so.
const startedRequestTimeout = time.Second

// Started polls cfg.URL until it answers 200 (nil) or the timeout ends (an
// error with the last answer, which the kubelet puts in the pod's
// FailedPostStartHook Event before it restarts the sidecar).
func Started(ctx context.Context, cfg StartedConfig) error {
	if cfg.Interval <= 0 {
		return fmt.Errorf("--interval must be > 0, got %s", cfg.Interval)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	client := &http.Client{Timeout: startedRequestTimeout}
	for {
		// Not cut off by the timeout: the last answer is the reason to report.
		err := getOK(context.WithoutCancel(ctx), client, cfg.URL)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the sidecar did not start within %s: %w", cfg.Timeout, err)
		case <-time.After(cfg.Interval):
		}
	}
}

func getOK(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

package podcmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/elastic-training/elastic-training/internal/torchview"
)

// ProgressConfig is `rdzv-sidecar progress`: does the torch job train?
type ProgressConfig struct {
	URL string // the serving sidecar's /rendezvous
	// Nodes is the fewest agents the round must have.
	Nodes int
	// Stable is how long the round must have held: torchrun's agents start a
	// new round whenever a worker fails, so a crash-looping trainer never
	// keeps one.
	Stable time.Duration
	// MaxHeartbeatAge: an agent silent for longer is gone (torch's agents
	// keep alive every 5 s and call a node dead after 3 misses).
	MaxHeartbeatAge time.Duration
	Timeout         time.Duration
	Interval        time.Duration
}

// Judge says whether v shows a job that trains, and if not, why.
func (c ProgressConfig) Judge(v torchview.View) (bool, string) {
	round := fmt.Sprintf("round %d of run %s (%s)", v.Round, v.RunID, v.Backend)
	switch {
	case v.Closed:
		return false, round + ": the rendezvous is closed (the job is ending)"
	case !v.Complete:
		return false, fmt.Sprintf("%s is forming (%d waiting to join); the last complete round was %d", round, len(v.Waiting), v.LastCompletedRound)
	case v.WorldSize < c.Nodes:
		return false, fmt.Sprintf("%s has %d nodes, want at least %d", round, v.WorldSize, c.Nodes)
	case v.Ended > 0:
		return false, fmt.Sprintf("%s: %d of its %d agents ended their run (torchrun exited: its workers failed past --max-restarts, or it was stopped)",
			round, v.Ended, v.WorldSize)
	}
	for _, p := range v.Participants {
		if p.LastHeartbeat == nil {
			continue
		}
		if age := v.Now.Sub(*p.LastHeartbeat); age > c.MaxHeartbeatAge {
			return false, fmt.Sprintf("%s: the agent on %s (rank %d) has not kept alive for %s: its trainer exited or restarts",
				round, p.Addr, p.Rank, age.Round(time.Second))
		}
	}
	if held := v.Now.Sub(v.LastCompletedAt); v.Round != v.LastCompletedRound || held < c.Stable {
		return false, fmt.Sprintf("%s formed %s ago with %d nodes; waiting until it has held for %s (a new round means an agent restarted its workers)",
			round, held.Round(time.Second), v.WorldSize, c.Stable)
	}
	return true, fmt.Sprintf("%s: %d nodes, held for %s, every agent alive", round, v.WorldSize, v.Now.Sub(v.LastCompletedAt).Round(time.Second))
}

// Progress polls the serving sidecar until Judge passes (nil) or the timeout
// ends (an error with the last reason). Each new reason is a line on out.
func Progress(ctx context.Context, cfg ProgressConfig, out io.Writer) error {
	if cfg.Nodes < 1 {
		return fmt.Errorf("--nodes must be ≥ 1, got %d", cfg.Nodes)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	fmt.Fprintf(out, "rdzv-sidecar progress: waiting up to %s for a round of ≥ %d nodes that holds for %s at %s\n",
		cfg.Timeout, cfg.Nodes, cfg.Stable, cfg.URL)
	last := ""
	for {
		ok, why := cfg.poll(ctx)
		if why != last {
			fmt.Fprintln(out, why)
			last = why
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no progress within %s: %s", cfg.Timeout, last)
		case <-time.After(cfg.Interval):
		}
	}
}

func (c ProgressConfig) poll(ctx context.Context) (bool, string) {
	// Its own deadline: the last answer before the timeout is the reason to
	// report, not the timeout cutting it off.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL, nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, fmt.Sprintf("the rendezvous does not answer: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return false, fmt.Sprintf("reading %s: %v", c.URL, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return false, e.Error
		}
		return false, fmt.Sprintf("%s: %s", c.URL, resp.Status)
	}
	var v torchview.View
	if err := json.Unmarshal(body, &v); err != nil {
		return false, fmt.Sprintf("%s: %v", c.URL, err)
	}
	return c.Judge(v)
}

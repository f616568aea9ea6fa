package podcmd

import (
	"context"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/time/rate"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/progress"
)

// HangConfig: supervise stops a run whose ranks said their progress and then stopped advancing, all of them
// (docs/hangs.md, "MPI"): a rank that hangs leaves every other waiting for it in its next collective, and mpirun
// cannot tell that from a long step; only the ranks' own word can.
type HangConfig struct {
	// Off: the ranks' progress is not judged.
	Off bool
	// Timeout: no rank advanced for this long is a hang (0: progress's rule, the larger of a minute and ten median
	// step times).
	Timeout time.Duration
	// Every is how often the ranks are judged (0: a second).
	Every time.Duration
}

// hangs follows the progress reports of one run's members (each worker's sidecar puts its pod's ranks at
// constants.ProgressPrefix + its host in the job's etcd, a second apart while they change) and judges them as the
// serving sidecar judges a PyTorch round (progress.Job).
type hangs struct {
	cfg   HangConfig
	mu    sync.Mutex
	job   *progress.Job
	hosts map[string]bool // the run's members: a report of another host is not of this run
	say   func(format string, args ...any)
	bad   *rate.Limiter
	slow  string // the stragglers last said
}

func newHangs(cfg HangConfig, hosts []string, since time.Time, say func(string, ...any)) *hangs {
	if cfg.Every <= 0 {
		cfg.Every = time.Second
	}
	h := &hangs{cfg: cfg, job: progress.NewJob(since), hosts: map[string]bool{}, say: say, bad: rate.NewLimiter(rate.Every(time.Minute), 3)}
	for _, host := range hosts {
		h.hosts[host] = true
	}
	return h
}

// observe takes one change of the progress keys, seen at now.
func (h *hangs) observe(ev *clientv3.Event, now time.Time) {
	host := strings.TrimPrefix(string(ev.Kv.Key), constants.ProgressPrefix)
	if !h.hosts[host] {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if ev.Type == clientv3.EventTypeDelete {
		h.job.Forget(host)
		return
	}
	r, err := progress.ParseReport(ev.Kv.Value)
	if err != nil {
		if h.bad.Allow() {
			h.say("ignoring %s's progress report: %v", host, err)
		}
		return
	}
	h.job.Update(host, r, now)
}

// judge says the verdict at now, and names stragglers when their set changed.
func (h *hangs) judge(now time.Time) progress.Verdict {
	h.mu.Lock()
	defer h.mu.Unlock()
	v := h.job.Judge(now, h.cfg.Timeout)
	if slow := progress.Join(v.Stragglers); slow != h.slow && !v.Hung {
		if h.slow = slow; slow != "" {
			h.say("stragglers (a step time %dx the median of %s or more; not stopped): %s", progress.StragglerFactor, v.StepTime.Round(time.Millisecond), slow)
		}
	}
	return v
}

// watch feeds h the progress keys' changes after revision rev and sends the first hung verdict on hung, until ctx
// ends. A watch that fails (a compacted revision, a lost leader) starts again from the keys as they are.
func (h *hangs) watch(ctx context.Context, cli *clientv3.Client, rev int64, hung chan<- progress.Verdict) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	go func() {
		t := time.NewTicker(h.cfg.Every)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case now := <-t.C:
				if v := h.judge(now); v.Hung {
					hung <- v
					cancel()
					return
				}
			}
		}
	}()
	for wctx.Err() == nil {
		for wr := range cli.Watch(wctx, constants.ProgressPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
			if wr.Err() != nil {
				break
			}
			now := time.Now()
			for _, ev := range wr.Events {
				h.observe(ev, now)
			}
		}
		if wctx.Err() != nil {
			return
		}
		select {
		case <-wctx.Done():
			return
		case <-time.After(time.Second):
		}
		if r, err := progressRevision(wctx, cli); err == nil {
			rev = r // the reports come again within a second while the ranks say anything
		}
	}
}

// progressRevision is the job's etcd revision now: the watch of a run starts after it, so that no report of an
// earlier run's ranks is taken for this one's.
func progressRevision(ctx context.Context, cli *clientv3.Client) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, constants.ProgressPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

package sidecar

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/elastic-training/elastic-training/internal/progress"
	"github.com/elastic-training/elastic-training/internal/rdzv/c10drounds"
	"github.com/elastic-training/elastic-training/internal/torchview"
	"github.com/elastic-training/elastic-training/internal/torchview/jobevents"
)

// HangConfig: a round of the elastic-training backend whose ranks reported progress and then stopped is restarted
// (docs/hangs.md).
type HangConfig struct {
	Enabled bool
	Timeout time.Duration // 0: the larger of a minute and ten median steps (internal/progress)
	Replace ReplaceConfig // a pod blamed for repeated hangs (replace.go)
}

// warner is a recorder of Warning Events (jobevents.Recorder).
type warner interface{ Warning(reason, msg string) }

// rounds is the rounds' hang configuration: each hang a Warning Event on the Job, a log line (the rounds') and a
// count; stragglers an Event when they change.
func (c HangConfig) rounds(events torchview.Recorder, reg prometheus.Registerer) c10drounds.HangConfig {
	hangs := prometheus.NewCounter(prometheus.CounterOpts{Name: "elastic_training_job_hangs_total",
		Help: "Rounds of the elastic-training backend restarted because no rank advanced for the hang timeout."})
	if reg != nil {
		reg.MustRegister(hangs)
	}
	w, _ := events.(warner)
	return c10drounds.HangConfig{Enabled: c.Enabled, Timeout: c.Timeout,
		OnHang: func(run string, round int, v progress.Verdict) {
			hangs.Inc()
			if w != nil {
				w.Warning(jobevents.ReasonHang, hangMessage(run, round, v))
			}
		},
		OnStragglers: func(run string, round int, v progress.Verdict) {
			if w != nil && len(v.Stragglers) > 0 {
				w.Warning(jobevents.ReasonStragglers, stragglersMessage(run, round, v))
			}
		}}
}

// hangMessage is the Event of a hang: what stopped first, and what was done.
func hangMessage(run string, round int, v progress.Verdict) string {
	msg := fmt.Sprintf("Round %d of run %s hung: no rank advanced for %s (timeout %s) after step %d; its workers restart.",
		round, run, v.Idle.Round(time.Second), v.Timeout, v.Step)
	if len(v.Stopped) > 0 {
		msg += " Stopped first: " + v.Stopped[0].String() + "."
	}
	return msg
}

// stragglersMessage is the Event of a round's slow ranks.
func stragglersMessage(run string, round int, v progress.Verdict) string {
	return fmt.Sprintf("Round %d of run %s: ranks slower than the median step of %s (not restarted): %s", round, run,
		v.StepTime.Round(time.Millisecond), progress.Join(v.Stragglers))
}

// chainHang calls f, then g.
func chainHang(f, g func(string, int, progress.Verdict)) func(string, int, progress.Verdict) {
	return func(run string, round int, v progress.Verdict) { f(run, round, v); g(run, round, v) }
}

// tick calls f every d until ctx ends.
func tick(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

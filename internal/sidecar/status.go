package sidecar

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/types"

	"github.com/elastic-training/elastic-training/internal/incluster"
	"github.com/elastic-training/elastic-training/internal/jobstatus"
	"github.com/elastic-training/elastic-training/internal/progress"
	"github.com/elastic-training/elastic-training/internal/rdzv/c10drounds"
)

// statusEvery is how often the Job's status annotations are written when they changed: the status is at most this
// old, and a job costs the API server at most 60/statusEvery patches a minute (12).
const statusEvery = 5 * time.Second

// jobStatus follows the elastic-training backend's rounds for the Job's status annotations (internal/jobstatus).
type jobStatus struct {
	mu       sync.Mutex
	run      string
	state    c10drounds.State
	world    int // of the last complete round
	incident string
	now      func() time.Time
	every    time.Duration // 0: statusEvery
}

// onState takes a run's state (c10drounds' OnState): a new round of another size is an incident.
func (j *jobStatus) onState(run string, s c10drounds.State) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.run, j.state = run, s
	if n := len(s.Round.Participants); s.Round.Number > 0 && n != j.world {
		if j.world > 0 {
			j.incident = jobstatus.IncidentAt(fmt.Sprintf("round %d: world %d -> %d", s.Round.Number, j.world, n), j.now())
		}
		j.world = n
	}
}

// onHang takes a hang found (c10drounds' OnHang).
func (j *jobStatus) onHang(run string, round int, v progress.Verdict) {
	j.mu.Lock()
	defer j.mu.Unlock()
	what := fmt.Sprintf("round %d hung after step %d", round, v.Step)
	if len(v.Stopped) > 0 {
		what += fmt.Sprintf(" (rank %d stopped first)", v.Stopped[0].Rank)
	}
	j.incident = jobstatus.IncidentAt(what, j.now())
}

// status is the job's status, with the rounds' verdict of the current round's progress.
func (j *jobStatus) status(progressOf func(run string) progress.Verdict) (jobstatus.Status, bool) {
	j.mu.Lock()
	run, s, incident := j.run, j.state, j.incident
	j.mu.Unlock()
	if run == "" {
		return jobstatus.Status{}, false
	}
	v := progressOf(run)
	st := jobstatus.Status{World: len(s.Round.Participants), Round: s.Round.Number, Step: v.Step, Total: v.Total,
		StepTime: v.StepTime, Incident: incident}
	switch {
	case s.Closed:
		st.Phase = jobstatus.Closed
	case s.Hung:
		st.Phase = jobstatus.Hung
	case s.Round.Number == 0 || s.Waiting > 0:
		st.Phase = jobstatus.Forming
	case v.Ranks > 0:
		st.Phase = jobstatus.Training
	default:
		st.Phase = jobstatus.Running
	}
	return st, true
}

// writeStatus patches the Job's annotations every statusEvery while they changed, until ctx ends.
func (j *jobStatus) writeStatus(ctx context.Context, progressOf func(run string) progress.Verdict, patch func(context.Context, []byte) error, log *slog.Logger) {
	failed := rate.NewLimiter(rate.Every(time.Minute), 1)
	var written map[string]string
	every := cmp.Or(j.every, statusEvery)
	tick(ctx, every, func() {
		st, ok := j.status(progressOf)
		if !ok {
			return
		}
		a := jobstatus.Annotations(st, j.now())
		if written != nil && !jobstatus.Changed(written, a) {
			return
		}
		pctx, cancel := context.WithTimeout(ctx, every)
		defer cancel()
		if err := patch(pctx, jobstatus.MergePatch(a)); err != nil {
			if failed.Allow() {
				log.Warn("cannot write the job's status on its Job (the job chart's Role allows patching that Job)", "err", err)
			}
			return
		}
		written = a
	})
}

// patchJob is a merge patch of the Job job of the pod's namespace, with the pod's token; nil when no in-cluster
// client can be made (after a warning).
func patchJob(job string, log *slog.Logger) func(context.Context, []byte) error {
	kc, err := incluster.CoreV1()
	if err != nil {
		log.Warn("writing no status on the Job", "job", job, "err", err)
		return nil
	}
	return func(ctx context.Context, body []byte) error {
		_, err := kc.API.Patch(types.MergePatchType).AbsPath("/apis/batch/v1/namespaces", kc.Namespace, "jobs", job).Body(body).DoRaw(ctx)
		return err
	}
}

// jobGauges are the job's figures as metrics, which only the serving sidecar carries: a sum over a job's pods counts
// each once.
type jobGauges struct{ world, round, step, rate prometheus.Gauge }

func newJobGauges(reg prometheus.Registerer) jobGauges {
	g := func(name, help string) prometheus.Gauge {
		m := prometheus.NewGauge(prometheus.GaugeOpts{Name: "elastic_training_job_" + name, Help: help + " (the serving sidecar only)."})
		if reg != nil {
			reg.MustRegister(m)
		}
		return m
	}
	return jobGauges{world: g("world_size", "Nodes in the current round of the elastic-training backend"),
		round: g("round", "The current round's number"),
		step:  g("step", "The least step the current round's ranks said (elastic_training.progress); 0: none"),
		rate:  g("steps_per_second", "Steps per second at the ranks' median step time; 0: unknown")}
}

func (g jobGauges) set(s jobstatus.Status) {
	g.world.Set(float64(s.World))
	g.round.Set(float64(s.Round))
	g.step.Set(float64(s.Step))
	rate := 0.0
	if s.StepTime > 0 {
		rate = float64(time.Second) / float64(s.StepTime)
	}
	g.rate.Set(rate)
}

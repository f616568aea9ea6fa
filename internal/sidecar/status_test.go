package sidecar

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/jobstatus"
	"github.com/elastic-training/elastic-training/internal/progress"
	"github.com/elastic-training/elastic-training/internal/rdzv"
	"github.com/elastic-training/elastic-training/internal/rdzv/c10drounds"
)

// The status follows the rounds: forming, training with the ranks' figures, a scale and a hang as incidents.
func TestJobStatus(t *testing.T) {
	now := time.Date(2026, 12, 6, 23, 0, 0, 0, time.UTC)
	j := &jobStatus{now: func() time.Time { return now }}
	var v progress.Verdict
	of := func(string) progress.Verdict { return v }
	_, ok := j.status(of)
	require.False(t, ok, "no run yet")

	j.onState("r", c10drounds.State{Waiting: 2})
	st, _ := j.status(of)
	require.Equal(t, jobstatus.Forming, st.Phase)
	j.onState("r", c10drounds.State{Round: rdzv.Round{Number: 1, Participants: []string{"a", "b"}}})
	st, _ = j.status(of)
	require.Equal(t, jobstatus.Running, st.Phase, "no progress said yet")
	v = progress.Verdict{Ranks: 2, Step: 10, Total: 100, StepTime: time.Second}
	st, _ = j.status(of)
	require.Equal(t, jobstatus.Status{Phase: jobstatus.Training, World: 2, Round: 1, Step: 10, Total: 100, StepTime: time.Second}, st)

	j.onState("r", c10drounds.State{Round: rdzv.Round{Number: 2, Participants: []string{"a", "b", "c"}}})
	st, _ = j.status(of)
	require.Equal(t, "23:00:00Z round 2: world 2 -> 3", st.Incident)
	j.onHang("r", 2, progress.Verdict{Step: 40, Stopped: []progress.Blame{{Rank: 1}}})
	j.onState("r", c10drounds.State{Round: rdzv.Round{Number: 2, Participants: []string{"a", "b", "c"}}, Waiting: 1, Hung: true})
	st, _ = j.status(of)
	require.Equal(t, jobstatus.Hung, st.Phase)
	require.Equal(t, "23:00:00Z round 2 hung after step 40 (rank 1 stopped first)", st.Incident)
}

// The writer patches the Job when the status changed, not when only its time did.
func TestWriteStatusPatchesOnChange(t *testing.T) {
	j := &jobStatus{now: time.Now, every: 20 * time.Millisecond}
	j.onState("r", c10drounds.State{Round: rdzv.Round{Number: 1, Participants: []string{"a"}}})
	patches := make(chan map[string]string, 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	patch := func(_ context.Context, body []byte) error {
		var p struct {
			Metadata struct{ Annotations map[string]string } `json:"metadata"`
		}
		require.NoError(t, json.Unmarshal(body, &p))
		patches <- p.Metadata.Annotations
		return nil
	}
	go j.writeStatus(ctx, func(string) progress.Verdict { return progress.Verdict{} }, patch, slog.New(slog.DiscardHandler))
	first := <-patches
	require.Equal(t, "Running", first[jobstatus.Phase])
	select {
	case p := <-patches:
		t.Fatalf("patched again with nothing changed: %v", p)
	case <-time.After(200 * time.Millisecond): // ten periods
	}
}

func TestJobGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := newJobGauges(reg)
	g.set(jobstatus.Status{World: 3, Round: 4, Step: 120, StepTime: 250 * time.Millisecond})
	require.Equal(t, 3.0, testutil.ToFloat64(g.world))
	require.Equal(t, 4.0, testutil.ToFloat64(g.round))
	require.Equal(t, 120.0, testutil.ToFloat64(g.step))
	require.Equal(t, 4.0, testutil.ToFloat64(g.rate))
}

package torchview

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// TestRunsBounded: rounds of many run ids cost the view at most maxRuns runs, the run /rendezvous shows is never
// the one forgotten, and a round is reported once.
func TestRunsBounded(t *testing.T) {
	var logs bytes.Buffer
	l := New(Config{Log: slog.New(slog.NewTextHandler(&logs, nil))})
	l.Round(Round{Backend: "c10d", RunID: "shown", Round: "0", Participants: -1}, nil)
	for i := range 10 * maxRuns {
		l.SetState("c10d", fmt.Sprintf("run-%d", i), Current{})
	}
	require.Len(t, l.runs, maxRuns)
	require.Contains(t, l.runs, runKey{"c10d", "shown"})
	for range 3 {
		l.Round(Round{Backend: "c10d", RunID: "r", Round: "1", Participants: -1}, nil)
	}
	require.Equal(t, 1, strings.Count(logs.String(), "round 1 of run r complete"))
}

// TestViewNeverEmpty: a view that JSON cannot hold (a forged state's time
// past year 9999) is a 500 with the reason, not a 200 without a body.
func TestViewNeverEmpty(t *testing.T) {
	rec := httptest.NewRecorder()
	writeJSON(rec, 200, View{Now: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
	require.Equal(t, 500, rec.Code)
	require.Contains(t, rec.Body.String(), "cannot be shown")
}

type countRecorder struct{ n int }

func (c *countRecorder) Record(string) { c.n++ }

// TestForgedRoundsBounded: 2,000 rounds written at once (anyone who may write
// the store can) cost at most reportBurst log lines and Events; all are
// counted, and the next report says how many went unreported.
func TestForgedRoundsBounded(t *testing.T) {
	var logs bytes.Buffer
	rec := &countRecorder{}
	reg := prometheus.NewRegistry()
	now := time.Date(2026, 11, 25, 8, 0, 0, 0, time.UTC)
	l := New(Config{Log: slog.New(slog.NewTextHandler(&logs, nil)), Events: rec, Metrics: reg,
		Now: func() time.Time { return now }})
	for i := range 2000 {
		l.Round(Round{Backend: "c10d", RunID: "forged", Round: strconv.Itoa(i), Participants: -1}, nil)
	}
	lines := strings.Count(logs.String(), "complete")
	require.Equal(t, reportBurst, lines)
	require.Equal(t, lines, rec.n)
	require.Equal(t, 2000.0, testutil.ToFloat64(l.rounds.WithLabelValues("c10d")))
	require.InDelta(t, float64(2000-lines), testutil.ToFloat64(l.suppressed), 0)
	now = now.Add(reportEvery)
	l.Round(Round{Backend: "c10d", RunID: "forged", Round: "5000", Participants: -1}, nil)
	require.Contains(t, logs.String(), "unreported_before=")
}

// The table NOTES shows through kubectl get --raw: one line per agent by node rank, its pod's name.
func TestViewTable(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 10, 0, time.UTC)
	hb := now.Add(-1500 * time.Millisecond)
	v := View{Backend: "c10d", RunID: "r1", Round: 3, Complete: true, WorldSize: 2, Now: now,
		Participants: []ViewNode{
			{Node: "job-worker-1.job.ns.svc.cluster.local_7_0", Addr: "job-worker-1.job.ns.svc.cluster.local", Rank: 1, LastHeartbeat: &hb},
			{Node: "job-worker-0.job.ns.svc.cluster.local_9_0", Addr: "job-worker-0.job.ns.svc.cluster.local", Rank: 0},
		},
		Waiting: []string{"job-worker-2.job.ns.svc.cluster.local_5_0"}}
	want := "run r1, round 3 (complete), 2 nodes (WORLD_SIZE = nodes x each pod's processes), backend c10d\n" +
		"NODE_RANK POD                                              KEEP-ALIVE\n" +
		"0         job-worker-0                                     -\n" +
		"1         job-worker-1                                     1.5s ago\n" +
		"waiting for the next round: job-worker-2.job.ns.svc.cluster.local_5_0\n"
	if got := v.Table(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

// TestElasticTrainingStateView: the elastic-training backend's rounds are logged and recorded as
// torch's are, with their nodes and processes from the membership, and
// /rendezvous shows the run as the sidecar decided it: complete while no
// node waits.
func TestElasticTrainingStateView(t *testing.T) {
	var logs bytes.Buffer
	var events []string
	now := time.Date(2026, 11, 28, 6, 0, 0, 0, time.UTC)
	l := New(Config{Log: slog.New(slog.NewTextHandler(&logs, nil)), Metrics: prometheus.NewRegistry(),
		Now: func() time.Time { return now }, Events: recorderFunc(func(m string) { events = append(events, m) }),
		Slots: func(string) (int, bool) { return 2, true }})
	view := func() View {
		rec := httptest.NewRecorder()
		l.ServeHTTP(rec, httptest.NewRequest("GET", "/rendezvous", nil))
		require.Equal(t, 200, rec.Code, rec.Body.String())
		var v View
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &v))
		return v
	}
	hosts := []string{"job-worker-0.job.ns.svc", "job-worker-1.job.ns.svc"}
	l.ElasticTrainingState("r", 0, nil, 1, 0, false) // agents ready, no round yet: nothing to report
	require.Empty(t, events)
	l.ElasticTrainingState("r", 1, hosts, 0, 0, false)
	l.ElasticTrainingState("r", 1, hosts, 0, 0, false) // the same round again: reported once
	require.Equal(t, []string{"Round 1 of run r: 2 nodes, 4 processes (job-worker-0, job-worker-1)"}, events)
	require.Contains(t, logs.String(), `msg="torch rendezvous round 1 of run r complete: 2 nodes" backend=elastic-training`)
	v := view()
	require.Equal(t, View{Backend: "elastic-training", RunID: "r", Round: 1, Complete: true, WorldSize: 2,
		Participants:       []ViewNode{{Node: hosts[0], Addr: hosts[0], Rank: 0}, {Node: hosts[1], Addr: hosts[1], Rank: 1}},
		LastCompletedRound: 1, LastCompletedAt: now, Now: now}, v)

	l.ElasticTrainingState("r", 1, hosts, 1, 0, false) // a node waits: the round's agents restart
	v = view()
	require.False(t, v.Complete)
	require.Equal(t, 1, v.WaitingNodes)
	l.ElasticTrainingState("r", 1, hosts, 0, 2, false) // both agents ended their run: the round stays, nobody trains in it
	v = view()
	require.True(t, v.Complete)
	require.Equal(t, 2, v.Ended)
	l.ElasticTrainingState("r", 1, hosts, 0, 0, true)
	require.True(t, view().Closed)
}

type recorderFunc func(string)

func (f recorderFunc) Record(m string) { f(m) }

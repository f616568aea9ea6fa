package torchview

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func TestRoundFromEvent(t *testing.T) {
	tests := map[string]struct {
		key, value string
		want       Round
		ok         bool
	}{
		"etcd backend final state": {
			key:   "/torchelastic/p2p/run_job-1/rdzv/active_version",
			value: `{"status": "final", "version": "3", "participants": [0, 1, 2], "keep_alives": [], "num_workers_waiting": 0}`,
			want:  Round{Backend: "etcd", RunID: "job-1", Round: "3", Participants: 3}, ok: true,
		},
		"etcd backend joinable state is not a round": {
			key:   "/torchelastic/p2p/run_job-1/rdzv/active_version",
			value: `{"status": "joinable", "version": "3", "participants": [0]}`,
		},
		"etcd backend garbage": {key: "/x/run_a/rdzv/active_version", value: `{`},
		"etcd-v2 backend MASTER_ADDR": {
			key:   "/torch/elastic/store/" + b64("torch.rendezvous.my.run.id.2/MASTER_ADDR"),
			value: b64("worker-0.job.ns.svc"),
			want:  Round{Backend: "etcd-v2", RunID: "my.run.id", Round: "2", Participants: -1, Master: "worker-0.job.ns.svc"}, ok: true,
		},
		"etcd-v2 other store key": {key: "/torch/elastic/store/" + b64("torch.rendezvous.r.0/MASTER_PORT"), value: b64("1")},
		"etcd-v2 bad base64":      {key: "/torch/elastic/store/%%%", value: ""},
		"unrelated key":           {key: "/k", value: "v"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := roundFromEvent(tt.key, tt.value)
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v", ok, tt.ok)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("roundFromEvent (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRoundFromC10dKey(t *testing.T) {
	got, ok := roundFromStoreKey("c10d", "torch.rendezvous.my.run.4/MASTER_ADDR", "w-0.job.ns.svc")
	if !ok {
		t.Fatal("MASTER_ADDR of a round not recognised")
	}
	if diff := cmp.Diff(Round{Backend: "c10d", RunID: "my.run", Round: "4", Participants: -1, Master: "w-0.job.ns.svc"}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for _, key := range []string{"torch.rendezvous.r.0/MASTER_PORT", "torch.rendezvous.r", "other/MASTER_ADDR", "torch.rendezvous.norounddot/MASTER_ADDR"} {
		if _, ok := roundFromStoreKey("c10d", key, ""); ok {
			t.Errorf("%q taken for a round", key)
		}
	}
}

// TestRoundView: a round completed on c10d is logged with torch's world size
// and nodes, read from torch's own pickle of the state (written by torch 2.14,
// internal/torchbackends/torchstate/testdata), and /rendezvous serves the same state.
func TestRoundView(t *testing.T) {
	raw, err := os.ReadFile("../torchbackends/torchstate/testdata/torch-2.14.pickle")
	require.NoError(t, err)
	var logs bytes.Buffer
	now := time.Date(2026, 11, 24, 17, 0, 10, 0, time.UTC)
	l := New(Config{Log: slog.New(slog.NewTextHandler(&logs, nil)), Metrics: prometheus.NewRegistry(),
		Now: func() time.Time { return now }})

	get := func() (int, string) {
		rec := httptest.NewRecorder()
		l.ServeHTTP(rec, httptest.NewRequest("GET", "/rendezvous", nil))
		return rec.Code, rec.Body.String()
	}
	code, body := get()
	require.Equal(t, 404, code)
	require.Contains(t, body, "no torch rendezvous round has completed")

	// torch's agents keep the state with COMPARE_SET, then rank 0 publishes
	// the round's MASTER_ADDR; another run's state is not this one's.
	l.C10dWrite("/torch.rendezvous.job-1", []byte(base64.StdEncoding.EncodeToString(raw)))
	l.C10dWrite("/torch.rendezvous.job-2", []byte("garbage"))
	l.C10dWrite("/torch.rendezvous.job-1.3/MASTER_ADDR", []byte("job-worker-2.job.default.svc"))
	require.Contains(t, logs.String(), `msg="torch rendezvous round 3 of run job-1 complete: 3 nodes" backend=c10d run_id=job-1 round=3 world_size=3 nodes=job-worker-2.job.default.svc,job-worker-0.job.default.svc,job-worker-1.job.default.svc master=job-worker-2.job.default.svc`)

	code, body = get()
	require.Equal(t, 200, code)
	var v View
	require.NoError(t, json.Unmarshal([]byte(body), &v))
	hb := func(s int) *time.Time { x := time.Date(2026, 11, 24, 17, 0, s, 250_000_000, time.UTC); return &x }
	want := View{Backend: "c10d", RunID: "job-1", Round: 3, Complete: true, WorldSize: 3,
		Participants: []ViewNode{
			{Node: "job-worker-2.job.default.svc_42_0", Addr: "job-worker-2.job.default.svc", Rank: 0, LastHeartbeat: hb(2)},
			{Node: "job-worker-0.job.default.svc_40_0", Addr: "job-worker-0.job.default.svc", Rank: 1, LastHeartbeat: hb(0)},
			{Node: "job-worker-1.job.default.svc_41_0", Addr: "job-worker-1.job.default.svc", Rank: 2, LastHeartbeat: hb(1)},
		},
		Waiting:            []string{"job-worker-3.job.default.svc_43_0"},
		LastCompletedRound: 3, LastCompletedAt: now, Now: now,
	}
	if d := cmp.Diff(want, v); d != "" {
		t.Fatalf("/rendezvous (-want +got):\n%s", d)
	}

	// A state that cannot be read is a 500 with the reason.
	l.C10dWrite("/torch.rendezvous.job-1", []byte("garbage"))
	code, body = get()
	require.Equal(t, 500, code)
	require.Contains(t, body, "not base64")
}

// TestV2State: the etcd-v2 backend keeps its state under a v2 key; the
// round read from it has torch's world size.
func TestV2State(t *testing.T) {
	raw, err := os.ReadFile("../torchbackends/torchstate/testdata/torch-2.14.pickle")
	require.NoError(t, err)
	var logs bytes.Buffer
	l := New(Config{Log: slog.New(slog.NewTextHandler(&logs, nil))})
	l.V2Write("/torch/elastic/rendezvous/job-1", base64.StdEncoding.EncodeToString(raw))
	l.V2Write("/torch/elastic/store/"+b64("torch.rendezvous.job-1.3/MASTER_ADDR"), b64("job-worker-2.job.default.svc"))
	require.Contains(t, logs.String(), `backend=etcd-v2 run_id=job-1 round=3 world_size=3`)
	v, ok, err := l.view()
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 3, v.WorldSize)
}

// TestRunsBounded: a store written under many run ids costs the view at most
// maxRuns runs, and the run /rendezvous shows is never the one forgotten.
func TestRunsBounded(t *testing.T) {
	l := New(Config{})
	l.C10dWrite("/torch.rendezvous.shown.0/MASTER_ADDR", []byte("w-0"))
	for i := range 10 * maxRuns {
		l.C10dWrite(fmt.Sprintf("/torch.rendezvous.run-%d", i), []byte("x"))
	}
	require.Len(t, l.runs, maxRuns)
	require.Contains(t, l.runs, runKey{"c10d", "shown"})
	// Their states, together, at most maxStateBytes (and the newest kept, whatever its size).
	big := make([]byte, 8<<20)
	for i := range maxRuns {
		l.C10dWrite(fmt.Sprintf("/torch.rendezvous.big-%d", i), big)
		require.LessOrEqual(t, l.stateBytesLocked(), maxStateBytes)
		require.Contains(t, l.runs, runKey{"c10d", fmt.Sprintf("big-%d", i)})
	}
	require.Contains(t, l.runs, runKey{"c10d", "shown"})
	// A round logged once is not logged again.
	var logs bytes.Buffer
	l = New(Config{Log: slog.New(slog.NewTextHandler(&logs, nil))})
	for range 3 {
		l.C10dWrite("/torch.rendezvous.r.1/MASTER_ADDR", []byte("w-0"))
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
		l.C10dWrite(fmt.Sprintf("/torch.rendezvous.forged.%d/MASTER_ADDR", i), []byte("x"))
	}
	lines := strings.Count(logs.String(), "complete")
	require.Equal(t, reportBurst, lines)
	require.Equal(t, lines, rec.n)
	require.Equal(t, 2000.0, testutil.ToFloat64(l.rounds.WithLabelValues("c10d")))
	require.InDelta(t, float64(2000-lines), testutil.ToFloat64(l.suppressed), 0)
	now = now.Add(reportEvery)
	l.C10dWrite("/torch.rendezvous.forged.5000/MASTER_ADDR", []byte("x"))
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

type msgRecorder struct{ msgs []string }

func (m *msgRecorder) Record(msg string) { m.msgs = append(m.msgs, msg) }

// TestRoundEventProcesses: the round's Event says its nodes and, where every
// node is a member whose slots are known, the processes torchrun starts on
// them (WORLD_SIZE), as kubectl describe shows it.
func TestRoundEventProcesses(t *testing.T) {
	raw, err := os.ReadFile("../torchbackends/torchstate/testdata/torch-2.14.pickle")
	require.NoError(t, err)
	state := []byte(base64.StdEncoding.EncodeToString(raw))
	for name, tc := range map[string]struct {
		slots map[string]int
		want  string
	}{
		"every node known": {map[string]int{"job-worker-0.job.default.svc": 8, "job-worker-1.job.default.svc": 8, "job-worker-2.job.default.svc": 4},
			"Round 3 of run job-1: 3 nodes, 20 processes (job-worker-2, job-worker-0, job-worker-1)"},
		"one node not a member": {map[string]int{"job-worker-0.job.default.svc": 8, "job-worker-1.job.default.svc": 8},
			"Round 3 of run job-1: 3 nodes (job-worker-2, job-worker-0, job-worker-1)"},
		"no membership": {nil, "Round 3 of run job-1: 3 nodes (job-worker-2, job-worker-0, job-worker-1)"},
	} {
		t.Run(name, func(t *testing.T) {
			rec := &msgRecorder{}
			cfg := Config{Events: rec, Metrics: prometheus.NewRegistry()}
			if tc.slots != nil {
				cfg.Slots = func(h string) (int, bool) { n, ok := tc.slots[h]; return n, ok }
			}
			l := New(cfg)
			l.C10dWrite("/torch.rendezvous.job-1", state)
			l.C10dWrite("/torch.rendezvous.job-1.3/MASTER_ADDR", []byte("job-worker-2.job.default.svc"))
			require.Equal(t, []string{tc.want}, rec.msgs)
		})
	}
}

// TestOwnStateView: the elastic-training backend's rounds are logged and recorded as
// torch's are, with their nodes and processes from the membership, and
// /rendezvous shows the run as the sidecar decided it: complete while no
// node waits.
func TestOwnStateView(t *testing.T) {
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
	l.OwnState("r", 0, nil, 1, 0, false) // agents ready, no round yet: nothing to report
	require.Empty(t, events)
	l.OwnState("r", 1, hosts, 0, 0, false)
	l.OwnState("r", 1, hosts, 0, 0, false) // the same round again: reported once
	require.Equal(t, []string{"Round 1 of run r: 2 nodes, 4 processes (job-worker-0, job-worker-1)"}, events)
	require.Contains(t, logs.String(), `msg="torch rendezvous round 1 of run r complete: 2 nodes" backend=elastic-training`)
	v := view()
	require.Equal(t, View{Backend: "elastic-training", RunID: "r", Round: 1, Complete: true, WorldSize: 2,
		Participants:       []ViewNode{{Node: hosts[0], Addr: hosts[0], Rank: 0}, {Node: hosts[1], Addr: hosts[1], Rank: 1}},
		LastCompletedRound: 1, LastCompletedAt: now, Now: now}, v)

	l.OwnState("r", 1, hosts, 1, 0, false) // a node waits: the round's agents restart
	v = view()
	require.False(t, v.Complete)
	require.Equal(t, 1, v.WaitingNodes)
	l.OwnState("r", 1, hosts, 0, 2, false) // both agents ended their run: the round stays, nobody trains in it
	v = view()
	require.True(t, v.Complete)
	require.Equal(t, 2, v.Ended)
	l.OwnState("r", 1, hosts, 0, 0, true)
	require.True(t, view().Closed)
}

type recorderFunc func(string)

func (f recorderFunc) Record(m string) { f(m) }

package torchrounds

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/torchview"
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// Round and ViewNode are the view's, as these tests name them.
type (
	Round    = torchview.Round
	ViewNode = torchview.ViewNode
)

// follow is a Follower telling a real view, and a GET /rendezvous of that view.
func follow(cfg torchview.Config) (*Follower, func() (int, string)) {
	view := torchview.New(cfg)
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		view.ServeHTTP(rec, httptest.NewRequest("GET", "/rendezvous", nil))
		return rec.Code, rec.Body.String()
	}
	return New(view), get
}

type msgRecorder struct{ msgs []string }

func (m *msgRecorder) Record(msg string) { m.msgs = append(m.msgs, msg) }

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
	raw, err := os.ReadFile("../torchstate/testdata/torch-2.14.pickle")
	require.NoError(t, err)
	var logs bytes.Buffer
	now := time.Date(2026, 11, 24, 17, 0, 10, 0, time.UTC)
	l, get := follow(torchview.Config{Log: slog.New(slog.NewTextHandler(&logs, nil)), Metrics: prometheus.NewRegistry(),
		Now: func() time.Time { return now }})
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
	var v torchview.View
	require.NoError(t, json.Unmarshal([]byte(body), &v))
	hb := func(s int) *time.Time { x := time.Date(2026, 11, 24, 17, 0, s, 250_000_000, time.UTC); return &x }
	want := torchview.View{Backend: "c10d", RunID: "job-1", Round: 3, Complete: true, WorldSize: 3,
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
	raw, err := os.ReadFile("../torchstate/testdata/torch-2.14.pickle")
	require.NoError(t, err)
	var logs bytes.Buffer
	l, get := follow(torchview.Config{Log: slog.New(slog.NewTextHandler(&logs, nil))})
	l.V2Write("/torch/elastic/rendezvous/job-1", base64.StdEncoding.EncodeToString(raw))
	l.V2Write("/torch/elastic/store/"+b64("torch.rendezvous.job-1.3/MASTER_ADDR"), b64("job-worker-2.job.default.svc"))
	require.Contains(t, logs.String(), `backend=etcd-v2 run_id=job-1 round=3 world_size=3`)
	code, body := get()
	require.Equal(t, 200, code, body)
	var v torchview.View
	require.NoError(t, json.Unmarshal([]byte(body), &v))
	require.Equal(t, 3, v.WorldSize)
}

// TestRunsBounded: a store written under many run ids costs the Follower at most maxRuns states, of at most
// maxStateBytes together (the newest kept, whatever its size); the run of the last round reported is never the one
// forgotten, and a state forgotten is gone from the view too.
func TestRunsBounded(t *testing.T) {
	l, get := follow(torchview.Config{})
	l.C10dWrite("/torch.rendezvous.shown", []byte("x"))
	l.C10dWrite("/torch.rendezvous.shown.0/MASTER_ADDR", []byte("w-0"))
	for i := range 10 * maxRuns {
		l.C10dWrite(fmt.Sprintf("/torch.rendezvous.run-%d", i), []byte("x"))
	}
	require.Len(t, l.runs, maxRuns)
	require.Contains(t, l.runs, runKey{"c10d", "shown"})
	big := make([]byte, 8<<20)
	for i := range maxRuns {
		l.C10dWrite(fmt.Sprintf("/torch.rendezvous.big-%d", i), big)
		require.LessOrEqual(t, l.stateBytesLocked(), maxStateBytes)
		require.Contains(t, l.runs, runKey{"c10d", fmt.Sprintf("big-%d", i)})
	}
	require.Contains(t, l.runs, runKey{"c10d", "shown"})
	// A forgotten state holds nothing, though the view may hold the run.
	gone := &pickled{f: l, state: []byte("x"), seq: 1} // the oldest
	l.runs[runKey{"c10d", "gone"}] = gone
	l.shown = runKey{"c10d", "shown"}
	for i := range maxRuns {
		l.C10dWrite(fmt.Sprintf("/torch.rendezvous.more-%d", i), []byte("x"))
	}
	require.Nil(t, gone.state)
	_, ok, err := gone.Current()
	require.False(t, ok)
	require.NoError(t, err)
	code, _ := get()
	require.Equal(t, 500, code, "the shown run's state is the garbage written: still decoded")
}

// TestRoundEventProcesses: the round's Event says its nodes and, where every
// node is a member whose slots are known, the processes torchrun starts on
// them (WORLD_SIZE), as kubectl describe shows it.
func TestRoundEventProcesses(t *testing.T) {
	raw, err := os.ReadFile("../torchstate/testdata/torch-2.14.pickle")
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
			cfg := torchview.Config{Events: rec, Metrics: prometheus.NewRegistry()}
			if tc.slots != nil {
				cfg.Slots = func(h string) (int, bool) { n, ok := tc.slots[h]; return n, ok }
			}
			l, _ := follow(cfg)
			l.C10dWrite("/torch.rendezvous.job-1", state)
			l.C10dWrite("/torch.rendezvous.job-1.3/MASTER_ADDR", []byte("job-worker-2.job.default.svc"))
			require.Equal(t, []string{tc.want}, rec.msgs)
		})
	}
}

package sidecar

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
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
// internal/torchstate/testdata), and /rendezvous serves the same state.
func TestRoundView(t *testing.T) {
	raw, err := os.ReadFile("../torchstate/testdata/torch-2.14.pickle")
	require.NoError(t, err)
	var logs bytes.Buffer
	l := newRoundLogger(slog.New(slog.NewTextHandler(&logs, nil)), newMetrics(prometheus.NewRegistry()))
	now := time.Date(2026, 11, 24, 17, 0, 10, 0, time.UTC)
	l.now = func() time.Time { return now }

	get := func() (int, string) {
		rec := httptest.NewRecorder()
		l.serveView(rec, httptest.NewRequest("GET", "/rendezvous", nil))
		return rec.Code, rec.Body.String()
	}
	code, body := get()
	require.Equal(t, 404, code)
	require.Contains(t, body, "no torch rendezvous round has completed")

	l.state = func(backend, runID string) ([]byte, bool) {
		if backend != "c10d" || runID != "job-1" {
			return nil, false
		}
		return []byte(base64.StdEncoding.EncodeToString(raw)), true
	}
	l.observeC10d("/torch.rendezvous.job-1.3/MASTER_ADDR", []byte("job-worker-2.job.default.svc"))
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
	l.state = func(string, string) ([]byte, bool) { return []byte("garbage"), true }
	code, body = get()
	require.Equal(t, 500, code)
	require.Contains(t, body, "not base64")
}

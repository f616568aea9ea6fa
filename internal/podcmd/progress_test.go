package podcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/torchview"
)

func TestProgressJudge(t *testing.T) {
	now := time.Date(2026, 11, 24, 18, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) *time.Time { x := now.Add(-d); return &x }
	healthy := func() torchview.View {
		return torchview.View{Backend: "c10d", RunID: "job", Round: 4, Complete: true, WorldSize: 2,
			Participants:       []torchview.ViewNode{{Addr: "w-0", Rank: 0, LastHeartbeat: ago(3 * time.Second)}, {Addr: "w-1", Rank: 1, LastHeartbeat: ago(4 * time.Second)}},
			LastCompletedRound: 4, LastCompletedAt: now.Add(-time.Minute), Now: now}
	}
	cfg := ProgressConfig{Nodes: 2, Stable: 30 * time.Second, MaxHeartbeatAge: 30 * time.Second}
	for name, c := range map[string]struct {
		edit func(*torchview.View)
		ok   bool
		want string
	}{
		"healthy":           {func(*torchview.View) {}, true, "round 4 of run job (c10d): 2 nodes, held for 1m0s, every agent alive"},
		"legacy etcd":       {func(v *torchview.View) { v.Backend, v.Participants = "etcd", nil }, true, "2 nodes, held for 1m0s"},
		"too few nodes":     {func(v *torchview.View) { v.WorldSize = 1 }, false, "has 1 nodes, want at least 2"},
		"forming":           {func(v *torchview.View) { v.Round, v.Complete, v.Waiting = 5, false, []string{"w-2"} }, false, "round 5 of run job (c10d) is forming (1 waiting to join); the last complete round was 4"},
		"restarted workers": {func(v *torchview.View) { v.LastCompletedAt = now.Add(-5 * time.Second) }, false, "formed 5s ago with 2 nodes; waiting until it has held for 30s"},
		"agent gone":        {func(v *torchview.View) { v.Participants[1].LastHeartbeat = ago(2 * time.Minute) }, false, "the agent on w-1 (rank 1) has not kept alive for 2m0s"},
		"closed":            {func(v *torchview.View) { v.Closed = true }, false, "the rendezvous is closed"},
		"own, agents ended": {func(v *torchview.View) { v.Backend, v.Ended = "elastic-training", 2 }, false, "round 4 of run job (elastic-training): 2 of its 2 agents ended their run"},
	} {
		t.Run(name, func(t *testing.T) {
			v := healthy()
			c.edit(&v)
			ok, why := cfg.Judge(v)
			require.Equal(t, c.ok, ok, why)
			require.Contains(t, why, c.want)
		})
	}
}

// TestProgress polls a /rendezvous that shows a round held long enough only
// from the third answer on; and times out, with the reason, on one that never does.
func TestProgress(t *testing.T) {
	now := time.Now().UTC()
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls++
		if calls == 1 {
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error":"no torch rendezvous round has completed on this sidecar yet"}`))
			return
		}
		held := time.Duration(calls-2) * time.Minute
		json.NewEncoder(w).Encode(torchview.View{Backend: "c10d", RunID: "r", Round: 1, Complete: true, WorldSize: 1,
			LastCompletedRound: 1, LastCompletedAt: now.Add(-held), Now: now})
	}))
	defer srv.Close()
	cfg := ProgressConfig{URL: srv.URL, Nodes: 1, Stable: 30 * time.Second, MaxHeartbeatAge: time.Minute, Timeout: time.Minute, Interval: time.Millisecond}
	var out bytes.Buffer
	require.NoError(t, Progress(context.Background(), cfg, &out))
	require.Contains(t, out.String(), "no torch rendezvous round has completed")
	require.Contains(t, out.String(), "formed 0s ago")
	require.Contains(t, out.String(), "held for 1m0s, every agent alive")
	require.Equal(t, 3, calls)

	cfg.Nodes, cfg.Timeout = 2, 50*time.Millisecond
	err := Progress(context.Background(), cfg, &out)
	require.ErrorContains(t, err, "no progress within 50ms: round 1 of run r (c10d) has 1 nodes, want at least 2")
}

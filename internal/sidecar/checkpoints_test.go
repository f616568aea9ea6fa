package sidecar

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/testenv/etcdtest"
	"github.com/elastic-training/elastic-training/internal/torchview/jobevents"
)

type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Warning(reason, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, reason+": "+msg)
}

func (w *warnings) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// Each incident a holder writes becomes one Warning Event, with its message; what does not parse (any pod of the
// job may write the store) and a pod's incident going with its lease make none.
func TestWatchIncidents(t *testing.T) {
	cli := etcdtest.Embedded(t)
	w := &warnings{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); watchIncidents(ctx, cli, w, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() { cancel(); <-done })
	key := constants.CheckpointIncidentsPrefix + "w-1.job.ns.svc.cluster.local"
	incident := func(step int) string {
		return fmt.Sprintf(`{"kind":"save","host":"w-1.job.ns.svc.cluster.local","step":%d,"rank":3,"need":1073741824,"free":1048576,"memory":2147483648}`, step)
	}
	put := func(v string) {
		_, err := cli.Put(ctx, key, v)
		require.NoError(t, err)
	}
	// Until the watch runs (it starts from the store's revision when it is made).
	testenv.Eventually(t, 5*time.Second, "the first Warning", func() error {
		put(incident(12))
		if len(w.list()) == 0 {
			return fmt.Errorf("none yet")
		}
		return nil
	})
	for _, v := range []string{`not json`, `{"kind":"save","step":1,"rank":0,"need":0,"free":0}`, incident(13)} {
		put(v)
	}
	_, err := cli.Delete(ctx, key)
	require.NoError(t, err)
	want := jobevents.ReasonCheckpointDoesNotFit + ": Rank 3 (pod w-1.job.ns.svc.cluster.local) could not save step 13 in memory: it needs 1Gi, 1Mi of 2Gi of checkpoint.memory is free."
	testenv.Eventually(t, 5*time.Second, "one Warning more", func() error {
		var got []string // after the step-12 ones the wait above put
		for _, m := range w.list() {
			if !strings.Contains(m, "save step 12 ") {
				got = append(got, m)
			}
		}
		if len(got) != 1 || !strings.HasPrefix(got[0], want) {
			return fmt.Errorf("warnings %q", got)
		}
		return nil
	})
}

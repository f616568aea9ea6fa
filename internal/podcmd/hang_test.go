package podcmd

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/progress"
)

// What supervise makes of the workers' progress keys: only the run's members count, a deleted key forgets its
// ranks, a report that does not parse is said (a bounded number of times) and changes nothing, stragglers are said
// once per change of their set, and a run whose ranks all stopped is hung, naming the frozen one.
func TestHangsJudgeTheRunsMembers(t *testing.T) {
	t0 := time.Now()
	var said []string
	h := newHangs(HangConfig{Timeout: 10 * time.Second}, []string{"w-0", "w-1"}, t0, func(f string, a ...any) { said = append(said, fmt.Sprintf(f, a...)) })
	put := func(host string, at time.Duration, ranks ...progress.RankReport) {
		h.observe(&clientv3.Event{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte(constants.ProgressPrefix + host),
			Value: progress.Report{Ranks: ranks}.Encode()}}, t0.Add(at))
	}
	// Nothing said: never hung, whatever the time.
	require.False(t, h.judge(t0.Add(time.Hour)).Hung)

	put("w-0", time.Second, progress.RankReport{Rank: 0, Step: 5, StepMs: 100})
	put("w-1", time.Second, progress.RankReport{Rank: 1, Step: 5, StepMs: 400})
	put("w-9", time.Second, progress.RankReport{Rank: 7, Step: 1}) // not a member of this run
	v := h.judge(t0.Add(2 * time.Second))
	require.Equal(t, 2, v.Ranks)
	require.Equal(t, []string{"stragglers (a step time 2x the median of 100ms or more; not stopped): rank 1 (w-1) 4.0x"}, said)
	h.judge(t0.Add(3 * time.Second))
	require.Len(t, said, 1, "the same stragglers are said once")

	h.observe(&clientv3.Event{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte(constants.ProgressPrefix + "w-1"), Value: []byte("{garbage")}}, t0.Add(4*time.Second))
	require.Len(t, said, 2)
	require.Contains(t, said[1], "ignoring w-1's progress report: progress report:")
	require.Equal(t, 2, h.judge(t0.Add(4*time.Second)).Ranks, "a report that does not parse changes nothing")

	// Rank 1 freezes at step 5 (its pod's sidecar says it silent); rank 0 waits in its collective and goes on beating.
	put("w-0", 12*time.Second, progress.RankReport{Rank: 0, Step: 5, AgeMs: 11000, StepMs: 100})
	put("w-1", 12*time.Second, progress.RankReport{Rank: 1, Step: 5, AgeMs: 11000, StepMs: 100, SilentMs: 9000})
	v = h.judge(t0.Add(12 * time.Second))
	require.True(t, v.Hung, "%+v", v)
	require.Equal(t, "rank 1 (w-1) at step 5, frozen (silent 9s)", progress.Join(v.Stopped))

	// A member's key deleted (its pod ended): its ranks are forgotten.
	h.observe(&clientv3.Event{Type: clientv3.EventTypeDelete, Kv: &mvccpb.KeyValue{Key: []byte(constants.ProgressPrefix + "w-1")}}, t0.Add(13*time.Second))
	require.Equal(t, 1, h.judge(t0.Add(13*time.Second)).Ranks)
}

// A report of ranks that last advanced before the run started (an earlier run's, still in a sidecar's memory) is
// not this run's.
func TestHangsIgnoreAnEarlierRun(t *testing.T) {
	t0 := time.Now()
	h := newHangs(HangConfig{}, []string{"w-0"}, t0, func(string, ...any) {})
	h.observe(&clientv3.Event{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte(constants.ProgressPrefix + "w-0"),
		Value: progress.Report{Ranks: []progress.RankReport{{Rank: 0, Step: 90, AgeMs: 5000}}}.Encode()}}, t0.Add(time.Second))
	v := h.judge(t0.Add(10 * time.Minute))
	require.Zero(t, v.Ranks)
	require.False(t, v.Hung)
}

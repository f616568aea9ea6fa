package sidecar

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/podreplace"
	"github.com/elastic-training/elastic-training/internal/progress"
)

// A pod is replaced after After hangs that are surely its own (frozen whole, or absent from its round), once per
// hang however many of its ranks are named; a hint (the least step, with no heartbeat to tell) counts for nothing;
// a refusal keeps the count and says so in an Event; a pod that left the job is forgotten.
func TestReplacerCountsSureBlames(t *testing.T) {
	members := []membership.Member{
		{Host: "j-w-0.j", Pod: "j-w-0-aaaaa"}, {Host: "j-w-1.j", Pod: "j-w-1-bbbbb"}, {Host: "j-w-2.j", Pod: "j-w-2-ccccc"},
		{Host: "old.j"}, // registered by an older sidecar: no pod name to give
	}
	var mu sync.Mutex
	var asked []podreplace.Request
	refuse := errors.New("the webhook refused (429 Too Many Requests): wait 12s")
	var answer error
	w := &warnings{}
	r := &replacer{after: 2, members: func() []membership.Member { mu.Lock(); defer mu.Unlock(); return members },
		warn: w, log: slog.New(slog.DiscardHandler), ctx: t.Context(), blamed: map[string]int{},
		ask: func(_ context.Context, req podreplace.Request) (podreplace.Response, error) {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, req)
			return podreplace.Response{Pod: req.Pod, Node: "n1"}, answer
		}}
	hang := func(bs ...progress.Blame) {
		t.Helper()
		r.onHang("run", 3, progress.Verdict{Hung: true, Stopped: bs})
		require.Eventually(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return !r.asking }, 5*time.Second, time.Millisecond)
	}
	frozen := func(rank int, host string) progress.Blame {
		return progress.Blame{Rank: rank, Host: host, Step: 40, Silent: 62 * time.Second}
	}
	nAsked := func() int { mu.Lock(); defer mu.Unlock(); return len(asked) }

	hang(progress.Blame{Rank: 0, Host: "j-w-0.j", Step: 40}, progress.Blame{Rank: 1, Host: "j-w-1.j", Step: 40})
	hang(progress.Blame{Rank: 0, Host: "j-w-0.j", Step: 41})
	require.Zero(t, nAsked(), "hints only: the least step names someone in every hang")

	hang(frozen(2, "j-w-1.j"), frozen(3, "j-w-1.j"), frozen(9, "old.j")) // two ranks of one pod: one hang
	require.Zero(t, nAsked())
	require.Equal(t, map[string]int{"j-w-1-bbbbb": 1}, r.blamed)

	answer = refuse
	hang(progress.Blame{Rank: 2, Host: "j-w-1.j", Absent: true, Silent: 70 * time.Second})
	require.Equal(t, 1, nAsked())
	require.Equal(t, "j-w-1-bbbbb", asked[0].Pod)
	require.Contains(t, asked[0].Reason, "2 hangs blamed on it (the last: round 3 of run run, rank 2 (j-w-1.j), no step said")
	require.Equal(t, 2, r.blamed["j-w-1-bbbbb"], "a refusal keeps the count")
	require.Len(t, w.list(), 1)
	require.Contains(t, w.list()[0], "PodNotReplaced: Pod j-w-1-bbbbb was not replaced after 2 hangs")
	require.Contains(t, w.list()[0], "429 Too Many Requests")

	answer = nil
	hang(frozen(2, "j-w-1.j"))
	require.Equal(t, 2, nAsked(), "the next hang asks again")
	require.Contains(t, asked[1].Reason, "3 hangs blamed on it")
	require.NotContains(t, r.blamed, "j-w-1-bbbbb", "replaced: forgotten")
	require.Len(t, w.list(), 1, "a replacement is the webhook's Event, not ours")

	hang(frozen(0, "j-w-0.j"))
	require.Equal(t, 1, r.blamed["j-w-0-aaaaa"])
	mu.Lock()
	members = members[1:]
	mu.Unlock()
	hang(frozen(2, "j-w-2.j"))
	require.Equal(t, map[string]int{"j-w-2-ccccc": 1}, r.blamed, "a pod that left the job is forgotten")
}

// A replacer exists only where the pod may ask: a URL, a count, and a CA that parses.
func TestNewReplacer(t *testing.T) {
	members := func() []membership.Member { return nil }
	log := slog.New(slog.DiscardHandler)
	for _, c := range []ReplaceConfig{{After: 2}, {After: 0, URL: "https://w/replace-pod", CA: []byte("x")}} {
		r, err := newReplacer(t.Context(), c, members, nil, log)
		require.NoError(t, err)
		require.Nil(t, r, "%+v", c)
	}
	_, err := newReplacer(t.Context(), ReplaceConfig{After: 2, URL: "https://w/replace-pod", CA: []byte("not a PEM"), TokenFile: "/t"}, members, nil, log)
	require.ErrorContains(t, err, "no PEM certificate")
	_, err = newReplacer(t.Context(), ReplaceConfig{After: 2, URL: "http://w/replace-pod", CA: []byte("x"), TokenFile: "/t"}, members, nil, log)
	require.ErrorContains(t, err, "want https://")
}

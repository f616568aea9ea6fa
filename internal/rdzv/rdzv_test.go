package rdzv

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/membership"
)

var t0 = time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)

func member(group string, i int) membership.Member {
	return membership.Member{Host: fmt.Sprintf("job-%s-%d", group, i), Slots: 1, Group: group, Index: i}
}

// step is one event of a run, at t0 plus at, and what must hold after it.
type step struct {
	at    time.Duration
	do    func(r *Run)
	round []string // the round Next forms then (nil: none)
	again time.Duration
	wait  int // Waiting after it
	ended int // Ended after it
}

func joined(ms ...membership.Member) func(*Run) {
	return func(r *Run) {
		for _, m := range ms {
			r.Joined(m)
		}
	}
}

func readyAt(at time.Duration, hosts ...string) func(*Run) {
	return func(r *Run) {
		for _, h := range hosts {
			r.Ready(h, t0.Add(at))
		}
	}
}

func TestNext(t *testing.T) {
	w0, w1, w2, b0 := member("worker", 0), member("worker", 1), member("worker", 2), member("burst", 0)
	for name, tc := range map[string]struct {
		s     Settings
		steps []step
	}{
		"max ready: at once, ranks by group and index": {Settings{Min: 1, Max: 3, LastCall: time.Second}, []step{
			{do: joined(w2, w0, b0)},
			{do: readyAt(0, w2.Host, b0.Host, w0.Host), round: []string{b0.Host, w0.Host, w2.Host}},
		}},
		"min ready: after the last call from the last one ready": {Settings{Min: 2, Max: 3, LastCall: 2 * time.Second}, []step{
			{do: joined(w0, w1, w2)},
			{do: readyAt(0, w0.Host), wait: 1},
			{at: time.Second, do: readyAt(time.Second, w1.Host), again: 3 * time.Second, wait: 2},
			{at: 2 * time.Second, again: 3 * time.Second, wait: 2},
			{at: 3 * time.Second, round: []string{w0.Host, w1.Host}},
			// w2's agent comes late: the round's agents are told one node waits.
			{at: 4 * time.Second, do: readyAt(4*time.Second, w2.Host), wait: 1},
		}},
		"more ready than max: the first max in order, the others wait": {Settings{Min: 1, Max: 2}, []step{
			{do: joined(w0, w1, w2)},
			// The round is full: no one restarts for w2.
			{do: readyAt(0, w2.Host, w1.Host, w0.Host), round: []string{w0.Host, w1.Host}},
		}},
		"an agent that is not a member yet waits for its registration": {Settings{Min: 2, Max: 2}, []step{
			{do: joined(w0)},
			{do: readyAt(0, w0.Host, w1.Host), wait: 1},
			{do: joined(w1), round: []string{w0.Host, w1.Host}},
		}},
		"a participant's member leaves: the others re-form without it": {Settings{Min: 1, Max: 3, LastCall: 2 * time.Second}, []step{
			{do: joined(w0, w1, w2)},
			{do: readyAt(0, w0.Host, w1.Host, w2.Host), round: []string{w0.Host, w1.Host, w2.Host}},
			{at: time.Second, do: func(r *Run) { r.Left(w1.Host) }, wait: 1},
			// The survivors restart and ask for the next round: every member is ready, so it forms at once.
			{at: 2 * time.Second, do: readyAt(2*time.Second, w0.Host, w2.Host), round: []string{w0.Host, w2.Host}},
		}},
		"a ready member that leaves is not in the round": {Settings{Min: 2, Max: 3, LastCall: time.Second}, []step{
			{do: joined(w0, w1, w2)},
			{do: readyAt(0, w0.Host, w1.Host, w2.Host), round: []string{w0.Host, w1.Host, w2.Host}},
			{at: time.Second, do: func(r *Run) {
				r.Ready(w0.Host, t0.Add(time.Second))
				r.Ready(w1.Host, t0.Add(time.Second))
				r.Left(w2.Host)
			},
				round: []string{w0.Host, w1.Host}},
		}},
		"a participant asks again (its workers failed): the others restart, and the round waits for them": {Settings{Min: 1, Max: 3, LastCall: time.Second}, []step{
			{do: joined(w0, w1, w2)},
			{do: readyAt(0, w0.Host, w1.Host), again: time.Second, wait: 2}, // w2's agent may yet come
			{at: time.Second, round: []string{w0.Host, w1.Host}},
			{at: 2 * time.Second, do: readyAt(2*time.Second, w0.Host), wait: 1},
			{at: 5 * time.Second, wait: 1}, // w1 is still in the round: nothing forms without it
			{at: 6 * time.Second, do: readyAt(6*time.Second, w1.Host), again: 7 * time.Second, wait: 2},
			{at: 7 * time.Second, round: []string{w0.Host, w1.Host}},
		}},
		"a hung round restarts (Restart): its agents are told a node waits, and the same members form the next": {Settings{Min: 2, Max: 2}, []step{
			{do: func(r *Run) { require.False(t, r.Restart(), "no round yet") }},
			{do: joined(w0, w1)},
			{do: readyAt(0, w0.Host, w1.Host), round: []string{w0.Host, w1.Host}},
			{do: func(r *Run) { require.True(t, r.Restart()) }, wait: 1},
			{do: readyAt(0, w0.Host), wait: 1},
			{do: readyAt(0, w1.Host), round: []string{w0.Host, w1.Host}},
			{wait: 0}, // the new round is not hung
		}},
		"every member ready: no last call": {Settings{Min: 1, Max: 4, LastCall: time.Minute}, []step{
			{do: joined(w0, w1)},
			{do: readyAt(0, w1.Host), again: time.Minute, wait: 1},
			{do: readyAt(0, w0.Host), round: []string{w0.Host, w1.Host}},
			// A scale-up: the new member's agent comes, the others restart, and the round forms as the last is ready.
			{do: joined(w2)},
			{at: time.Second, do: readyAt(time.Second, w2.Host), wait: 1},
			{at: 2 * time.Second, do: readyAt(2*time.Second, w0.Host, w1.Host), round: []string{w0.Host, w1.Host, w2.Host}},
		}},
		"a full round: a new member waits, restarting no one, and takes a lost participant's place": {Settings{Min: 2, Max: 2}, []step{
			{do: joined(w0, w1)},
			{do: readyAt(0, w0.Host, w1.Host), round: []string{w0.Host, w1.Host}},
			{do: func(r *Run) { r.Joined(w2); r.Ready(w2.Host, t0) }},
			{do: func(r *Run) { r.Left(w1.Host) }, wait: 1},
			{do: readyAt(0, w0.Host), round: []string{w0.Host, w2.Host}},
		}},
		"a participant done while a member leaves quietly; the next round does not wait for it": {Settings{Min: 1, Max: 3}, []step{
			{do: joined(w0, w1, w2)},
			{do: readyAt(0, w0.Host, w1.Host, w2.Host), round: []string{w0.Host, w1.Host, w2.Host}},
			// w1 finished (its agent's shutdown), then its pod stopped: w0 and w2 train on.
			{do: func(r *Run) { r.Done(w1.Host); r.Left(w1.Host) }, ended: 1},
			// w2's workers fail later: the round re-forms with the two left, and w1 holds nothing up.
			{at: time.Second, do: readyAt(time.Second, w2.Host), wait: 1, ended: 1},
			{at: time.Second, do: readyAt(time.Second, w0.Host), round: []string{w0.Host, w2.Host}},
		}},
		"done after the member left (a scale-down's preStop): still a loss": {Settings{Min: 1, Max: 2}, []step{
			{do: joined(w0, w1)},
			{do: readyAt(0, w0.Host, w1.Host), round: []string{w0.Host, w1.Host}},
			{do: func(r *Run) { r.Left(w1.Host); r.Done(w1.Host) }, wait: 1},
		}},
		"an agent restarted in its pod after done asks again": {Settings{Min: 2, Max: 2}, []step{
			{do: joined(w0, w1)},
			{do: readyAt(0, w0.Host, w1.Host), round: []string{w0.Host, w1.Host}},
			{do: func(r *Run) { r.Done(w1.Host) }, ended: 1},
			{at: time.Second, do: readyAt(time.Second, w1.Host), wait: 1},
			{at: time.Second, do: readyAt(time.Second, w0.Host), round: []string{w0.Host, w1.Host}},
		}},
		"done before any round, or of a waiting agent: it is no longer ready": {Settings{Min: 2, Max: 2}, []step{
			{do: joined(w0, w1)},
			{do: readyAt(0, w0.Host), wait: 1},
			{do: func(r *Run) { r.Done(w0.Host); r.Ready(w1.Host, t0) }, wait: 1},
		}},
		"closed: nothing forms": {Settings{Min: 1, Max: 1}, []step{
			{do: joined(w0)},
			{do: func(r *Run) { r.Close(); r.Ready(w0.Host, t0) }, wait: 1},
		}},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := New(tc.s)
			require.NoError(t, err)
			for i, st := range tc.steps {
				if st.do != nil {
					st.do(r)
				}
				round, ok, again := r.Next(t0.Add(st.at))
				if st.round == nil {
					require.False(t, ok, "step %d formed %v", i, round)
				} else {
					require.True(t, ok, "step %d formed nothing", i)
					require.Equal(t, st.round, round.Participants, "step %d", i)
					require.Equal(t, round, r.Current())
				}
				if st.again != 0 {
					require.Equal(t, t0.Add(st.again), again, "step %d: when to ask again", i)
				} else {
					require.True(t, again.IsZero(), "step %d: asked again at %s", i, again)
				}
				require.Equal(t, st.wait, r.Waiting(), "step %d: waiting", i)
				require.Equal(t, st.ended, r.Ended(), "step %d: ended", i)
				requireCounts(t, r)
			}
		})
	}
}

func TestSettingsCheck(t *testing.T) {
	for _, s := range []Settings{{Min: 0, Max: 1}, {Min: 2, Max: 1}, {Min: 1, Max: 1, LastCall: -time.Second}} {
		_, err := New(s)
		require.Error(t, err, "%+v", s)
	}
}

// FuzzRun: any sequence of joins, departures, readiness and time never forms
// a round over max, under min, with a non-member, or twice with one host, and
// round numbers only rise.
func FuzzRun(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7}, uint8(1), uint8(3))
	f.Add([]byte{0x16, 0x26, 0x10, 0x20, 0x03, 0x04, 0x17, 0x36, 0x04}, uint8(0), uint8(2))
	f.Fuzz(func(t *testing.T, ops []byte, lo, hi uint8) {
		s := Settings{Min: int(lo%4) + 1, Max: int(lo%4) + 1 + int(hi%4), LastCall: time.Second}
		r, err := New(s)
		require.NoError(t, err)
		now, last := t0, 0
		for _, op := range ops {
			m := member("worker", int(op>>4)%6)
			switch op % 9 {
			case 6: // an agent asks with settings of its own, perhaps before its host is a member
				r.Ask(m.Host, Settings{Min: int(op>>5)%3 + 1, Max: int(op>>5)%3 + 2, LastCall: time.Second}, fmt.Sprint(op>>6), now)
			case 7:
				r.Expire(now.Add(-time.Second))
			case 8:
				if op&0x80 != 0 { // a hang found
					if r.Restart() {
						require.Positive(t, r.Waiting(), "a restarted round tells its agents")
					}
					continue
				}
				r.Leave(m.Host)
			case 0:
				r.Joined(m)
			case 1:
				r.Left(m.Host)
			case 2:
				r.Ready(m.Host, now)
			case 5:
				r.Done(m.Host)
			case 3:
				now = now.Add(time.Duration(op>>2) * 100 * time.Millisecond)
			case 4:
				round, ok, _ := r.Next(now)
				if !ok {
					continue
				}
				require.Greater(t, round.Number, last)
				last = round.Number
				require.GreaterOrEqual(t, len(round.Participants), r.Settings().Min)
				require.LessOrEqual(t, len(round.Participants), r.Settings().Max)
				seen := map[string]bool{}
				for _, h := range round.Participants {
					require.False(t, seen[h], "%s twice in %v", h, round.Participants)
					seen[h] = true
					_, member := r.members[h]
					require.True(t, member, "%s not a member", h)
				}
			}
			require.GreaterOrEqual(t, r.Waiting(), 0)
			requireCounts(t, r)
		}
	})
}

// requireCounts checks the counts Run keeps as hosts change against a count
// from scratch.
func requireCounts(t *testing.T, r *Run) {
	t.Helper()
	var ready, readyIn, gone, done int
	for h := range r.ready {
		if r.Member(h) {
			ready++
			if r.in[h] {
				readyIn++
			}
		}
	}
	for _, h := range r.round.Participants {
		switch {
		case r.done[h]:
			done++
		case !r.Member(h):
			gone++
		}
	}
	require.Equal(t, [4]int{ready, readyIn, gone, done}, [4]int{r.nReady, r.nReadyIn, r.nGone, r.nDone},
		"ready, ready participants, gone participants, done participants")
	for h := range r.done {
		require.True(t, r.in[h], "done %s is not a participant", h)
	}
	require.Len(t, r.in, len(r.round.Participants))
	require.Equal(t, len(r.ready)-r.nReady, len(r.unregistered), "the asks of non-members")
	for h := range r.unregistered {
		require.True(t, r.ready[h] && !r.Member(h), "%s: an unregistered ask of a member, or not ready", h)
	}
	for h := range r.asks {
		require.True(t, r.ready[h], "%s: a request id of a host that does not ask", h)
	}
	for h := range r.leaving {
		require.False(t, r.Member(h), "%s: leaving, yet a member", h)
	}
}

// TestAskSettings: a run's settings are the first member's that asked, or those of an agent that asked before its
// host became a member once it is one; never those of a host that never registers.
func TestAskSettings(t *testing.T) {
	w0, w1 := member("worker", 0), member("worker", 1)
	forged := Settings{Min: 1, Max: 1}
	want := Settings{Min: 2, Max: 2, LastCall: time.Second}
	r, err := New(forged) // the first writer, no member
	require.NoError(t, err)
	r.Ask("stranger", forged, "", t0)
	r.Joined(w0)
	r.Joined(w1)
	r.Ask(w0.Host, want, "", t0)
	require.Equal(t, want, r.Settings())
	r.Ask(w1.Host, Settings{Min: 1, Max: 4}, "", t0) // a later member's do not change them
	require.Equal(t, want, r.Settings())
	round, ok, _ := r.Next(t0)
	require.True(t, ok)
	require.Equal(t, []string{w0.Host, w1.Host}, round.Participants, "not a round of 1 as the stranger asked")

	// Asked before its registration: the settings come with it.
	r, err = New(forged)
	require.NoError(t, err)
	r.Ask("stranger", forged, "", t0)
	r.Ask(w0.Host, want, "", t0)
	require.Equal(t, forged, r.Settings(), "no member yet")
	r.Joined(w0)
	require.Equal(t, want, r.Settings())
}

// TestUnregisteredAsks: the agents of hosts that are not members are bounded, the oldest forgotten first, and expire.
func TestUnregisteredAsks(t *testing.T) {
	s := Settings{Min: 1, Max: 2}
	r, err := New(s)
	require.NoError(t, err)
	for i := range MaxUnregistered {
		require.Empty(t, r.Ask(fmt.Sprintf("forged-%d", i), s, "", t0.Add(time.Duration(i)*time.Millisecond)).Forgotten)
	}
	w0 := member("worker", 0)
	// A real agent asks before its pod registered: the oldest forged ask makes room for it.
	require.Equal(t, "forged-0", r.Ask(w0.Host, s, "", t0.Add(time.Hour)).Forgotten)
	require.Equal(t, MaxUnregistered, r.Unregistered())
	r.Joined(w0)
	require.Equal(t, MaxUnregistered-1, r.Unregistered())
	round, ok, _ := r.Next(t0.Add(time.Hour))
	require.True(t, ok)
	require.Equal(t, []string{w0.Host}, round.Participants)
	require.Equal(t, MaxUnregistered-1, r.Expire(t0.Add(time.Minute)))
	require.Zero(t, r.Unregistered())
	requireCounts(t, r)
	require.True(t, r.Live())
	r.Left(w0.Host)
	require.False(t, r.Live(), "no member takes part")
}

// TestLeaveAndAskAgain: a member whose pod said it stops is not heard until its registration ends, and an agent
// that asks again for the request its round took it for keeps its rank.
func TestLeaveAndAskAgain(t *testing.T) {
	w0, w1 := member("worker", 0), member("worker", 1)
	s := Settings{Min: 1, Max: 2}
	r, err := New(s)
	require.NoError(t, err)
	r.Joined(w0)
	r.Joined(w1)
	r.Ask(w0.Host, s, "a0", t0)
	r.Ask(w1.Host, s, "a1", t0)
	round, ok, _ := r.Next(t0)
	require.True(t, ok)
	require.Equal(t, "a1", r.Answered(w1.Host))
	require.Equal(t, Asked{Again: true}, r.Ask(w1.Host, s, "a1", t0), "the same request: its rank anew")
	require.Zero(t, r.Waiting(), "asking again is no new request")
	require.Equal(t, Asked{}, r.Ask(w1.Host, s, "a2", t0), "a new request")
	require.Equal(t, 1, r.Waiting())

	require.True(t, r.Leave(w0.Host))
	require.False(t, r.Member(w0.Host))
	require.Equal(t, Asked{Leaving: true}, r.Ask(w0.Host, s, "a3", t0), "its agent restarts before its SIGTERM: not heard")
	r.Joined(w0) // the watch's last word of its registration, before it ends
	require.False(t, r.Member(w0.Host))
	next, ok, _ := r.Next(t0)
	require.True(t, ok)
	require.Equal(t, []string{w1.Host}, next.Participants)
	require.Greater(t, next.Number, round.Number)
	r.Left(w0.Host) // its registration ended: a replacement of the same name is heard
	r.Joined(w0)
	require.Equal(t, Asked{}, r.Ask(w0.Host, s, "b0", t0))
	requireCounts(t, r)
}

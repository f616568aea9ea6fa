package survivors

import (
	"bytes"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/torchbackends/torchstate"
)

// store is the c10d store as the Restarter sees it: the state key's value,
// changed by compare-and-set.
type store struct {
	mu sync.Mutex
	kv map[string][]byte
}

func (s *store) CompareSet(key string, expected, desired []byte) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.kv[key]; !ok || !bytes.Equal(cur, expected) {
		return false, nil
	}
	s.kv[key] = desired
	return true, nil
}

const key = "/torch.rendezvous.job"

var t0 = time.Date(2026, 11, 25, 9, 0, 0, 0, time.UTC)

func node(i int) torchstate.Node {
	return torchstate.Node{Addr: "job-worker-" + string(rune('0'+i)), PID: 40 + i}
}

// state is a round of the given participants (by rank), the waiting nodes after them.
func state(t *testing.T, round int, complete bool, participants []int, waiting ...torchstate.Node) []byte {
	st := torchstate.State{Round: round, Complete: complete, Heartbeats: map[torchstate.Node]time.Time{}}
	for rank, i := range participants {
		st.Participants = append(st.Participants, torchstate.Participant{Node: node(i), Rank: rank})
		st.Heartbeats[node(i)] = t0
	}
	st.Waiting = waiting
	b, err := torchstate.EncodeBase64(st)
	require.NoError(t, err)
	return b
}

// harness hands the Restarter each write as the store's hook does, and
// returns the state as it is afterwards.
type harness struct {
	t *testing.T
	s *store
	r *Restarter
}

func newHarness(t *testing.T) *harness {
	s := &store{kv: map[string][]byte{}}
	return &harness{t: t, s: s, r: New(Config{Store: s, Name: "job-rdzv", Now: func() time.Time { return t0 }})}
}

func (h *harness) write(v []byte) torchstate.State {
	h.s.mu.Lock()
	h.s.kv[key] = v
	h.s.mu.Unlock()
	h.r.C10dWrite(key, v)
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	st, err := torchstate.DecodeBase64(h.s.kv[key])
	require.NoError(h.t, err)
	return st
}

var placeholder = torchstate.Node{Addr: "job-rdzv", LocalID: 3}

// A lost node's participant: its member leaves, the restarter drops it with
// the placeholder; the agents' writes keep the placeholder until the round
// rises, and then it comes off before the smaller round completes.
func TestRestartsSurvivorsOfALostNode(t *testing.T) {
	h := newHarness(t)
	require.Empty(t, h.write(state(t, 3, false, []int{0, 1, 2})).Waiting, "a round forming")
	require.Empty(t, h.write(state(t, 3, true, []int{0, 1, 2})).Waiting, "the round complete")
	h.r.MembersChanged([]string{node(0).Addr, node(1).Addr, node(2).Addr}, nil)
	require.Empty(t, h.write(state(t, 3, true, []int{0, 1, 2})).Waiting, "keep-alives")

	h.r.MembersChanged(nil, []string{node(1).Addr})
	cur := h.s.kv[key]
	st := h.write(cur) // the agents write the state they read
	require.Equal(t, []torchstate.Node{placeholder}, st.Waiting)
	require.Equal(t, t0, st.Heartbeats[placeholder].UTC())
	require.Len(t, st.Participants, 2)

	// The survivors leave the round (torch's exit op): same round, still waiting.
	require.Equal(t, []torchstate.Node{placeholder}, h.write(mustWith(t, state(t, 3, true, []int{2}))).Waiting)
	// The last one out starts round 4: the placeholder comes off before round 4 completes.
	st = h.write(mustWith(t, state(t, 4, false, nil)))
	require.Empty(t, st.Waiting)
	require.NotContains(t, st.Heartbeats, placeholder)
	require.Empty(t, h.write(state(t, 4, true, []int{0, 2})).Waiting)
	require.Empty(t, h.write(state(t, 4, true, []int{0, 2})).Waiting)
}

func mustWith(t *testing.T, b []byte) []byte {
	b, err := torchstate.WithWaiting(b, placeholder, t0)
	require.NoError(t, err)
	return b
}

func TestLeavesAloneWhatTorchHandles(t *testing.T) {
	for name, writes := range map[string][][]byte{
		// A participant leaves by itself (the preStop script, or its own restart): its agent is alive and
		// would take a placeholder for a new round to join.
		"a participant leaves": {state(t, 3, true, []int{0, 1, 2}), state(t, 3, true, []int{0, 2})},
		// A node joining: torch puts it on the wait list and the agents restart by themselves.
		"scale-up": {state(t, 3, true, []int{0, 1}), state(t, 3, true, []int{0, 1}, node(2)), state(t, 3, true, []int{1}, node(2))},
		// The last participant gone: torch starts the next round itself.
		"everyone gone": {state(t, 3, true, []int{0}), state(t, 4, false, nil)},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			for i, w := range writes {
				st := h.write(w)
				require.False(t, slices.Contains(st.Waiting, torchstate.Node{Addr: "job-rdzv", LocalID: st.Round}), "write %d", i)
			}
		})
	}
}

// The compare-and-set can lose to an agent's write; it is made again on the
// next write, as long as the member is gone.
func TestRetriesAfterALostCompareSet(t *testing.T) {
	h := newHarness(t)
	h.write(state(t, 3, true, []int{0, 1, 2}))
	h.s.kv[key] = state(t, 3, true, []int{2, 0, 1}) // an agent wrote in between
	h.r.MembersChanged(nil, []string{node(1).Addr})
	st, err := torchstate.DecodeBase64(h.s.kv[key])
	require.NoError(t, err)
	require.Empty(t, st.Waiting)
	require.Equal(t, []torchstate.Node{placeholder}, h.write(state(t, 3, true, []int{0, 1, 2})).Waiting)
}

// torch drops the placeholder itself when it is not taken off (its heartbeat
// gets old): the Restarter forgets it and acts on the next loss.
func TestPlaceholderDroppedByTorch(t *testing.T) {
	h := newHarness(t)
	h.write(state(t, 3, true, []int{0, 1, 2}))
	h.r.MembersChanged(nil, []string{node(1).Addr})
	require.NotEmpty(t, h.write(h.s.kv[key]).Waiting)
	require.Empty(t, h.write(state(t, 3, true, []int{0, 2})).Waiting, "torch's _sanitize dropped it")
	require.Nil(t, h.r.runs["job"].placeholder)
	h.r.MembersChanged(nil, []string{node(0).Addr})
	require.Equal(t, []torchstate.Node{placeholder}, h.write(h.s.kv[key]).Waiting)
}

func TestIgnoresOtherKeysAndValues(t *testing.T) {
	h := newHarness(t)
	h.r.C10dWrite("/torch.rendezvous.job.3/MASTER_ADDR", []byte("x"))
	h.r.C10dWrite(key, []byte("Y2FuaW1hZGFt")) // torch's null sentinel
	h.r.C10dWrite(key, []byte("not base64!"))
	require.Empty(t, h.r.runs)
}

// A participant whose pod left the job's membership is dropped at once, long
// before torch's own judgement, with the placeholder in the same write; a
// host that comes back is not dropped again.
func TestDropsParticipantsOfGoneMembers(t *testing.T) {
	h := newHarness(t)
	h.write(state(t, 3, true, []int{0, 1, 2}))
	h.r.MembersChanged(nil, []string{node(1).Addr})
	st, err := torchstate.DecodeBase64(h.s.kv[key])
	require.NoError(t, err)
	require.Equal(t, []torchstate.Node{placeholder}, st.Waiting)
	require.Equal(t, []torchstate.Participant{{Node: node(0), Rank: 0}, {Node: node(2), Rank: 2}}, st.Participants)
	require.NotContains(t, st.Heartbeats, node(1))

	// The round rises: the placeholder comes off as before.
	require.Empty(t, h.write(mustWith(t, state(t, 4, false, nil))).Waiting)

	// The host's replacement registers, then joins round 4: it stays.
	h.r.MembersChanged([]string{node(1).Addr}, nil)
	st = h.write(state(t, 4, true, []int{0, 1, 2}))
	require.Len(t, st.Participants, 3)
	require.Empty(t, st.Waiting)
}

// A member that leaves while the round is still forming, or between writes
// whose compare-and-set fails, is dropped at the next write of a completed round.
func TestDropsGoneMembersOnTheNextWrite(t *testing.T) {
	h := newHarness(t)
	h.write(state(t, 3, false, []int{0, 1, 2}))
	h.r.MembersChanged(nil, []string{node(2).Addr})
	require.Empty(t, h.write(state(t, 3, false, []int{0, 1, 2})).Waiting, "forming: torch's business")
	st := h.write(state(t, 3, true, []int{0, 1, 2}))
	require.Equal(t, []torchstate.Node{placeholder}, st.Waiting)
	require.Len(t, st.Participants, 2)
}

// The survivors left the round (restarting) while a lost member was still a
// participant: dropping it ends the round as torch would, and the agents on
// the wait list go on to the next one.
func TestDropsTheLastParticipant(t *testing.T) {
	h := newHarness(t)
	h.write(state(t, 1, true, []int{0, 1, 2}))
	h.r.MembersChanged(nil, []string{node(2).Addr})
	// Node 0 restarted: out of the round, on the wait list; node 1 is lost too.
	st := h.write(state(t, 1, true, []int{1}, node(0)))
	require.Equal(t, 1, st.Round, "node 1's member is still registered")
	h.r.MembersChanged(nil, []string{node(1).Addr})
	st, err := torchstate.DecodeBase64(h.s.kv[key])
	require.NoError(t, err)
	require.Equal(t, 2, st.Round)
	require.False(t, st.Complete)
	require.Empty(t, st.Participants)
	require.Equal(t, []torchstate.Node{node(0)}, st.Waiting)
}

// torch's _sanitize can drop a lost participant before the Restarter does
// (its heartbeats got old before the member's lease ended, or the
// Restarter's compare-and-set lost to the agents' writes): the survivors are
// asked to restart all the same, once.
func TestRestartsAfterTorchDropsTheLostParticipant(t *testing.T) {
	for name, order := range map[string]func(h *harness) torchstate.State{
		"torch first": func(h *harness) torchstate.State {
			h.write(state(t, 3, true, []int{0, 2})) // _sanitize dropped node 1
			h.r.MembersChanged(nil, []string{node(1).Addr})
			st, err := torchstate.DecodeBase64(h.s.kv[key])
			require.NoError(t, err)
			return st
		},
		"membership first, compare-and-set lost": func(h *harness) torchstate.State {
			h.s.kv[key] = state(t, 3, true, []int{2, 0, 1}) // an agent wrote in between
			h.r.MembersChanged(nil, []string{node(1).Addr})
			return h.write(state(t, 3, true, []int{0, 2})) // the next write is _sanitize's
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			h.write(state(t, 3, true, []int{0, 1, 2}))
			st := order(h)
			require.Equal(t, []torchstate.Node{placeholder}, st.Waiting)
			require.Len(t, st.Participants, 2)
			// Keep-alives of the survivors: the placeholder is not added twice.
			require.Equal(t, []torchstate.Node{placeholder}, h.write(h.s.kv[key]).Waiting)
			// The next round takes it off, and forgets who left round 3.
			require.Empty(t, h.write(mustWith(t, state(t, 4, false, nil))).Waiting)
			require.Empty(t, h.write(state(t, 4, true, []int{0, 2})).Waiting)
		})
	}
}

// Who left a round is forgotten when the next one begins: a host that left
// round 3 by itself and is gone after round 4 formed without it is nobody's loss.
func TestForgetsWhoLeftWhenTheRoundChanges(t *testing.T) {
	h := newHarness(t)
	h.write(state(t, 3, true, []int{0, 1, 2}))
	h.write(state(t, 3, true, []int{0, 2})) // node 1 left by itself (scale-down's preStop)
	h.write(state(t, 4, true, []int{0, 2}))
	h.r.MembersChanged(nil, []string{node(1).Addr})
	require.Empty(t, h.write(state(t, 4, true, []int{0, 2})).Waiting)
}

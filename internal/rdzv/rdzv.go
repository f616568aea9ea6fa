// Package rdzv decides the rounds of the job's own torchrun rendezvous
// (docs/own-rendezvous.md): which members' agents form the next round, in
// which rank order, and how many nodes the agents of the current round are
// told are waiting. It is pure: the serving sidecar hands it the job's
// membership and the agents' readiness as they change, and writes what it
// decides into the c10d store. One agent's readiness or one member's
// departure costs constant work here, apart from the sort of the ready
// members when a round forms.
package rdzv

import (
	"fmt"
	"slices"
	"time"

	"github.com/elastic-training/elastic-training/internal/membership"
)

// Settings are torch's rendezvous settings as the agents pass them
// (--nnodes=MIN:MAX, the last-call timeout).
type Settings struct {
	Min, Max int
	// LastCall: once Min agents are ready, how long the round waits for more
	// after the last one became ready (torch's last_call_timeout).
	LastCall time.Duration
}

// Check refuses settings no round could be formed with.
func (s Settings) Check() error {
	if s.Min < 1 || s.Max < s.Min {
		return fmt.Errorf("rendezvous settings: want 1 <= min (%d) <= max (%d)", s.Min, s.Max)
	}
	if s.LastCall < 0 {
		return fmt.Errorf("rendezvous settings: last call %s < 0", s.LastCall)
	}
	return nil
}

// Round is a formed round: its number and its participants' hosts, in rank
// order.
type Round struct {
	Number       int
	Participants []string
}

// Rank is host's rank in r, or -1.
func (r Round) Rank(host string) int { return slices.Index(r.Participants, host) }

// Run is one rendezvous run as the serving sidecar follows it.
type Run struct {
	settings Settings
	members  map[string]membership.Member // live, by host
	ready    map[string]bool              // agents asking for the next round, by host
	// grown is when the ready members last grew: the last call counts from it.
	grown  time.Time
	round  Round
	closed bool
}

// New returns a run that has formed no round.
func New(s Settings) (*Run, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	return &Run{settings: s, members: map[string]membership.Member{}, ready: map[string]bool{}}, nil
}

// Joined records a member that registered.
func (r *Run) Joined(m membership.Member) { r.members[m.Host] = m }

// Left records a member whose registration ended (its pod stopped, or its
// lease ran out with its node): it is no longer ready, and if it takes part
// in the current round the others must re-form (Waiting).
func (r *Run) Left(host string) {
	delete(r.members, host)
	delete(r.ready, host)
}

// Ready records that host's agent asks for the next round (torch's
// next_rendezvous) at now. An agent that is not a member yet waits until it
// is one.
func (r *Run) Ready(host string, now time.Time) {
	if !r.ready[host] {
		r.ready[host] = true
		r.grown = now
	}
}

// Close ends the run: no round forms after it (torch's set_closed).
func (r *Run) Close() { r.closed = true }

// Closed reports whether the run was closed.
func (r *Run) Closed() bool { return r.closed }

// Current is the last round formed (Number 0: none yet).
func (r *Run) Current() Round { return r.round }

// eligible are the ready members, in the order ranks follow: group, index,
// host.
func (r *Run) eligible() []membership.Member {
	var ms []membership.Member
	for h := range r.ready {
		if m, ok := r.members[h]; ok {
			ms = append(ms, m)
		}
	}
	return membership.Sorted(ms)
}

// Waiting is what num_nodes_waiting tells the agents of the current round:
// the ready members outside it (a scale-up, or agents restarting), at least 1
// when one of its participants is no longer a member (its node lost or its pod
// stopped), so that the others restart and re-form without it.
func (r *Run) Waiting() int {
	n := 0
	for _, m := range r.eligible() {
		if r.round.Rank(m.Host) < 0 {
			n++
		}
	}
	if n == 0 && slices.ContainsFunc(r.round.Participants, func(h string) bool { _, ok := r.members[h]; return !ok }) {
		n = 1
	}
	return n
}

// Next forms the next round if it is due at now: Max ready members at once,
// or at least Min once none has become ready for the last call. It returns
// the round formed (ok), or when to ask again (zero: when something changes).
func (r *Run) Next(now time.Time) (round Round, ok bool, again time.Time) {
	if r.closed {
		return Round{}, false, time.Time{}
	}
	ms := r.eligible()
	switch {
	case len(ms) >= r.settings.Max:
		ms = ms[:r.settings.Max]
	case len(ms) >= r.settings.Min:
		if due := r.grown.Add(r.settings.LastCall); now.Before(due) {
			return Round{}, false, due
		}
	default:
		return Round{}, false, time.Time{}
	}
	next := Round{Number: r.round.Number + 1}
	for _, m := range ms {
		next.Participants = append(next.Participants, m.Host)
		delete(r.ready, m.Host)
	}
	r.round = next
	return next, true, time.Time{}
}

// Package rdzv decides the rounds of the job's own torchrun rendezvous
// (docs/elastic-training-backend.md): which members' agents form the next round, in
// which rank order, and how many nodes the agents of the current round are
// told are waiting. It is pure: the serving sidecar hands it the job's
// membership and the agents' readiness as they change
// (internal/rdzv/c10drounds), and writes what it decides into the c10d
// store. A change costs constant work here (counts kept as they change); only
// forming a round walks and sorts its participants.
//
// The rules are torch's dynamic rendezvous' (dynamic_rendezvous.py), without
// its shared state: a round stays until every participant that is still a
// member has asked for the next one (torch: until every participant left
// it); the next forms at once with max ready members, or with at least min
// once none has become ready for the last call, or at once when every member
// is ready: the last call waits for nodes that may yet come, and no node
// comes that is not a member first (its pod's sidecar registers it before
// its agent starts), so a round re-formed after a loss or a scale-down, and a
// job's first round, wait for no one; and the agents of a round
// restart (num_nodes_waiting > 0) when one of them asks for a new round, when
// a member asks to join a round that has room, or when a participant's member
// is gone (its node lost, its pod stopped) before its agent said it was done,
// or when the serving sidecar finds the round hung (Restart).
// A participant whose agent is done (torch's shutdown after its run ended)
// leaves the round quietly, as a node that finished does in torch: the others
// finish their own run (one rank saving a checkpoint while the rest have
// exited), and the next round, if any, does not wait for it. A member whose
// pod said it stops (a scale-down's preStop) is not heard until its
// registration ends; an agent that asks again for the request its round took
// it for (it lost the connection it asked on) keeps its rank; the settings
// are the first member's; agents of hosts that are not members wait for
// their registration, boundedly.
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

// MaxUnregistered bounds the agents that wait for their hosts to become members (Ask): a registration is on its
// way for a moment, a forged host's for ever.
const MaxUnregistered = 1024

// Run is one rendezvous run as the serving sidecar follows it.
type Run struct {
	settings Settings
	// settled: the settings are a member's (Ask); until then they are the first asker's, who may be no member.
	settled bool
	// unregistered are the asks of hosts that are not members (yet): the settings they asked with, and when.
	unregistered map[string]unregisteredAsk
	members      map[string]membership.Member // live, by host
	ready        map[string]bool              // agents asking for the next round, by host
	in           map[string]bool              // the current round's participants
	done         map[string]bool              // participants whose agent ended (Done) while a member
	// asks are the request ids of the ready hosts (Ask); answered those the current round took its participants
	// for; leaving the members whose pod said it stops (Leave), not heard until their registration ends (Left).
	asks, answered map[string]string
	leaving        map[string]bool
	// grown is when the ready members last grew: the last call counts from it.
	grown  time.Time
	round  Round
	closed bool
	// restart: the current round's agents were told to restart though no member changed (Restart: a hang); the
	// round's num_nodes_waiting stays 1 or more until the next round forms.
	restart bool
	// Counts kept as hosts change (count): ready members, of them the
	// participants, participants that are no longer members and were not
	// done, and done participants.
	nReady, nReadyIn, nGone, nDone int
}

type unregisteredAsk struct {
	settings Settings
	at       time.Time
}

// New returns a run that has formed no round, with the settings of its first ask (Ask replaces them with the first
// member's).
func New(s Settings) (*Run, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	return &Run{settings: s, members: map[string]membership.Member{}, ready: map[string]bool{}, in: map[string]bool{},
		done: map[string]bool{}, unregistered: map[string]unregisteredAsk{}, asks: map[string]string{}, answered: map[string]string{},
		leaving: map[string]bool{}}, nil
}

// Settings are the run's.
func (r *Run) Settings() Settings { return r.settings }

// count adds host's part of the counts d times (d = -1 takes it away): change
// calls it around every change of a host.
func (r *Run) count(host string, d int) {
	_, member := r.members[host]
	if r.ready[host] && member {
		r.nReady += d
		if r.in[host] {
			r.nReadyIn += d
		}
	}
	switch {
	case r.in[host] && r.done[host]:
		r.nDone += d
	case r.in[host] && !member:
		r.nGone += d
	}
}

// change applies f, which changes host alone, and keeps the counts.
func (r *Run) change(host string, f func()) {
	r.count(host, -1)
	f()
	r.count(host, 1)
}

// Joined records a member that registered (again, with new details: the
// last one counts). An agent of its host that asked before is a member's
// now, and so are the settings it asked with if no member's came first.
func (r *Run) Joined(m membership.Member) {
	if r.leaving[m.Host] {
		return // its registration ends with its pod (Left); a replacement of the same name registers after that
	}
	if a, ok := r.unregistered[m.Host]; ok {
		delete(r.unregistered, m.Host)
		r.settle(a.settings)
	}
	r.change(m.Host, func() { r.members[m.Host] = m })
}

// settle makes s the run's settings if they are the first member's.
func (r *Run) settle(s Settings) {
	if !r.settled {
		r.settings, r.settled = s, true
	}
}

// Left records a member whose registration ended (its pod stopped, or its
// lease ran out with its node): it is no longer ready, and if it takes part
// in the current round the others must re-form (Waiting).
func (r *Run) Left(host string) {
	r.left(host)
	delete(r.leaving, host)
}

func (r *Run) left(host string) {
	r.change(host, func() {
		delete(r.members, host)
		delete(r.ready, host)
	})
	delete(r.unregistered, host)
	delete(r.asks, host)
}

// Leave records that host's pod said it stops (its preStop hook, a scale-down) before its registration ends: it
// is no longer a member (Left), and its agent, which may still restart its workers and ask for a round before its
// SIGTERM, is not heard until the registration ends. It returns false when host was no member.
func (r *Run) Leave(host string) bool {
	if !r.Member(host) {
		return false
	}
	r.left(host)
	r.leaving[host] = true
	return true
}

// Unregistered is how many agents asked for a round from hosts that are not
// members (yet): their pods' registrations may still be on their way.
func (r *Run) Unregistered() int { return len(r.unregistered) }

// Member says whether host is a member.
func (r *Run) Member(host string) bool { _, ok := r.members[host]; return ok }

// Asked is what an Ask did.
type Asked struct {
	// Again: host asked again for the round it has (the request the current round took it for), as an agent does
	// over a new connection after it lost the one it asked on, having deleted its rank: nothing changed, and it is
	// to be answered with its rank anew. The round's other agents wait for it in their rendezvous, where they do
	// not hear num_nodes_waiting (torch's _assign_worker_ranks, until the store's timeout).
	Again bool
	// Leaving: host's pod said it stops (Leave): not heard.
	Leaving bool
	// Forgotten is the agent of a host that is no member forgotten to make room (MaxUnregistered), if any.
	Forgotten string
}

// Ask records that host's agent asks for the next round at now with settings
// s and request id ask (the same for every ask of one request; "": an agent
// whose every ask is a new request). The run takes the settings of the first
// member that asks, or of the first agent that asked before its host became
// a member (Joined), never a non-member's. At most MaxUnregistered agents of
// hosts that are not members wait for their registration: past that the one
// that asked first is forgotten, so that a flood of forged hosts never keeps
// out a real agent that asks before its pod registered.
func (r *Run) Ask(host string, s Settings, ask string, now time.Time) Asked {
	if r.leaving[host] {
		return Asked{Leaving: true}
	}
	if ask != "" && r.answered[host] == ask && r.round.Rank(host) >= 0 {
		return Asked{Again: true}
	}
	var a Asked
	if r.Member(host) {
		r.settle(s)
	} else if !r.ready[host] {
		if len(r.unregistered) >= MaxUnregistered {
			a.Forgotten = r.oldestUnregistered()
			r.forget(a.Forgotten)
		}
		r.unregistered[host] = unregisteredAsk{settings: s, at: now}
	}
	r.ready1(host, now)
	r.asks[host] = ask
	return a
}

// Answered is the request id the current round took host for ("": none, or an agent without request ids).
func (r *Run) Answered(host string) string { return r.answered[host] }

// Expire forgets the asks of agents whose hosts are still no members since before (their registration never
// came: a join timeout); it returns how many.
func (r *Run) Expire(before time.Time) int {
	n := 0
	for h, a := range r.unregistered {
		if a.at.Before(before) {
			r.forget(h)
			n++
		}
	}
	return n
}

func (r *Run) oldestUnregistered() string {
	var oldest string
	var at time.Time
	for h, a := range r.unregistered {
		if oldest == "" || a.at.Before(at) || a.at.Equal(at) && h < oldest {
			oldest, at = h, a.at
		}
	}
	return oldest
}

// forget drops the ask of host, which is no member.
func (r *Run) forget(host string) {
	delete(r.unregistered, host)
	delete(r.asks, host)
	r.change(host, func() { delete(r.ready, host) })
}

// Live says whether a member takes part in the run: one asks for a round, or the current round has one that is not
// done.
func (r *Run) Live() bool { return r.nReady > 0 || len(r.round.Participants)-r.nGone-r.nDone > 0 }

// Ready records that host's agent asks for the next round (torch's
// next_rendezvous) at now, with the run's settings (Ask). An agent that is
// not a member yet waits until it is one.
func (r *Run) Ready(host string, now time.Time) { r.Ask(host, r.settings, "", now) }

func (r *Run) ready1(host string, now time.Time) {
	if r.ready[host] {
		return
	}
	r.change(host, func() { r.ready[host] = true; delete(r.done, host) })
	if r.Member(host) {
		r.grown = now
	}
}

// Done records that host's agent ended (torch's shutdown: its run succeeded,
// failed, or it was stopped): it asks for no round. A participant that is
// still a member then leaves the round without making the others re-form,
// and no next round waits for it; one whose member is gone already stays a
// loss (a scale-down's preStop removed it: the others must re-form).
func (r *Run) Done(host string) {
	_, member := r.members[host]
	r.change(host, func() {
		delete(r.ready, host)
		if r.in[host] && member {
			r.done[host] = true
		}
	})
	delete(r.unregistered, host)
	delete(r.asks, host)
}

// Ended is how many participants of the current round are done (Done) while
// still members: their agents' runs ended, so the round, though it stays, no
// longer trains with them.
func (r *Run) Ended() int { return r.nDone }

// Close ends the run: no round forms after it (torch's set_closed). It
// returns the hosts whose agents were asking for a round, which will get
// none.
func (r *Run) Close() []string {
	r.closed = true
	hosts := make([]string, 0, len(r.ready))
	for h := range r.ready {
		hosts = append(hosts, h)
	}
	slices.Sort(hosts)
	return hosts
}

// Closed reports whether the run was closed.
func (r *Run) Closed() bool { return r.closed }

// Current is the last round formed (Number 0: none yet).
func (r *Run) Current() Round { return r.round }

// Waiting is what num_nodes_waiting tells the agents of the current round:
// the participants that asked for a new round (their workers failed, or they
// restarted), the other ready members when the round has room for them (a
// scale-up), and at least 1 when a participant is no longer a member, so that
// the others restart and re-form without it.
func (r *Run) Waiting() int {
	n := r.nReadyIn
	if len(r.round.Participants) < r.settings.Max {
		n = r.nReady
	}
	if n == 0 && (r.nGone > 0 || r.restart) {
		n = 1
	}
	return n
}

// Restart tells the current round's agents to restart their workers and form the next round, though no member
// changed: the serving sidecar found the round hung (internal/progress). False when there is no round to restart.
func (r *Run) Restart() bool {
	if r.closed || r.round.Number == 0 {
		return false
	}
	r.restart = true
	return true
}

// pending are the participants of the current round that are members, not
// done, and have not asked for the next one: the round stays while there are
// any.
func (r *Run) pending() int { return len(r.round.Participants) - r.nGone - r.nReadyIn - r.nDone }

// Next forms the next round if it is due at now: once no participant of the
// current round is pending, Max ready members at once, or at least Min once
// none has become ready for the last call or once every member is ready. It
// returns the round formed (ok), or when to ask again (zero: when something
// changes).
func (r *Run) Next(now time.Time) (round Round, ok bool, again time.Time) {
	if r.closed || r.pending() > 0 {
		return Round{}, false, time.Time{}
	}
	switch {
	case r.nReady >= r.settings.Max:
	case r.nReady >= r.settings.Min && r.nReady == len(r.members):
	case r.nReady >= r.settings.Min:
		if due := r.grown.Add(r.settings.LastCall); now.Before(due) {
			return Round{}, false, due
		}
	default:
		return Round{}, false, time.Time{}
	}
	ms := r.eligible()
	if len(ms) > r.settings.Max {
		ms = ms[:r.settings.Max]
	}
	next := Round{Number: r.round.Number + 1, Participants: make([]string, 0, len(ms))}
	for _, h := range r.round.Participants {
		r.change(h, func() { delete(r.in, h); delete(r.done, h) })
	}
	clear(r.answered)
	for _, m := range ms {
		next.Participants = append(next.Participants, m.Host)
		r.change(m.Host, func() { delete(r.ready, m.Host); r.in[m.Host] = true })
		r.answered[m.Host] = r.asks[m.Host]
		delete(r.asks, m.Host)
	}
	r.round, r.restart = next, false
	return next, true, time.Time{}
}

// eligible are the ready members, in the order ranks follow: group, index,
// host.
func (r *Run) eligible() []membership.Member {
	ms := make([]membership.Member, 0, r.nReady)
	for h := range r.ready {
		if m, ok := r.members[h]; ok {
			ms = append(ms, m)
		}
	}
	return membership.Sorted(ms)
}

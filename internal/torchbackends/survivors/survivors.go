// Package survivors restarts torch's agents when a participant of their
// round is lost with its node, so that it costs the survivors seconds instead
// of the collective timeout (docs/failures.md).
//
// torch's dynamic rendezvous drops a participant whose keep-alives stopped
// (_sanitize: after 6 s with the webhook's settings on torch 2.14, 15 s on
// torch 2.6, which ignores them) but leaves the round as it is: no agent
// restarts until its workers fail, and workers blocked in a collective with
// the lost peer wait for gloo's timeout (30 min) or NCCL's watchdog (10 min)
// (pytorch/pytorch#111646). An agent restarts its healthy workers for one
// reason only: a node on the rendezvous' wait list.
//
// The job's membership knows of the loss first: each pod's sidecar keeps a
// lease-bound registration, which ends a lease TTL (5 s) after its node is
// gone. When a participant's host leaves the membership, the serving sidecar
// writes torch's state back (compare-and-set, as torch writes it) without that
// participant and with a placeholder node on the wait list. Every survivor
// restarts and a smaller round forms; the placeholder is taken off the moment
// the round number rises, before that round completes (left there, it would
// restart every agent again until torch's _sanitize drops it for want of
// heartbeats, which its own heartbeat bounds if the sidecar is gone).
// torch's _sanitize may drop the lost participant first (its keep-alive
// timeout and the lease TTL are seconds apart, and a partitioned node's
// lease can end late): the Restarter remembers who left a completed round
// and, when that host is gone, puts the placeholder on the wait list alone.
//
// A participant that leaves by itself (the preStop script, or torch's own
// restart) is torch's business: its agent, alive, would take the placeholder
// for a new round and join it. A healthy pod whose sidecar is away for a whole
// lease costs one restart of everyone; nothing is lost.
package survivors

import (
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/torchbackends/torchstate"
)

// Store is where torch's c10d backend keeps the state: the sidecar's
// TCPStore server (tcpstore.Server.CompareSet).
type Store interface {
	CompareSet(key string, expected, desired []byte) (bool, error)
}

// Config configures a Restarter.
type Config struct {
	Store Store
	// Name is the placeholder's address as torch shows it in the wait list
	// ("<Name>_0_<round>"): the serving pod's name.
	Name    string
	Log     *slog.Logger // nil: discard
	Metrics prometheus.Registerer
	Now     func() time.Time // nil: time.Now
}

// Restarter watches the state writes of the c10d backend.
type Restarter struct {
	store    Store
	name     string
	log      *slog.Logger
	now      func() time.Time
	restarts prometheus.Counter

	mu   sync.Mutex
	runs map[string]*run
	// gone are the member hosts that left the membership (and have not come
	// back): a participant at one of them is lost.
	gone map[string]bool
}

// run is what a Restarter keeps of one rendezvous run.
type run struct {
	key   string // the store key of its state
	value []byte // the state as last written
	prev  *torchstate.State
	// placeholder is on the wait list, for the round placeholder.LocalID.
	placeholder *torchstate.Node
	// left are the hosts of participants that left prev's completed round
	// while it stayed complete: torch's _sanitize dropped them (heartbeats
	// too old) or they left by themselves. One whose host is gone, before or
	// after, was lost: torch's drop does not restart the survivors, whose
	// collectives wait for the peer. Emptied when the round changes.
	left map[string]bool
}

// maxRuns bounds the runs followed: a job has one at a time.
const maxRuns = 16

// New returns a Restarter writing to cfg.Store.
func New(cfg Config) *Restarter {
	r := &Restarter{store: cfg.Store, name: cfg.Name, log: cfg.Log, now: cfg.Now, runs: map[string]*run{}, gone: map[string]bool{},
		restarts: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "elastic_training_sidecar", Name: "survivor_restarts_total",
			Help: "Rounds whose survivors were asked to restart after torch dropped a participant."})}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.name == "" {
		r.name = "rdzv-sidecar"
	}
	if cfg.Metrics != nil {
		cfg.Metrics.MustRegister(r.restarts)
	}
	return r
}

// C10dWrite is handed every SET and stored COMPARE_SET of the c10d store
// (key with the TCPStore client's "/"), after the write and outside the
// store's locks.
func (r *Restarter) C10dWrite(key string, value []byte) {
	id, ok := torchstate.StateRun(constants.BackendC10d, strings.TrimPrefix(key, "/"))
	if !ok {
		return
	}
	st, err := torchstate.DecodeBase64(value)
	if err != nil {
		return // torch's null sentinel, or not torch's: nothing to restart
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ru := r.runLocked(id)
	ru.noteLeft(st)
	ru.prev, ru.key, ru.value = &st, key, value
	if r.dropGoneLocked(ru) {
		return
	}

	if p := ru.placeholder; p != nil {
		switch {
		case !slices.Contains(st.Waiting, *p):
			ru.placeholder = nil // torch dropped it (no heartbeat for too long)
		case st.Round > p.LocalID:
			if r.compareSet(ru, func() ([]byte, error) { return torchstate.WithoutWaiting(value, *p) }) {
				r.log.Info("survivors restarted: placeholder off the wait list", "run", id, "round", st.Round)
				ru.placeholder = nil
			}
		}
	}
}

// MembersChanged is told which member hosts joined and left the job's
// membership (the sidecars' lease-bound registrations; a host is a pod's
// stable DNS name, which is also the address torch's agent gives its node).
func (r *Restarter) MembersChanged(joined, left []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range joined {
		delete(r.gone, h)
	}
	for _, h := range left {
		r.gone[h] = true
	}
	if len(left) == 0 {
		return
	}
	for _, ru := range r.runs {
		r.dropGoneLocked(ru)
	}
}

// noteLeft records the participants that left ru's completed round in st,
// the next state of the same round.
func (ru *run) noteLeft(st torchstate.State) {
	prev := ru.prev
	if prev == nil || prev.Round != st.Round || !prev.Complete || !st.Complete {
		ru.left = nil
		return
	}
	for _, p := range prev.Participants {
		if !slices.ContainsFunc(st.Participants, func(q torchstate.Participant) bool { return q.Node == p.Node }) {
			if ru.left == nil {
				ru.left = map[string]bool{}
			}
			ru.left[p.Addr] = true
		}
	}
}

// dropGoneLocked takes the participants at gone hosts out of ru's completed
// round, with the placeholder on the wait list, and reports whether it wrote.
// A compare-and-set that loses to an agent's write is tried again on the next
// write: the host stays gone until it comes back.
func (r *Restarter) dropGoneLocked(ru *run) bool {
	st := ru.prev
	if len(r.gone) == 0 || st == nil || !st.Complete || st.Closed {
		return false
	}
	if !slices.ContainsFunc(st.Participants, func(p torchstate.Participant) bool { return r.gone[p.Addr] }) {
		return r.restartAfterTorchDropLocked(ru)
	}
	p := r.placeholderOf(st.Round)
	var dropped []torchstate.Node
	if !r.compareSet(ru, func() ([]byte, error) {
		out, d, err := torchstate.WithoutParticipants(ru.value, func(addr string) bool { return r.gone[addr] }, p, r.now())
		dropped = d
		return out, err
	}) {
		return false
	}
	survivors := len(st.Participants) - len(dropped)
	if survivors == 0 {
		r.log.Info("the last participants' pods left the job's membership; dropped them, the next round begins",
			"round", st.Round, "dropped", dropped)
		return true
	}
	r.restarts.Inc()
	ru.placeholder = &p
	r.log.Info("a participant's pod left the job's membership; dropped it from the round and asked the survivors to restart",
		"round", st.Round, "dropped", dropped, "survivors", survivors)
	return true
}

// restartAfterTorchDropLocked puts the placeholder on the wait list of ru's
// completed round when a participant that left it (torch's _sanitize came
// before the membership's news, or after a compare-and-set of ours lost; or
// its pod's preStop took it out on a scale-down) is gone from the membership
// too, so that the survivors restart as they would have if the Restarter had
// dropped it. After a preStop they would restart anyway, once their
// collectives fail; now at once.
func (r *Restarter) restartAfterTorchDropLocked(ru *run) bool {
	st := ru.prev
	var lost []string
	for h := range ru.left {
		if r.gone[h] {
			lost = append(lost, h)
		}
	}
	if len(lost) == 0 || len(st.Participants) == 0 {
		return false
	}
	p := r.placeholderOf(st.Round)
	if slices.Contains(st.Waiting, p) ||
		!r.compareSet(ru, func() ([]byte, error) { return torchstate.WithWaiting(ru.value, p, r.now()) }) {
		return false
	}
	slices.Sort(lost)
	for _, h := range lost {
		delete(ru.left, h)
	}
	r.restarts.Inc()
	ru.placeholder = &p
	r.log.Info("a participant out of the round already (torch's _sanitize, or its preStop) left the job's membership; asked the survivors to restart",
		"round", st.Round, "hosts", lost, "survivors", len(st.Participants))
	return true
}

// placeholderOf is the node the Restarter puts on round's wait list: the
// serving pod's name, as torch shows it ("<name>_0_<round>").
func (r *Restarter) placeholderOf(round int) torchstate.Node {
	return torchstate.Node{Addr: r.name, LocalID: round}
}

// compareSet writes what edit makes of ru's state, if the store still holds
// it, and reports whether it was stored; ru then holds what was written, so
// that the next write is compared with it. A failed edit is logged: the state
// is torch's and was decoded, so it is a bug of ours.
func (r *Restarter) compareSet(ru *run, edit func() ([]byte, error)) bool {
	desired, err := edit()
	if err != nil {
		r.log.Error("cannot edit torch's rendezvous state", "key", ru.key, "err", err)
		return false
	}
	stored, err := r.store.CompareSet(ru.key, ru.value, desired)
	if err != nil {
		r.log.Warn("cannot write torch's rendezvous state", "key", ru.key, "err", err)
		return false
	}
	if !stored {
		// An agent wrote in between: the caller tries again at the next write it is handed.
		r.log.Debug("lost the compare-and-set of torch's rendezvous state to an agent's write", "key", ru.key)
		return false
	}
	if st, err := torchstate.DecodeBase64(desired); err == nil {
		ru.prev, ru.value = &st, desired
	}
	return true
}

func (r *Restarter) runLocked(id string) *run {
	if ru, ok := r.runs[id]; ok {
		return ru
	}
	if len(r.runs) >= maxRuns {
		for k := range r.runs { // any other: a job has one run at a time
			delete(r.runs, k)
			break
		}
	}
	ru := &run{}
	r.runs[id] = ru
	return ru
}

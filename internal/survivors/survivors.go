// Package survivors restarts torch's agents when a participant of their
// round is gone, so that a lost node costs the survivors seconds instead of
// the collective timeout.
//
// torch's dynamic rendezvous drops a participant whose keep-alives stopped
// (_sanitize) but leaves the round as it is: no agent restarts until its
// workers fail, and workers blocked in a collective with the lost peer wait
// for gloo's timeout (30 min) or NCCL's watchdog (10 min)
// (pytorch/pytorch#111646). An agent restarts its healthy workers for one
// reason only: a node on the rendezvous' wait list. So when a state write
// shows a completed round that lost a participant, the serving sidecar puts a
// placeholder node on the wait list (compare-and-set, as torch writes the
// state). Every survivor restarts and a smaller round forms; the placeholder
// is taken off the moment the round number rises, before that round
// completes (left there, it would restart every agent again until torch's
// _sanitize drops it for want of heartbeats, which its own heartbeat bounds
// if the sidecar is gone).
//
// This reads no clock and assumes no keep-alive interval: torch decides who
// is dead, so it holds for torch 2.6 (which ignores the keep-alive settings)
// and 2.14 alike. See docs/failures.md.
package survivors

import (
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/torchstate"
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
}

// run is what a Restarter keeps of one rendezvous run.
type run struct {
	prev *torchstate.State
	// lost is the round that lost a participant and has no placeholder yet
	// (a compare-and-set that lost to an agent's write is tried again on the
	// next write); -1 when none.
	lost int
	// placeholder is on the wait list, for the round placeholder.LocalID.
	placeholder *torchstate.Node
}

// maxRuns bounds the runs followed: a job has one at a time.
const maxRuns = 16

// New returns a Restarter writing to cfg.Store.
func New(cfg Config) *Restarter {
	r := &Restarter{store: cfg.Store, name: cfg.Name, log: cfg.Log, now: cfg.Now, runs: map[string]*run{},
		restarts: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "rdzv_sidecar", Name: "survivor_restarts_total",
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
	if r == nil { // turned off (rdzv-sidecar --restart-survivors=false)
		return
	}
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
	prev := ru.prev
	ru.prev = &st

	if p := ru.placeholder; p != nil {
		switch {
		case !slices.Contains(st.Waiting, *p):
			ru.placeholder = nil // torch dropped it (no heartbeat for too long)
		case st.Round > p.LocalID:
			r.compareSet(key, value, func() ([]byte, error) { return torchstate.WithoutWaiting(value, *p) }, func() {
				r.log.Info("survivors restarted: placeholder off the wait list", "run", id, "round", st.Round)
				ru.placeholder = nil
			})
		}
		return
	}
	if prev != nil && prev.Round == st.Round && prev.Complete && st.Complete && !st.Closed {
		if gone := missing(prev.Participants, st.Participants); len(gone) > 0 && len(st.Participants) > 0 {
			ru.lost = st.Round
			r.log.Info("a participant of the round is gone; asking the survivors to restart", "run", id,
				"round", st.Round, "gone", gone, "survivors", len(st.Participants))
		}
	}
	if ru.lost != st.Round || !st.Complete || st.Closed || len(st.Waiting) > 0 {
		ru.lost = -1 // a new round, or torch has a node waiting: the agents restart anyway
		return
	}
	p := torchstate.Node{Addr: r.name, LocalID: st.Round}
	r.compareSet(key, value, func() ([]byte, error) { return torchstate.WithWaiting(value, p, r.now()) }, func() {
		r.restarts.Inc()
		ru.lost, ru.placeholder = -1, &p
	})
}

// compareSet writes what edit makes of the state, if the state is still
// value, and calls done when it was stored. A failed edit is logged: the
// state is torch's and was decoded, so it is a bug of ours.
func (r *Restarter) compareSet(key string, value []byte, edit func() ([]byte, error), done func()) {
	desired, err := edit()
	if err != nil {
		r.log.Error("cannot edit torch's rendezvous state", "key", key, "err", err)
		return
	}
	stored, err := r.store.CompareSet(key, value, desired)
	if err != nil {
		r.log.Warn("cannot write torch's rendezvous state", "key", key, "err", err)
		return
	}
	if stored {
		done()
	}
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
	ru := &run{lost: -1}
	r.runs[id] = ru
	return ru
}

// missing returns the nodes of before that after lacks.
func missing(before, after []torchstate.Participant) []string {
	var gone []string
	for _, p := range before {
		if !slices.ContainsFunc(after, func(q torchstate.Participant) bool { return q.Node == p.Node }) {
			gone = append(gone, p.Node.String())
		}
	}
	return gone
}

// Package torchview is the serving sidecar's view of torchrun's rendezvous, whichever the backend: it logs each
// round that completes and records it as an Event, and serves the state of the last run on GET /rendezvous. The
// backends tell it: the elastic-training backend's rounds (internal/rdzv/c10drounds, through ElasticTrainingState)
// and torch's own backends' (internal/torchbackends/torchrounds, which follows their stores' writes and decodes
// their pickled state). It reads no store and parses no backend's keys, so it depends on none of them.
package torchview

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// Recorder records a round's message where kubectl shows it (jobevents:
// an Event on the job's Job). It must not block.
type Recorder interface {
	Record(msg string)
}

// Config configures a Tracker. Every field is optional.
type Config struct {
	Log *slog.Logger // nil: discard
	// Metrics is where elastic_training_sidecar_rendezvous_rounds_total is registered.
	Metrics prometheus.Registerer
	Events  Recorder         // nil: no Events
	Now     func() time.Time // nil: time.Now
	// Slots, if not nil, gives a member host's slots (the job's membership):
	// the processes torchrun starts there unless the pod set its own
	// nproc-per-node. A round's processes are the sum over its nodes.
	Slots func(host string) (int, bool)
}

// Rounds are reported (a log line, an Event) at most reportBurst at once and
// then one per reportEvery: torch forms a round every few seconds at most,
// and anyone who may write the store could otherwise forge thousands.
const (
	reportBurst = 20
	reportEvery = time.Second
)

// maxRuns bounds the runs a Tracker remembers: a job has one run at a time,
// a few more when it is reinstalled with the same sidecar.
const maxRuns = 16

// Round is one completed round, as its backend tells it.
type Round struct {
	Backend      string // "elastic-training", "c10d", "etcd-v2" or "etcd"
	RunID        string
	Round        string
	Participants int    // -1 when the backend does not say
	Master       string // etcd-v2 and c10d: the round's MASTER_ADDR
	// StateErr: the backend could not read the round's state (torch's pickle); logged with the round.
	StateErr error
}

// RunState is a backend's state of one run, read when /rendezvous is asked for: torch's pickle is decoded then,
// not on every write.
type RunState interface {
	// Current is the run now; ok false when the backend keeps none (torch's legacy etcd backend, or a state it forgot).
	Current() (c Current, ok bool, err error)
}

// Current is a run as its backend has it now.
type Current struct {
	Round            int
	Complete, Closed bool
	Participants     []ViewNode // by rank
	Waiting          []string
	WaitingNodes     int
	Ended            int
}

// Current is c itself: a state that is a value (the elastic-training backend's).
func (c Current) Current() (Current, bool, error) { return c, true, nil }

// Tracker is the view of the rounds its backends tell it.
type Tracker struct {
	log        *slog.Logger
	rounds     *prometheus.CounterVec
	suppressed prometheus.Counter
	events     Recorder
	now        func() time.Time
	slots      func(host string) (int, bool)
	report     *rate.Limiter
	unreported int // rounds not reported since the last one that was; under mu

	mu   sync.Mutex
	runs map[runKey]*run
	seq  uint64 // orders runs by their last write, for eviction
	last *seenRound
}

type runKey struct{ backend, id string }

// run is what the Tracker keeps of one run.
type run struct {
	state  RunState // nil: its backend told none
	logged string   // the last round logged
	seq    uint64
}

type seenRound struct {
	Round
	at time.Time
}

// New returns a Tracker that has seen nothing.
func New(cfg Config) *Tracker {
	t := &Tracker{log: cfg.Log, events: cfg.Events, now: cfg.Now, slots: cfg.Slots, runs: map[runKey]*run{},
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "elastic_training_sidecar", Name: "rendezvous_rounds_total",
			Help: "torch rendezvous rounds completed, by backend."}, []string{"backend"}),
		suppressed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "elastic_training_sidecar", Name: "rendezvous_rounds_unreported_total",
			Help: "Rounds neither logged nor recorded as Events: more than the report rate allows."}),
		report: rate.NewLimiter(rate.Every(reportEvery), reportBurst)}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	if t.now == nil {
		t.now = time.Now
	}
	if cfg.Metrics != nil {
		cfg.Metrics.MustRegister(t.rounds, t.suppressed)
	}
	return t
}

// SetState: the backend's state of run changed.
func (t *Tracker) SetState(backend, run string, st RunState) {
	t.mu.Lock()
	t.runLocked(runKey{backend, run}).state = st
	t.mu.Unlock()
}

// runLocked returns k's run, making room for a new one by forgetting the run
// written to least recently (never the one /rendezvous shows).
func (t *Tracker) runLocked(k runKey) *run {
	t.seq++
	if r, ok := t.runs[k]; ok {
		r.seq = t.seq
		return r
	}
	if len(t.runs) >= maxRuns {
		t.evictLocked(k)
	}
	r := &run{seq: t.seq}
	t.runs[k] = r
	return r
}

// evictLocked forgets the run written to least recently, but the one /rendezvous shows and keep.
func (t *Tracker) evictLocked(keep runKey) {
	var oldest runKey
	var min uint64
	for rk, r := range t.runs {
		if rk != keep && (t.last == nil || rk != (runKey{t.last.Backend, t.last.RunID})) && (min == 0 || r.seq < min) {
			oldest, min = rk, r.seq
		}
	}
	if min != 0 {
		delete(t.runs, oldest)
	}
}

// ElasticTrainingState is a change of the elastic-training backend's run (c10drounds.Config.OnState): its round
// by rank (hosts), the nodes waiting, the participants whose agents ended, closed. The view shows it as it is
// (complete while no node waits: a waiting node makes every agent of the round restart into the next); a new round
// is logged and recorded as torch's are.
func (t *Tracker) ElasticTrainingState(run string, round int, hosts []string, waiting, ended int, closed bool) {
	c := Current{Round: round, Complete: waiting == 0 && !closed, Closed: closed, WaitingNodes: waiting, Ended: ended}
	for rank, h := range hosts {
		c.Participants = append(c.Participants, ViewNode{Node: h, Addr: h, Rank: rank})
	}
	t.SetState(constants.BackendElasticTraining, run, c)
	if round > 0 {
		t.Round(Round{Backend: constants.BackendElasticTraining, RunID: run, Round: strconv.Itoa(round), Participants: len(hosts)}, hosts)
	}
}

// Round logs r and records its Event, once per round; nodes by rank, nil when the backend does not know them.
func (t *Tracker) Round(r Round, nodes []string) {
	k := runKey{r.Backend, r.RunID}
	t.mu.Lock()
	run := t.runLocked(k)
	if run.logged == r.Round {
		t.mu.Unlock()
		return
	}
	run.logged = r.Round
	t.last = &seenRound{Round: r, at: t.now()}
	report, unreported := t.report.AllowN(t.now(), 1), t.unreported
	if report {
		t.unreported = 0
	} else {
		t.unreported++
	}
	t.mu.Unlock()
	t.rounds.WithLabelValues(r.Backend).Inc()
	if !report {
		t.suppressed.Inc()
		return
	}
	if r.StateErr != nil {
		t.log.Warn("cannot read torch's rendezvous state", "backend", r.Backend, "run_id", r.RunID, "err", r.StateErr)
	}
	attrs := []any{"backend", r.Backend, "run_id", r.RunID, "round", r.Round}
	if unreported > 0 {
		attrs = append(attrs, "unreported_before", unreported)
	}
	msg := fmt.Sprintf("torch rendezvous round %s of run %s complete", r.Round, r.RunID)
	if r.Participants >= 0 {
		attrs = append(attrs, "world_size", r.Participants)
		msg += fmt.Sprintf(": %d nodes", r.Participants)
	}
	procs := t.processes(nodes)
	if procs > 0 {
		attrs = append(attrs, "processes", procs)
	}
	if nodes != nil {
		attrs = append(attrs, "nodes", strings.Join(nodes, ","))
	}
	if r.Master != "" {
		attrs = append(attrs, "master", r.Master)
	}
	t.log.Info(msg, attrs...)
	if t.events != nil {
		t.events.Record(eventMessage(r, nodes, procs))
	}
}

// processes is the sum of the nodes' slots, 0 where one is not a member the
// Tracker knows (or it knows none).
func (t *Tracker) processes(nodes []string) int {
	if t.slots == nil || len(nodes) == 0 {
		return 0
	}
	sum := 0
	for _, n := range nodes {
		s, ok := t.slots(n)
		if !ok {
			return 0
		}
		sum += s
	}
	return sum
}

// eventMessage is a round as the Event on the Job says it; procs 0: unknown.
func eventMessage(r Round, nodes []string, procs int) string {
	ev := fmt.Sprintf("Round %s of run %s", r.Round, r.RunID)
	if r.Participants >= 0 {
		// torch's agents, one per pod: WORLD_SIZE is the processes they start, each pod's nproc-per-node.
		ev += fmt.Sprintf(": %d nodes", r.Participants)
		if procs > 0 {
			ev += fmt.Sprintf(", %d processes", procs)
		}
	}
	if nodes != nil {
		short := make([]string, len(nodes))
		for i, n := range nodes {
			short[i], _, _ = strings.Cut(n, ".")
		}
		ev += " (" + strings.Join(short, ", ") + ")"
	}
	return ev
}

// View is the job-level view of the rendezvous that the serving sidecar
// gives on GET /rendezvous (JSON): torch's current state of the last run it
// saw complete a round.
type View struct {
	Backend string `json:"backend"`
	RunID   string `json:"runId"`
	// Round is torch's current round; Complete says whether it formed.
	Round    int  `json:"round"`
	Complete bool `json:"complete"`
	Closed   bool `json:"closed,omitempty"`
	// Participants of Round by rank, with their agents' last keep-alive
	// (dynamic backends; the legacy etcd backend gives only WorldSize).
	Participants []ViewNode `json:"participants,omitempty"`
	WorldSize    int        `json:"worldSize"`
	// Waiting are the nodes that asked to join the next round.
	Waiting []string `json:"waiting,omitempty"`
	// WaitingNodes is the elastic-training backend's count of them (num_nodes_waiting),
	// which it keeps without naming them.
	WaitingNodes int `json:"waitingNodes,omitempty"`
	// Ended is, on the elastic-training backend, how many agents of Round have ended
	// their run (torchrun exited: its workers failed past --max-restarts, or
	// it was stopped) while their pods stay members: the round stays, but
	// does not train with them.
	Ended int `json:"ended,omitempty"`
	// LastCompletedRound is the last round this sidecar saw complete, and when.
	LastCompletedRound int       `json:"lastCompletedRound"`
	LastCompletedAt    time.Time `json:"lastCompletedAt"`
	Now                time.Time `json:"now"`
}

// ViewNode is one agent (torchrun) in a round.
type ViewNode struct {
	Node          string     `json:"node"`
	Addr          string     `json:"addr"`
	Rank          int        `json:"rank"`
	LastHeartbeat *time.Time `json:"lastHeartbeat,omitempty"`
}

// view is the current View; false before any round completed.
func (t *Tracker) view() (View, bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	last := t.last
	if last == nil {
		return View{}, false, nil
	}
	n, _ := strconv.Atoi(last.Round.Round)
	v := View{Backend: last.Backend, RunID: last.RunID, Round: n, Complete: true, WorldSize: last.Participants,
		LastCompletedRound: n, LastCompletedAt: last.at.UTC(), Now: t.now().UTC()}
	r := t.runs[runKey{last.Backend, last.RunID}]
	if r == nil || r.state == nil {
		return v, true, nil
	}
	c, ok, err := r.state.Current()
	if err != nil {
		return View{}, true, err
	}
	if ok {
		v.Round, v.Complete, v.Closed, v.WorldSize = c.Round, c.Complete, c.Closed, len(c.Participants)
		v.Participants, v.Waiting, v.WaitingNodes, v.Ended = c.Participants, c.Waiting, c.WaitingNodes, c.Ended
	}
	return v, true, nil
}

// ServeHTTP is GET /rendezvous on the health port: JSON, or with ?format=table one line per agent (its node rank,
// pod and last keep-alive) for `kubectl get --raw` to print as it is.
func (t *Tracker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	v, ok, err := t.view()
	table := r.URL.Query().Get("format") == "table"
	switch {
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
	case !ok:
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no torch rendezvous round has completed on this sidecar yet"})
	case table:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte(v.Table()))
	default:
		writeJSON(w, http.StatusOK, v)
	}
}

// Table is v as text: a line for the round, then one per agent by node rank (NODE_RANK, POD, KEEP-ALIVE AGO), then
// the agents waiting for the next round.
func (v View) Table() string {
	var b strings.Builder
	state := "forming"
	switch {
	case v.Closed:
		state = "closed"
	case v.Complete:
		state = "complete"
	}
	fmt.Fprintf(&b, "run %s, round %d (%s), %d nodes (WORLD_SIZE = nodes x each pod's processes), backend %s\n", v.RunID, v.Round, state, v.WorldSize, v.Backend)
	if len(v.Participants) > 0 {
		fmt.Fprintf(&b, "%-9s %-48s %s\n", "NODE_RANK", "POD", "KEEP-ALIVE")
	}
	nodes := slices.Clone(v.Participants)
	slices.SortFunc(nodes, func(a, b ViewNode) int { return a.Rank - b.Rank })
	for _, n := range nodes {
		pod, _, _ := strings.Cut(n.Addr, ".")
		ago := "-"
		if n.LastHeartbeat != nil {
			ago = v.Now.Sub(*n.LastHeartbeat).Round(100*time.Millisecond).String() + " ago"
		}
		fmt.Fprintf(&b, "%-9d %-48s %s\n", n.Rank, pod, ago)
	}
	for _, w := range v.Waiting {
		fmt.Fprintf(&b, "waiting for the next round: %s\n", w)
	}
	return b.String()
}

// writeJSON answers v as JSON, or 500 with the reason when v cannot be
// (a forged state's time beyond year 9999): never a status without a body.
func writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		code = http.StatusInternalServerError
		body, _ = json.Marshal(map[string]string{"error": "the rendezvous state cannot be shown: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(body, '\n'))
}

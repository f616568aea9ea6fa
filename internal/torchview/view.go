// Package torchview is the serving sidecar's view of torch's rendezvous. The
// stores that torch's backends use (the etcd v2 keys API, the c10d TCPStore)
// hand it every write; it logs each round that completes and records it as an
// Event, keeps torch's pickled state of the runs it saw, and serves the
// decoded state of the last run on GET /rendezvous. It reads no store itself,
// so it depends on none of them.
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
	"github.com/elastic-training/elastic-training/internal/torchbackends/torchstate"
)

// Recorder records a round's message where kubectl shows it (jobevents:
// an Event on the job's Job). It must not block.
type Recorder interface {
	Record(msg string)
}

// Config configures a Tracker. Every field is optional.
type Config struct {
	Log *slog.Logger // nil: discard
	// Metrics is where rdzv_sidecar_rendezvous_rounds_total is registered.
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
// a few more when it is reinstalled with the same sidecar. maxStateBytes bounds
// their states together: a state is the store's value, held by reference, so
// a run remembered keeps a value the store has replaced alive outside the
// store's quota (16 runs of the largest value were 128 MiB).
const (
	maxRuns       = 16
	maxStateBytes = 32 << 20
)

// Tracker follows torch's rendezvous through the writes it is handed.
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

// run is what the Tracker keeps of one run: torch's state as stored (base64
// of the pickle) and its decoding, made once per change and only when asked.
type run struct {
	state     []byte
	decoded   *torchstate.State
	decodeErr error
	logged    string // the last round logged
	seq       uint64
	own       *ownState // the elastic-training backend's runs: their state as the sidecar decided it
}

// ownState is a run of the elastic-training backend as internal/rdzv/c10drounds last
// reported it: no pickle to decode.
type ownState struct {
	round   int
	hosts   []string // by rank; the core's, never changed once made
	waiting int
	ended   int
	closed  bool
}

type seenRound struct {
	Round
	at time.Time
}

// New returns a Tracker that has seen nothing.
func New(cfg Config) *Tracker {
	t := &Tracker{log: cfg.Log, events: cfg.Events, now: cfg.Now, slots: cfg.Slots, runs: map[runKey]*run{},
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "rdzv_sidecar", Name: "rendezvous_rounds_total",
			Help: "torch rendezvous rounds completed, by backend."}, []string{"backend"}),
		suppressed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "rdzv_sidecar", Name: "rendezvous_rounds_unreported_total",
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

// V2Write is the v2 keys API's v2api.Config.OnWrite: the etcd and etcd-v2
// backends' writes, keys as clients name them.
func (t *Tracker) V2Write(key, value string) {
	if run, ok := torchstate.StateRun(constants.BackendEtcdV2, key); ok {
		t.setState(runKey{constants.BackendEtcdV2, run}, []byte(value))
		return
	}
	if r, ok := roundFromEvent(key, value); ok {
		t.round(r)
	}
}

// C10dWrite is the c10d store's tcpstore.Config.OnSet and OnCompareSet.
// torch's TCPStore client puts "/" in front of every key.
func (t *Tracker) C10dWrite(key string, value []byte) {
	key = strings.TrimPrefix(key, "/")
	if run, ok := torchstate.StateRun(constants.BackendC10d, key); ok {
		t.setState(runKey{constants.BackendC10d, run}, value)
		return
	}
	if r, ok := roundFromStoreKey(constants.BackendC10d, key, string(value)); ok {
		t.round(r)
	}
}

func (t *Tracker) setState(k runKey, state []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.runLocked(k)
	r.state, r.decoded, r.decodeErr = state, nil, nil
	for t.stateBytesLocked() > maxStateBytes && t.evictLocked(k) {
	}
}

// stateBytesLocked is the size of the states the Tracker keeps.
func (t *Tracker) stateBytesLocked() int {
	n := 0
	for _, r := range t.runs {
		n += len(r.state)
	}
	return n
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

// evictLocked forgets the run written to least recently, but the one /rendezvous shows and keep; false when there
// is none to forget.
func (t *Tracker) evictLocked(keep runKey) bool {
	var oldest runKey
	var min uint64
	for rk, r := range t.runs {
		if rk != keep && (t.last == nil || rk != (runKey{t.last.Backend, t.last.RunID})) && (min == 0 || r.seq < min) {
			oldest, min = rk, r.seq
		}
	}
	if min == 0 {
		return false
	}
	delete(t.runs, oldest)
	return true
}

// stateLocked decodes k's state, once per change; ok is false when the run
// has none (the legacy etcd backend keeps none).
func (t *Tracker) stateLocked(k runKey) (st torchstate.State, ok bool, err error) {
	r := t.runs[k]
	if r == nil || r.state == nil {
		return torchstate.State{}, false, nil
	}
	if r.decoded == nil && r.decodeErr == nil {
		s, err := torchstate.DecodeBase64(r.state)
		r.decoded, r.decodeErr = &s, err
	}
	return *r.decoded, true, r.decodeErr
}

// OwnState is a change of the elastic-training backend's run (c10drounds.Config.OnState):
// its round by rank (hosts), the nodes waiting, the participants whose agents
// ended, closed. The view shows it as it is; a new round is logged and
// recorded as torch's are.
func (t *Tracker) OwnState(run string, round int, hosts []string, waiting, ended int, closed bool) {
	k := runKey{constants.BackendElasticTraining, run}
	t.mu.Lock()
	t.runLocked(k).own = &ownState{round: round, hosts: hosts, waiting: waiting, ended: ended, closed: closed}
	t.mu.Unlock()
	if round > 0 {
		t.record(Round{Backend: constants.BackendElasticTraining, RunID: run, Round: strconv.Itoa(round), Participants: len(hosts)}, hosts)
	}
}

// round is a round of torch's own backends: its nodes come from torch's
// state, when the Tracker has the state of that round.
func (t *Tracker) round(r Round) { t.record(r, nil) }

// record logs r and records its Event, once per round; nodes nil: from
// torch's state.
func (t *Tracker) record(r Round, nodes []string) {
	k := runKey{r.Backend, r.RunID}
	t.mu.Lock()
	run := t.runLocked(k)
	if run.logged == r.Round {
		t.mu.Unlock()
		return
	}
	run.logged = r.Round
	var err error
	if nodes == nil {
		var st torchstate.State
		var ok bool
		st, ok, err = t.stateLocked(k)
		if ok && err == nil && strconv.Itoa(st.Round) == r.Round {
			r.Participants = len(st.Participants)
			for _, p := range st.Participants {
				nodes = append(nodes, p.Addr)
			}
		}
	}
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
	if err != nil {
		t.log.Warn("cannot read torch's rendezvous state", "backend", r.Backend, "run_id", r.RunID, "err", err)
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
	if r := t.runs[runKey{last.Backend, last.RunID}]; r != nil && r.own != nil {
		// Complete while no node waits: a waiting node makes every agent of the round restart into the next.
		o := r.own
		v.Round, v.Complete, v.Closed, v.WorldSize, v.WaitingNodes, v.Ended = o.round, o.waiting == 0 && !o.closed, o.closed, len(o.hosts), o.waiting, o.ended
		for rank, h := range o.hosts {
			v.Participants = append(v.Participants, ViewNode{Node: h, Addr: h, Rank: rank})
		}
		return v, true, nil
	}
	st, ok, err := t.stateLocked(runKey{last.Backend, last.RunID})
	if !ok {
		return v, true, nil
	}
	if err != nil {
		return View{}, true, err
	}
	v.Round, v.Complete, v.Closed, v.WorldSize = st.Round, st.Complete, st.Closed, len(st.Participants)
	for _, p := range st.Participants {
		vn := ViewNode{Node: p.String(), Addr: p.Addr, Rank: p.Rank}
		if hb, ok := st.Heartbeats[p.Node]; ok {
			vn.LastHeartbeat = &hb
		}
		v.Participants = append(v.Participants, vn)
	}
	for _, w := range st.Waiting {
		v.Waiting = append(v.Waiting, w.String())
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

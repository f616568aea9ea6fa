// Package c10drounds serves the job's own torchrun rendezvous
// (docs/elastic-training-backend.md) from the serving sidecar's c10d store: it reads
// the agents' readiness from their writes and the membership from the
// sidecar's watch, lets internal/rdzv decide the rounds, and writes each
// round's ranks and the run's state back into the store, where the agents'
// handler (internal/trainerpy) waits for them. Every key is one member's or one
// run's: no agent rewrites what another wrote.
//
// The keys, as stored (torch's client puts the "/" in front of what the
// handler names), with R the run id and N a round:
//
//	/elastic-training/R/ready/<host>      an agent asks for the next round: {"min","max","last_call","ask"}
//	/elastic-training/R/rank/<host>       the sidecar: "<round> <rank> <world size> <ask>" once a round takes the
//	                                      agent (the agent deletes it before it asks again, then waits for it), or
//	                                      "closed" once the run is closed: one wait, woken either way
//	/elastic-training/R/round/N/store/    round N's store (PrefixStore), deleted when round N+1 forms
//	/elastic-training/R/state             the sidecar: "round=N waiting=K" (num_nodes_waiting); anyone else's write of
//	                                      it is written back
//	/elastic-training/R/closed            an agent closed the run (set_closed)
//	/elastic-training/R/leave/<host>      the pod's preStop hook: this member leaves now (a scale-down), before its
//	                                      registration ends with the pod
//	/elastic-training/R/done/<host>       the agent's shutdown: its run ended; it leaves its round without a re-form
package c10drounds

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/progress"
	"github.com/elastic-training/elastic-training/internal/rdzv"
	"github.com/elastic-training/elastic-training/internal/tcpstore"
)

// Prefix begins every key of the elastic-training backend.
const Prefix = tcpstore.BackendKeyPrefix

// Bounds on what an agent may ask for: one job has one run id, and a ready
// value is a few numbers.
const (
	MaxRuns       = 4
	maxRunID      = 128
	maxReadyValue = 1 << 10
	maxNodes      = 1 << 20
	maxLastCall   = time.Hour
	maxAsk        = 64
	// unregisteredTTL: an agent whose host is not a member this long after it asked is forgotten (torch's join
	// timeout); expireEvery: how often a run looks for such asks.
	unregisteredTTL = 10 * time.Minute
	expireEvery     = 10 * time.Second
	// idleRun: a run in which no member has taken part for this long is forgotten, with its keys, when a new
	// run needs its place (MaxRuns).
	idleRun = time.Minute
)

// The keys of run.
func ReadyKey(run, host string) string { return Prefix + run + "/ready/" + host }
func RankKey(run, host string) string  { return Prefix + run + "/rank/" + host }
func StateKey(run string) string       { return Prefix + run + "/state" }
func ClosedKey(run string) string      { return Prefix + run + "/closed" }
func DoneKey(run, host string) string  { return Prefix + run + "/done/" + host }
func RoundPrefix(run string, n int) string {
	return Prefix + run + "/round/" + strconv.Itoa(n) + "/"
}

// Ready is what an agent writes under its ready key: the settings of its
// --nnodes and --rdzv-conf (the run takes the first agent's), and the id of
// its request.
type Ready struct {
	Min      int     `json:"min"`
	Max      int     `json:"max"`
	LastCall float64 `json:"last_call"` // seconds
	// Ask names one request for a round: the agent writes the same id each
	// time it asks again for it, over a new connection after it lost the one
	// it asked on. A round that took it for that request is answered again
	// (its rank written anew): the agent may have deleted the rank before it
	// asked again, and the round's other agents wait for it in their
	// rendezvous, where they do not hear num_nodes_waiting (torch's
	// _assign_worker_ranks until the store's timeout). Empty: an agent of
	// before this field, whose every ask is a new request.
	Ask string `json:"ask,omitempty"`
}

// check checks r and gives the core's settings.
func (r Ready) check() (rdzv.Settings, error) {
	s := rdzv.Settings{Min: r.Min, Max: r.Max, LastCall: time.Duration(r.LastCall * float64(time.Second))}
	if r.Max > maxNodes || r.LastCall < 0 || r.LastCall > maxLastCall.Seconds() {
		return s, fmt.Errorf("ready value: want max <= %d and 0 <= last_call <= %s", maxNodes, maxLastCall)
	}
	if len(r.Ask) > maxAsk || strings.ContainsFunc(r.Ask, func(c rune) bool {
		return !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '-' || c == '_')
	}) {
		return s, fmt.Errorf("ready value: ask: want at most %d letters, digits, '-' or '_'", maxAsk)
	}
	return s, s.Check()
}

// ParseReady reads an agent's ready value: the run's settings it asks with,
// and the id of its request.
func ParseReady(value []byte) (s rdzv.Settings, ask string, err error) {
	if len(value) > maxReadyValue {
		return rdzv.Settings{}, "", fmt.Errorf("ready value: %d bytes, at most %d", len(value), maxReadyValue)
	}
	var r Ready
	if err := json.Unmarshal(value, &r); err != nil {
		return rdzv.Settings{}, "", fmt.Errorf("ready value: %w", err)
	}
	s, err = r.check()
	return s, r.Ask, err
}

// Store is the serving sidecar's c10d store (tcpstore.Server).
type Store interface {
	Set(key string, value []byte) error
	DeletePrefix(prefix string) int
}

// Config configures Rounds.
type Config struct {
	Store Store
	// Members is the sidecar's last listing of the membership, which a run
	// begins with; Member the member at host in it.
	Members func() []membership.Member
	Member  func(host string) (membership.Member, bool)
	Log     *slog.Logger // nil: discard
	// OnState, if not nil, is told of each change of a run's state: a round
	// formed, the nodes waiting, closed (the view, Events). It must not block.
	OnState func(run string, s State)
	Now     func() time.Time // nil: time.Now
	Hang    HangConfig
}

// HangConfig: what Tick does with the ranks' progress (docs/hangs.md).
type HangConfig struct {
	// Enabled: a round whose ranks reported progress and then none advanced for Timeout is restarted.
	Enabled bool
	// Timeout: 0 is progress.Judge's rule (the larger of a minute and ten median steps).
	Timeout time.Duration
	// OnHang, if not nil, is told of each round restarted for a hang (an Event, a metric). It must not block.
	OnHang func(run string, round int, v progress.Verdict)
	// OnStragglers, if not nil, is told of the stragglers a round has (v.Stragglers) when they change. It must not
	// block.
	OnStragglers func(run string, round int, v progress.Verdict)
}

// Rounds follows the runs of the elastic-training backend. It is a
// sidecar.StoreWriteListener and a sidecar.MembershipListener.
type Rounds struct {
	cfg     Config
	refused *rate.Limiter // a flood of bad writes logs a few lines

	mu   sync.Mutex
	runs map[string]*run
}

// run is one run's core, its last-call timer and what it last reported.
type run struct {
	id       string
	core     *rdzv.Run
	timer    *time.Timer
	reported State
	// idleSince: since when no member takes part (zero: one does); expired: when the asks of non-members were
	// last expired.
	idleSince, expired time.Time
	// progress: the current round's ranks as the pods report them; hung: the last round restarted for a hang;
	// stragglers: the ranks last reported slow; everyRank: in some round every rank reported (progress.Job.Expect).
	progress   *progress.Job
	hung       int
	stragglers string
	verdict    progress.Verdict
	everyRank  bool
}

// State is a run's as the sidecar shows it.
type State struct {
	Round   rdzv.Round
	Waiting int
	// Ended are the participants of Round whose agents' runs ended (rdzv.Run.Ended): only the view reads it.
	Ended  int
	Closed bool
	// Hung: the round is restarted because its ranks stopped advancing (Tick): the agents stop their workers at
	// once, a frozen one too, instead of waiting out torch's 30 s between SIGTERM and SIGKILL.
	Hung bool
}

// value is the state key's value ("hung=1" added while a hung round restarts; agents before it read the first two).
func (s State) value() string {
	v := fmt.Sprintf("round=%d waiting=%d", s.Round.Number, s.Waiting)
	if s.Hung && s.Waiting > 0 {
		v += " hung=1"
	}
	return v
}

// New returns Rounds that follow no run yet.
func New(cfg Config) *Rounds {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Rounds{cfg: cfg, runs: map[string]*run{}, refused: rate.NewLimiter(1, 5)}
}

// errIgnored: a write under Prefix that is not the sidecar's business (a
// round's store).
var errIgnored = errors.New("not a rendezvous request")

// C10dWrite takes an agent's ready, done and closed writes, and a preStop
// hook's leave.
func (rs *Rounds) C10dWrite(key string, value []byte) {
	rest, ok := strings.CutPrefix(key, Prefix)
	if !ok {
		return
	}
	if err := rs.write(rest, value); err != nil && !errors.Is(err, errIgnored) && rs.refused.Allow() {
		rs.cfg.Log.Warn("elastic-training backend: ignoring a write", "key", truncate(key), "err", err)
	}
}

// write takes one write under Prefix (rest: the key after it): each key an
// agent or a preStop hook writes is one operation, handled by its own method.
func (rs *Rounds) write(rest string, value []byte) error {
	id, what, _ := strings.Cut(rest, "/")
	if id == "" || len(id) > maxRunID {
		return fmt.Errorf("run id: want 1 to %d bytes", maxRunID)
	}
	op, host, _ := strings.Cut(what, "/")
	handle, ok := operations[op]
	if !ok || (host == "") != (op == "closed" || op == "state") {
		return errIgnored // most writes: the rounds' stores, without the lock
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return handle(rs, id, host, value)
}

// operations handle the keys /elastic-training/<run>/<op>[/<host>] (the package comment).
var operations = map[string]func(rs *Rounds, id, host string, value []byte) error{
	"ready": (*Rounds).readyLocked, "leave": (*Rounds).leaveLocked, "done": (*Rounds).doneLocked,
	"closed": (*Rounds).closedLocked, "state": (*Rounds).stateLocked, "progress": (*Rounds).progressLocked,
}

// progressLocked: a pod's sidecar reports its ranks' progress (internal/progress). A host that is no member, or a
// run that has formed no round, is not heard.
func (rs *Rounds) progressLocked(id, host string, value []byte) error {
	r := rs.runs[id]
	if r == nil || r.progress == nil {
		return nil
	}
	if _, ok := rs.cfg.Member(host); !ok {
		return fmt.Errorf("progress of %s, which is no member", truncate(host))
	}
	rep, err := progress.ParseReport(value)
	if err != nil {
		return err
	}
	r.progress.Update(host, rep, rs.cfg.Now())
	return nil
}

// Tick judges every run's current round by its ranks' progress: a hung round is restarted (the agents restart
// their workers and form the next round with the same members; torch counts no restart for it), once per round.
// The serving sidecar calls it every second.
func (rs *Rounds) Tick() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	now := rs.cfg.Now()
	for _, r := range rs.runs {
		if r.progress == nil {
			continue
		}
		round := r.core.Current().Number
		v := r.progress.Judge(now, rs.cfg.Hang.Timeout)
		r.verdict = v
		if !r.everyRank && r.progress.Complete() {
			r.everyRank, r.progress.BlameAbsent = true, true
		}
		if r.core.Closed() || r.core.Waiting() > 0 || r.core.Ended() > 0 {
			continue // re-forming (a scale, a loss, a restart) or ending: its ranks stop for that, not for a hang
		}
		if v.Hung && rs.cfg.Hang.Enabled && r.hung != round && r.core.Restart() {
			r.hung = round
			rs.cfg.Log.Warn(fmt.Sprintf("elastic-training backend: round %d hung: no rank advanced for %s (timeout %s); restarting its workers", round,
				v.Idle.Round(time.Second), v.Timeout), "run_id", r.id, "round", round, "step", v.Step, "stopped_first", progress.Join(v.Stopped))
			rs.decideLocked(r)
			if rs.cfg.Hang.OnHang != nil {
				rs.cfg.Hang.OnHang(r.id, round, v)
			}
			continue
		}
		if ranks := stragglerRanks(v.Stragglers); ranks != r.stragglers {
			r.stragglers = ranks
			if s := progress.Join(v.Stragglers); s != "" {
				rs.cfg.Log.Warn("elastic-training backend: stragglers: ranks that advance, slower than the median", "run_id", r.id, "round", round,
					"median_step", v.StepTime.String(), "stragglers", s)
			}
			if rs.cfg.Hang.OnStragglers != nil {
				rs.cfg.Hang.OnStragglers(r.id, round, v)
			}
		}
	}
}

// Progress is the verdict of run id's current round as of the last Tick (zero: none).
func (rs *Rounds) Progress(id string) progress.Verdict {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if r := rs.runs[id]; r != nil {
		return r.verdict
	}
	return progress.Verdict{}
}

// stragglerRanks are the slow ranks' numbers: a change of them is news, a change of their figures is not.
func stragglerRanks(ss []progress.Straggler) string {
	var b strings.Builder
	for _, x := range ss {
		fmt.Fprintf(&b, "%d,", x.Rank)
	}
	return b.String()
}

// closedLocked: an agent closed the run (torch's set_closed); every agent waiting for a round is told so.
func (rs *Rounds) closedLocked(id, _ string, _ []byte) error {
	if r := rs.runs[id]; r != nil && !r.core.Closed() {
		for _, h := range r.core.Close() {
			rs.tellClosedLocked(r, h)
		}
		rs.cfg.Log.Info("elastic-training backend: run closed", "run_id", id, "round", r.core.Current().Number)
		rs.decideLocked(r)
	}
	return nil
}

// stateLocked: the sidecar's own writes are not handed here, so someone else wrote num_nodes_waiting's key. The
// agents must read what the sidecar decided: it is written back.
func (rs *Rounds) stateLocked(id, _ string, _ []byte) error {
	if r := rs.runs[id]; r != nil && rs.writeStateLocked(r, r.reported) && rs.refused.Allow() {
		rs.cfg.Log.Warn("elastic-training backend: a client wrote the state key, which is the sidecar's: written back", "run_id", id, "state", r.reported.value())
	}
	return nil
}

// leaveLocked: the pod's preStop hook says its member leaves now (a scale-down), before its registration ends.
func (rs *Rounds) leaveLocked(id, host string, _ []byte) error {
	if r := rs.runs[id]; r != nil && r.core.Leave(host) {
		rs.cfg.Log.Info("elastic-training backend: a member leaves before its pod stops", "run_id", id, "host", host)
		rs.decideLocked(r)
	}
	return nil
}

// doneLocked: not a loss: the agent finished (or failed for good, or was stopped after its pod's preStop said so).
// The others finish their own run; the next round, if any, does not wait for it.
func (rs *Rounds) doneLocked(id, host string, _ []byte) error {
	if r := rs.runs[id]; r != nil {
		r.core.Done(host)
		rs.cfg.Log.Debug("elastic-training backend: an agent is done", "run_id", id, "host", host)
		rs.decideLocked(r)
	}
	return nil
}

// readyLocked: host's agent asks for the next round (value: Ready).
func (rs *Rounds) readyLocked(id, host string, value []byte) error {
	if err := membership.ValidateHost(host); err != nil {
		return err
	}
	s, ask, err := ParseReady(value)
	if err != nil {
		return err
	}
	r, err := rs.runLocked(id, s)
	if err != nil {
		return err
	}
	if r.core.Closed() {
		// It asked as the run was being closed. Only a member is answered: a key per forged host would grow the
		// store.
		if _, ok := rs.cfg.Member(host); ok {
			rs.tellClosedLocked(r, host)
		}
		return nil
	}
	now := rs.cfg.Now()
	if !r.core.Member(host) {
		if m, ok := rs.cfg.Member(host); ok {
			r.core.Joined(m)
		} else if now.Sub(r.expired) >= expireEvery {
			r.expired = now
			r.core.Expire(now.Add(-unregisteredTTL))
		}
	}
	switch a := r.core.Ask(host, s, ask, now); {
	case a.Leaving:
		rs.cfg.Log.Debug("elastic-training backend: not taking a leaving member's agent into a round", "run_id", id, "host", host)
	case a.Again:
		// It lost the connection it asked on, and may have deleted its rank.
		round := r.core.Current()
		rs.cfg.Log.Debug("elastic-training backend: an agent asked again for the round it has", "run_id", id, "host", host, "round", round.Number)
		rs.writeRankLocked(r, round, round.Rank(host), ask)
	default:
		rs.decideLocked(r)
		if a.Forgotten != "" && rs.refused.Allow() {
			rs.cfg.Log.Warn(fmt.Sprintf("elastic-training backend: %d agents of hosts that are not members wait: forgot the one of %s, which asked first",
				rdzv.MaxUnregistered, truncate(a.Forgotten)), "run_id", id)
		}
	}
	return nil
}

// runLocked is run id, begun with s if it is new.
func (rs *Rounds) runLocked(id string, s rdzv.Settings) (*run, error) {
	if r := rs.runs[id]; r != nil {
		return r, nil
	}
	if len(rs.runs) >= MaxRuns {
		rs.forgetIdleLocked()
	}
	if len(rs.runs) >= MaxRuns {
		return nil, fmt.Errorf("run %q: the store follows at most %d runs, in each of which a member took part within %s", id, MaxRuns, idleRun)
	}
	core, err := rdzv.New(s)
	if err != nil {
		return nil, err
	}
	for _, m := range rs.cfg.Members() {
		core.Joined(m)
	}
	r := &run{id: id, core: core, idleSince: rs.cfg.Now()}
	rs.runs[id] = r
	rs.cfg.Log.Info("elastic-training backend: run begun", "run_id", id, "min", s.Min, "max", s.Max, "last_call", s.LastCall)
	return r, nil
}

// forgetIdleLocked forgets the runs in which no member has taken part for idleRun (a job's earlier runs, or runs
// only hosts that are not members asked for), with their keys.
func (rs *Rounds) forgetIdleLocked() {
	now := rs.cfg.Now()
	for id, r := range rs.runs {
		if r.idleSince.IsZero() || now.Sub(r.idleSince) < idleRun {
			continue
		}
		if r.timer != nil {
			r.timer.Stop()
		}
		delete(rs.runs, id)
		n := rs.cfg.Store.DeletePrefix(Prefix + id + "/")
		rs.cfg.Log.Info("elastic-training backend: forgot a run no member took part in", "run_id", id, "idle", now.Sub(r.idleSince).Round(time.Second).String(), "keys_dropped", n)
	}
}

// MembersChanged tells every run of the members that joined and left.
func (rs *Rounds) MembersChanged(joined, left []string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var ms []membership.Member
	for _, h := range joined {
		if m, ok := rs.cfg.Member(h); ok {
			ms = append(ms, m)
		}
	}
	for _, r := range rs.runs {
		for _, h := range left {
			r.core.Left(h)
			if r.progress != nil {
				r.progress.Forget(h)
			}
		}
		for _, m := range ms {
			r.core.Joined(m)
		}
		rs.decideLocked(r)
	}
}

// decideLocked forms r's next round if it is due, asks again at the last
// call, and writes the state when it changed.
func (rs *Rounds) decideLocked(r *run) {
	now := rs.cfg.Now()
	round, formed, again := r.core.Next(now)
	if formed {
		rs.writeRoundLocked(r, round)
	}
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	if !again.IsZero() {
		r.timer = time.AfterFunc(again.Sub(now), func() {
			rs.mu.Lock()
			defer rs.mu.Unlock()
			if rs.runs[r.id] == r {
				rs.decideLocked(r)
			}
		})
	}
	switch live := r.core.Live(); {
	case live:
		r.idleSince = time.Time{}
	case r.idleSince.IsZero():
		r.idleSince = now
	}
	st := State{Round: r.core.Current(), Waiting: r.core.Waiting(), Ended: r.core.Ended(), Closed: r.core.Closed()}
	st.Hung = r.hung != 0 && r.hung == st.Round.Number
	if st.Round.Number == r.reported.Round.Number && st.Waiting == r.reported.Waiting && st.Ended == r.reported.Ended &&
		st.Closed == r.reported.Closed && st.Hung == r.reported.Hung {
		return
	}
	if st.value() != r.reported.value() { // not when only Closed or Ended changed: the agents read the closed key
		if !rs.writeStateLocked(r, st) {
			return
		}
	}
	r.reported = st
	if rs.cfg.OnState != nil {
		rs.cfg.OnState(r.id, st)
	}
}

// writeStateLocked writes r's state key (num_nodes_waiting); false: it could not.
func (rs *Rounds) writeStateLocked(r *run, st State) bool {
	if err := rs.cfg.Store.Set(StateKey(r.id), []byte(st.value())); err != nil {
		rs.cfg.Log.Error("elastic-training backend: cannot write the state", "run_id", r.id, "state", st.value(), "err", err)
		return false
	}
	return true
}

// writeRoundLocked gives each participant of round its rank, then drops the
// store of the round before it: every participant of that one has asked for
// this one.
func (rs *Rounds) writeRoundLocked(r *run, round rdzv.Round) {
	world := len(round.Participants)
	r.progress, r.verdict, r.stragglers = progress.NewJob(rs.cfg.Now()), progress.Verdict{}, ""
	// Global ranks as torch gives them: each node's processes in turn, in node rank order.
	var hosts []string
	for _, h := range round.Participants {
		slots := 1
		if m, ok := rs.cfg.Member(h); ok && m.Slots > 0 {
			slots = m.Slots
		}
		for range slots {
			hosts = append(hosts, h)
		}
	}
	r.progress.Expect(hosts)
	r.progress.BlameAbsent = r.everyRank
	for rank, h := range round.Participants {
		rs.writeRankLocked(r, round, rank, r.core.Answered(h))
	}
	dropped := 0
	if round.Number > 1 {
		dropped = rs.cfg.Store.DeletePrefix(RoundPrefix(r.id, round.Number-1))
	}
	// Debug: the view logs each round for every backend (OnState).
	rs.cfg.Log.Debug(fmt.Sprintf("elastic-training backend: round %d of run %s: %d nodes", round.Number, r.id, world),
		"run_id", r.id, "round", round.Number, "world_size", world, "participants", summary(round.Participants), "keys_dropped", dropped)
}

// writeRankLocked tells the agent of round's participant rank, which asked
// with ask, its rank. (An agent of before Ready.Ask reads three fields.)
func (rs *Rounds) writeRankLocked(r *run, round rdzv.Round, rank int, ask string) {
	h := round.Participants[rank]
	v := fmt.Sprintf("%d %d %d", round.Number, rank, len(round.Participants))
	if ask != "" {
		v += " " + ask
	}
	if err := rs.cfg.Store.Set(RankKey(r.id, h), []byte(v)); err != nil {
		rs.cfg.Log.Error("elastic-training backend: cannot write a rank", "run_id", r.id, "round", round.Number, "host", h, "err", err)
	}
}

// closed is the rank key's value once the run is closed.
const closed = "closed"

// tellClosedLocked wakes host's agent, which waits for its rank: there will be
// none.
func (rs *Rounds) tellClosedLocked(r *run, host string) {
	if err := rs.cfg.Store.Set(RankKey(r.id, host), []byte(closed)); err != nil {
		rs.cfg.Log.Error("elastic-training backend: cannot tell an agent the run is closed", "run_id", r.id, "host", host, "err", err)
	}
}

// Stop ends the last-call timers.
func (rs *Rounds) Stop() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, r := range rs.runs {
		if r.timer != nil {
			r.timer.Stop()
		}
	}
}

// summary names the first few hosts of a round, for a log line that stays
// short at 4,096 nodes.
func summary(hosts []string) string {
	const show = 8
	if len(hosts) <= show {
		return strings.Join(hosts, ",")
	}
	return fmt.Sprintf("%s,... (%d more)", strings.Join(hosts[:show], ","), len(hosts)-show)
}

func truncate(s string) string {
	if len(s) > 96 {
		return s[:96] + "..."
	}
	return s
}

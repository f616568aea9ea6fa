package sidecar

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/torchstate"
)

// Round is one completed torch rendezvous round, as seen in the v2 or c10d store.
type Round struct {
	Backend      string // "etcd", "etcd-v2" or "c10d"
	RunID        string
	Round        string
	Participants int    // -1 when the backend does not say
	Master       string // etcd-v2 and c10d: the round's MASTER_ADDR
}

var activeVersionRe = regexp.MustCompile(`/run_([^/]+)/rdzv/active_version$`)

// roundFromEvent recognises the writes that complete a torch round:
//   - `etcd` backend: <prefix>/run_<id>/rdzv/active_version becomes
//     {"status": "final", "version": N, "participants": [...]};
//   - `etcd-v2` backend: the rank-0 agent stores MASTER_ADDR in the round's
//     store, key /torch/elastic/store/base64("torch.rendezvous.<id>.<round>/MASTER_ADDR").
//
// It is pure, so the parsing is unit-tested without torch.
func roundFromEvent(key string, value string) (Round, bool) {
	if m := activeVersionRe.FindStringSubmatch(key); m != nil {
		var st struct {
			Status       string `json:"status"`
			Version      string `json:"version"`
			Participants []any  `json:"participants"`
		}
		if json.Unmarshal([]byte(value), &st) != nil || st.Status != "final" {
			return Round{}, false
		}
		return Round{Backend: "etcd", RunID: m[1], Round: st.Version, Participants: len(st.Participants)}, true
	}
	const storePrefix = "/torch/elastic/store/"
	if strings.HasPrefix(key, storePrefix) {
		raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(key, storePrefix))
		if err != nil {
			return Round{}, false
		}
		master := ""
		if v, err := base64.StdEncoding.DecodeString(value); err == nil {
			master = string(v)
		}
		return roundFromStoreKey(constants.BackendEtcdV2, string(raw), master)
	}
	return Round{}, false
}

// roundFromStoreKey recognises the key torch's dynamic rendezvous (etcd-v2
// and c10d) writes once per round, in the rendezvous store: the rank-0
// agent's MASTER_ADDR under the round's prefix "torch.rendezvous.<id>.<round>/".
func roundFromStoreKey(backend, key, master string) (Round, bool) {
	rest, ok := strings.CutPrefix(key, "torch.rendezvous.")
	if !ok || !strings.HasSuffix(rest, "/MASTER_ADDR") {
		return Round{}, false
	}
	rest = strings.TrimSuffix(rest, "/MASTER_ADDR")
	i := strings.LastIndexByte(rest, '.')
	if i < 0 {
		return Round{}, false
	}
	return Round{Backend: backend, RunID: rest[:i], Round: rest[i+1:], Participants: -1, Master: master}, true
}

// roundLogger logs one line per torch rendezvous round written through the
// v2 API (v2api.Config.OnWrite calls observe for every successful write) or
// the c10d store (observeC10d), and keeps the last one for /rendezvous.
type roundLogger struct {
	mu   sync.Mutex
	seen map[string]bool
	last *seenRound
	log  *slog.Logger
	m    *metrics
	// state returns torch's pickled state (base64, as stored) of a dynamic
	// rendezvous (etcd-v2, c10d); nil until the stores exist.
	state func(backend, runID string) ([]byte, bool)
	now   func() time.Time
	// events, when set, records each round as an Event on the job's Job.
	events *roundEvents
}

type seenRound struct {
	Round
	at time.Time
}

func newRoundLogger(log *slog.Logger, m *metrics) *roundLogger {
	return &roundLogger{seen: map[string]bool{}, log: log, m: m, now: time.Now}
}

func (l *roundLogger) observe(key, value string) {
	if r, ok := roundFromEvent(key, value); ok {
		l.round(r)
	}
}

// observeC10d is the c10d store's tcpstore.Config.OnSet. torch's TCPStore
// client puts "/" in front of every key.
func (l *roundLogger) observeC10d(key string, value []byte) {
	if r, ok := roundFromStoreKey(constants.BackendC10d, strings.TrimPrefix(key, "/"), string(value)); ok {
		l.round(r)
	}
}

func (l *roundLogger) round(r Round) {
	id := r.Backend + "/" + r.RunID + "/" + r.Round
	l.mu.Lock()
	dup := l.seen[id]
	l.seen[id] = true
	l.mu.Unlock()
	if dup {
		return
	}
	var nodes []string
	if st, err := l.decode(r.Backend, r.RunID); err == nil && strconv.Itoa(st.Round) == r.Round {
		r.Participants = len(st.Participants)
		for _, p := range st.Participants {
			nodes = append(nodes, p.Addr)
		}
	} else if err != nil && !errors.Is(err, errNoState) {
		l.log.Warn("cannot read torch's rendezvous state", "backend", r.Backend, "run_id", r.RunID, "err", err)
	}
	l.mu.Lock()
	l.last = &seenRound{Round: r, at: l.now()}
	l.mu.Unlock()
	l.m.rounds.WithLabelValues(r.Backend).Inc()
	attrs := []any{"backend", r.Backend, "run_id", r.RunID, "round", r.Round}
	msg := fmt.Sprintf("torch rendezvous round %s of run %s complete", r.Round, r.RunID)
	if r.Participants >= 0 {
		attrs = append(attrs, "world_size", r.Participants)
		msg += fmt.Sprintf(": %d nodes", r.Participants)
	}
	if nodes != nil {
		attrs = append(attrs, "nodes", strings.Join(nodes, ","))
	}
	if r.Master != "" {
		attrs = append(attrs, "master", r.Master)
	}
	l.log.Info(msg, attrs...)
	if l.events != nil {
		ev := fmt.Sprintf("Round %s of run %s", r.Round, r.RunID)
		if r.Participants >= 0 {
			ev += fmt.Sprintf(": world size %d", r.Participants)
		}
		if nodes != nil {
			short := make([]string, len(nodes))
			for i, n := range nodes {
				short[i], _, _ = strings.Cut(n, ".")
			}
			ev += " (" + strings.Join(short, ", ") + ")"
		}
		l.events.record(ev)
	}
}

var errNoState = errors.New("no rendezvous state")

// decode reads torch's current state of a dynamic rendezvous.
func (l *roundLogger) decode(backend, runID string) (torchstate.State, error) {
	if l.state == nil || backend == constants.BackendEtcd {
		return torchstate.State{}, errNoState
	}
	raw, ok := l.state(backend, runID)
	if !ok {
		return torchstate.State{}, errNoState
	}
	return torchstate.DecodeBase64(raw)
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
func (l *roundLogger) view() (View, bool, error) {
	l.mu.Lock()
	last := l.last
	l.mu.Unlock()
	if last == nil {
		return View{}, false, nil
	}
	n, _ := strconv.Atoi(last.Round.Round)
	v := View{Backend: last.Backend, RunID: last.RunID, Round: n, Complete: true, WorldSize: last.Participants,
		LastCompletedRound: n, LastCompletedAt: last.at.UTC(), Now: l.now().UTC()}
	st, err := l.decode(last.Backend, last.RunID)
	if errors.Is(err, errNoState) {
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

// serveView is GET /rendezvous on the health port.
func (l *roundLogger) serveView(w http.ResponseWriter, _ *http.Request) {
	v, ok, err := l.view()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case err != nil:
		w.WriteHeader(http.StatusInternalServerError)
		json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
	case !ok:
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(map[string]string{"error": "no torch rendezvous round has completed on this sidecar yet"})
	default:
		json.NewEncoder(w).Encode(v)
	}
}

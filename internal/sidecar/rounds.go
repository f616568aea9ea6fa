package sidecar

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// Round is one completed torch rendezvous round, as seen in the v2 store.
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
// the c10d store (observeC10d).
type roundLogger struct {
	mu   sync.Mutex
	seen map[string]bool
	log  *slog.Logger
	m    *metrics
}

func newRoundLogger(log *slog.Logger, m *metrics) *roundLogger {
	return &roundLogger{seen: map[string]bool{}, log: log, m: m}
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
	l.m.rounds.WithLabelValues(r.Backend).Inc()
	attrs := []any{"backend", r.Backend, "run_id", r.RunID, "round", r.Round}
	if r.Participants >= 0 {
		attrs = append(attrs, "participants", r.Participants)
	}
	if r.Master != "" {
		attrs = append(attrs, "master", r.Master)
	}
	l.log.Info(fmt.Sprintf("torch rendezvous round %s of run %s complete", r.Round, r.RunID), attrs...)
}

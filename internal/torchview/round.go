package torchview

import (
	"encoding/base64"
	"encoding/json"
	"regexp"
	"strings"

	"github.com/elastic-training/elastic-training/internal/constants"
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

// The keys torch's dynamic rendezvous keeps its pickled state under (base64
// of the pickle): etcd_rendezvous_backend's v2 key and
// c10d_rendezvous_backend's store key, each followed by the run id.
const (
	v2StatePrefix   = "/torch/elastic/rendezvous/"
	c10dStatePrefix = "torch.rendezvous."
	v2StorePrefix   = "/torch/elastic/store/"
)

// roundFromEvent recognises the v2 writes that complete a torch round:
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
		return Round{Backend: constants.BackendEtcd, RunID: m[1], Round: st.Version, Participants: len(st.Participants)}, true
	}
	if strings.HasPrefix(key, v2StorePrefix) {
		raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(key, v2StorePrefix))
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
	rest, ok := strings.CutPrefix(key, c10dStatePrefix)
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

// stateRun says whether key is where a dynamic backend keeps a run's state,
// and which run.
func stateRun(backend, key string) (string, bool) {
	prefix := v2StatePrefix
	if backend == constants.BackendC10d {
		prefix = c10dStatePrefix
	}
	run, ok := strings.CutPrefix(key, prefix)
	if !ok || run == "" || strings.Contains(run, "/") {
		return "", false
	}
	return run, true
}

package torchview

import (
	"encoding/base64"
	"encoding/json"
	"regexp"
	"strings"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/torchbackends/torchstate"
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

// v2StorePrefix is where the etcd-v2 backend keeps each round's store.
const v2StorePrefix = "/torch/elastic/store/"

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
	rest, ok := strings.CutPrefix(key, torchstate.C10dKeyPrefix)
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

package torchrounds

import (
	"encoding/base64"
	"encoding/json"
	"regexp"
	"strings"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/torchbackends/torchstate"
	"github.com/elastic-training/elastic-training/internal/torchview"
)

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
func roundFromEvent(key string, value string) (torchview.Round, bool) {
	if m := activeVersionRe.FindStringSubmatch(key); m != nil {
		var st struct {
			Status       string `json:"status"`
			Version      string `json:"version"`
			Participants []any  `json:"participants"`
		}
		if json.Unmarshal([]byte(value), &st) != nil || st.Status != "final" {
			return torchview.Round{}, false
		}
		return torchview.Round{Backend: constants.BackendEtcd, RunID: m[1], Round: st.Version, Participants: len(st.Participants)}, true
	}
	if strings.HasPrefix(key, v2StorePrefix) {
		raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(key, v2StorePrefix))
		if err != nil {
			return torchview.Round{}, false
		}
		master := ""
		if v, err := base64.StdEncoding.DecodeString(value); err == nil {
			master = string(v)
		}
		return roundFromStoreKey(constants.BackendEtcdV2, string(raw), master)
	}
	return torchview.Round{}, false
}

// roundFromStoreKey recognises the key torch's dynamic rendezvous (etcd-v2
// and c10d) writes once per round, in the rendezvous store: the rank-0
// agent's MASTER_ADDR under the round's prefix "torch.rendezvous.<id>.<round>/".
func roundFromStoreKey(backend, key, master string) (torchview.Round, bool) {
	rest, ok := strings.CutPrefix(key, torchstate.C10dKeyPrefix)
	if !ok || !strings.HasSuffix(rest, "/MASTER_ADDR") {
		return torchview.Round{}, false
	}
	rest = strings.TrimSuffix(rest, "/MASTER_ADDR")
	i := strings.LastIndexByte(rest, '.')
	if i < 0 {
		return torchview.Round{}, false
	}
	return torchview.Round{Backend: backend, RunID: rest[:i], Round: rest[i+1:], Participants: -1, Master: master}, true
}

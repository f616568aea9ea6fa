package v2api

import (
	"container/heap"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/etcdserver/api/v2error"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
)

// What the v2 store may hold. etcd's v2 store has no quota of its own, and its event history (the last
// historyLen changes, which a watcher may resume from with waitIndex) keeps every value it mentions alive after
// the key is deleted or rewritten: 24 PUTs of 8 MB kept 206 MiB after they were deleted, and 1,000 events of the
// largest value etcd's HTTP form parser accepts (10 MB) would keep 10 GB. So a value replaced, deleted or expired
// keeps counting against the quota until historyLen more changes have pushed its last mention out of the
// history: the quota bounds the store and its history together, exactly, without reaching into etcd's history.
const (
	// DefaultMaxValueLen is about five times torch's rendezvous state of 1,024 nodes in base64 (100-150 bytes a node
	// pickled), the largest value torch writes.
	DefaultMaxValueLen = 1 << 20
	// DefaultMaxKeyLen matches the c10d store's key limit. A key's directories each hold their whole path in
	// etcd's store, so a key costs up to the square of its length.
	DefaultMaxKeyLen = 8 << 10
	// DefaultMaxBytes and DefaultMaxReplyBytes are for a server that is given no share of a memory limit
	// (serve gives it its share: internal/membudget): a few recursive GETs of the largest tree.
	DefaultMaxBytes      = 256 << 20
	DefaultMaxReplyBytes = 64 << 20
	// historyLen is etcd's v2 event history (v2store.New: newWatchHub(1000)).
	historyLen = 1000
	// nodeOverhead is what one node costs besides its path and value: etcd's node, its map entry in the parent,
	// and this package's mirror of it (measured, rounded up).
	nodeOverhead = 320
)

// torchPrefixes are where torch's etcd backends keep their keys (etcd-v2: /torch/elastic/rendezvous/<run>, the
// legacy etcd backend: /torchelastic/p2p/run_<run>/..., its store under that): the last eighth of the quota is
// theirs, so that a client that fills the store with keys of its own leaves the rendezvous room to go on.
var torchPrefixes = []string{storeKeysPrefix + "/torch/elastic/", storeKeysPrefix + "/torchelastic/"}

func isTorchKey(p string) bool {
	for _, pre := range torchPrefixes {
		if strings.HasPrefix(p, pre) {
			return true
		}
	}
	return false
}

// mnode mirrors one node of the store: what it costs, and for a directory its children.
type mnode struct {
	cost   int64 // len(path) + nodeOverhead + len(value)
	value  int64
	dir    bool
	expire time.Time
	kids   map[string]*mnode
}

type retainedValue struct {
	until uint64 // the store index after which the history no longer mentions it
	bytes int64
}

// quota keeps the cost of the store's nodes and of the values its history still holds. Its methods are called
// with Server.wmu held, around the store call they account for.
type quota struct {
	max      int64
	maxValue int
	maxKey   int
	root     *mnode
	used     int64 // nodes, plus retained
	retained []retainedValue
	held     int64 // retained's bytes
	expiring expiryHeap
}

func newQuota(maxBytes int64, maxValue, maxKey int) *quota {
	return &quota{max: maxBytes, maxValue: maxValue, maxKey: maxKey, root: &mnode{dir: true, kids: map[string]*mnode{}}}
}

// errTooLarge and errFull are refusals, told to the client as etcd errors: 209 (python-etcd's EtcdValueError) for
// a value or key past its limit, 300 for a full store (etcd's code for a write its server could not apply).
func errTooLarge(what string, n, limit int, flag string) *v2error.Error {
	return v2error.NewError(v2error.EcodeInvalidField, fmt.Sprintf("%s is %d bytes, more than the %d this store accepts (%s)", what, n, limit, flag), 0)
}

// checkRequest refuses a write whose key or value is past its limit, before the store sees it.
func (q *quota) checkRequest(r *request) *v2error.Error {
	if len(r.Path) > q.maxKey+len(storeKeysPrefix) {
		return errTooLarge("the key", len(r.Path)-len(storeKeysPrefix), q.maxKey, "--v2-max-key-bytes")
	}
	if len(r.Value) > q.maxValue {
		return errTooLarge("the value", len(r.Value), q.maxValue, "--v2-max-value-bytes")
	}
	return nil
}

// admit refuses a write that could take the store past the quota: its key's new nodes and its value, with nothing
// taken off for a value it replaces (that one stays in the history). index is the store's index now.
func (q *quota) admit(p string, valueLen int, index uint64) *v2error.Error {
	q.release(index)
	need := int64(valueLen)
	n, segs := q.root, splitPath(p)
	at := 0
	for i, seg := range segs {
		at += 1 + len(seg)
		if n != nil {
			n = n.kids[seg]
		}
		if n == nil || i == len(segs)-1 {
			need += int64(at) + nodeOverhead
		}
	}
	limit := q.max
	if !isTorchKey(p) {
		limit -= q.max / 8
	}
	if q.used+need > limit {
		reserve := ""
		if !isTorchKey(p) {
			reserve = fmt.Sprintf(" (the last eighth is kept for torch's keys, %s*)", strings.Join(trimmed(torchPrefixes), "*, "))
		}
		return v2error.NewError(v2error.EcodeRaftInternal, fmt.Sprintf("store full: %d of %d bytes used by keys, values and the "+
			"values the last %d changes still mention; this write needs %d (--v2-max-bytes)%s", q.used, q.max, historyLen, need, reserve), index)
	}
	return nil
}

func trimmed(ps []string) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = strings.TrimPrefix(p, storeKeysPrefix)
	}
	return out
}

func splitPath(p string) []string { return strings.Split(strings.Trim(p, "/"), "/") }

// lookup returns the node at p and its parent (nil when absent).
func (q *quota) lookup(p string) (n, parent *mnode, name string) {
	n = q.root
	for _, seg := range splitPath(p) {
		if n == nil || n.kids == nil {
			return nil, nil, ""
		}
		parent, name, n = n, seg, n.kids[seg]
	}
	return n, parent, name
}

// written accounts for a successful write of p (a value, or a directory with dir), expiring at expire (zero:
// never). A value it replaced (not a refresh, which keeps the same one) is retained until the history forgets it.
func (q *quota) written(p string, dir bool, value string, expire time.Time, refresh bool, index uint64) {
	n, segs, at := q.root, splitPath(p), 0
	for i, seg := range segs {
		at += 1 + len(seg)
		k := n.kids[seg]
		if i == len(segs)-1 {
			if k != nil && !refresh {
				q.removed(k, index)
			}
			nk := &mnode{cost: int64(at) + nodeOverhead, dir: dir}
			if dir {
				nk.kids = map[string]*mnode{}
			} else {
				nk.value = int64(len(value))
				nk.cost += nk.value
			}
			if refresh && k != nil {
				nk = k // same node, same value: only its expiry changes
			} else {
				q.used += nk.cost
				n.kids[strings.Clone(seg)] = nk
			}
			nk.expire = expire
			if !expire.IsZero() {
				heap.Push(&q.expiring, expiry{at: expire, path: p, n: nk})
			}
			return
		}
		if k == nil {
			k = &mnode{cost: int64(at) + nodeOverhead, dir: true, kids: map[string]*mnode{}}
			q.used += k.cost
			n.kids[strings.Clone(seg)] = k
		}
		n = k
	}
}

// deleted accounts for p deleted (with everything under it) at index.
func (q *quota) deleted(p string, index uint64) {
	n, parent, name := q.lookup(p)
	if n == nil || parent == nil {
		return
	}
	delete(parent.kids, name)
	q.removed(n, index)
}

// removed takes n and its subtree off the store's nodes; their values stay counted until the history forgets them.
func (q *quota) removed(n *mnode, index uint64) {
	var walk func(*mnode) int64
	walk = func(n *mnode) int64 {
		v := n.value
		q.used -= n.cost - n.value
		n.expire = time.Time{} // its heap entry is stale now
		for _, k := range n.kids {
			v += walk(k)
		}
		return v
	}
	if v := walk(n); v > 0 {
		q.retained = append(q.retained, retainedValue{until: index + historyLen, bytes: v})
		q.held += v
	}
}

// release lets go of the values the history no longer mentions at index.
func (q *quota) release(index uint64) {
	i := 0
	for i < len(q.retained) && q.retained[i].until <= index {
		q.used -= q.retained[i].bytes
		q.held -= q.retained[i].bytes
		i++
	}
	if i > 0 {
		q.retained = q.retained[i:]
		if cap(q.retained) > 64 && len(q.retained) < cap(q.retained)/4 {
			q.retained = append([]retainedValue(nil), q.retained...)
		}
	}
}

// expired accounts for etcd's expiry pass up to cutoff, which ended at index: the same keys expire here, since
// each node's expiry is the one the store was given.
func (q *quota) expired(cutoff time.Time, index uint64) {
	for q.expiring.Len() > 0 && !q.expiring[0].at.After(cutoff) {
		e := heap.Pop(&q.expiring).(expiry)
		if n, _, _ := q.lookup(e.path); n == e.n && n.expire.Equal(e.at) {
			q.deleted(e.path, index)
		}
	}
}

// expiry is a key's expiry time as the store was given it; entries whose node has since been rewritten,
// refreshed or deleted are stale and skipped.
type expiry struct {
	at   time.Time
	path string
	n    *mnode
}

type expiryHeap []expiry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// rebuild makes the mirror anew from the store (after a restore).
func (q *quota) rebuild(st v2store.Store) {
	*q = *newQuota(q.max, q.maxValue, q.maxKey)
	ev, err := st.Get("/", true, false)
	if err != nil {
		return
	}
	var walk func(*v2store.NodeExtern)
	walk = func(n *v2store.NodeExtern) {
		for _, c := range n.Nodes {
			var exp time.Time
			if c.Expiration != nil {
				exp = *c.Expiration
			}
			v := ""
			if c.Value != nil {
				v = *c.Value
			}
			q.written(c.Key, c.Dir, v, exp, false, 0)
			walk(c)
		}
	}
	walk(ev.Node)
}

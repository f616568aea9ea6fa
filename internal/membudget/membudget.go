// Package membudget divides the serving sidecar's memory limit among what its clients can make it hold: the c10d
// store's data, its waiting keys and its connections, the etcd v2 keys API's store and its unread replies, the
// embedded etcd's own (v3) store with its raft log and replies. Each
// quota of those stores is derived from its share here, so that all of them full at once, with the runtime, the
// embedded etcd and the job's own state (its members, leases and rounds) beside them, stay under the limit with room
// to spare (issue 47). Pure: the limit in, the shares out.
package membudget

import "fmt"

// Base is what the process holds before any client: the Go runtime, the embedded etcd and the binary (an idle
// serve's RSS is 40 MiB; docs/scale.md).
const Base = 48 << 20

// DefaultLimit is the limit assumed when the container has none: the webhook's default limit of the serving
// sidecar (its --sidecar-serve-resources), so that the quotas are those of the pods users run.
const DefaultLimit = 512 << 20

// SoftLimitPercent is the share of the limit, less the checkpoints, that the Go heap is held under (GOMEMLIMIT,
// cmd/rdzv-sidecar): the shares below divide what is left of it; the rest is the kernel's and the collector's room.
const SoftLimitPercent = 90

// ConnCost is what one c10d connection may make serve hold: its goroutine, buffers and state, the small replies it
// may queue and its socket's send buffer (tcpstore counts its connections at it: tcpstore.ConnCost).
const ConnCost = 64 << 10

// ConnsPerNode is the c10d connections that one node of the job holds to the serving sidecar's store: its agent's,
// through its pod's sidecar, and one more for an agent that restarts before its old connection is gone.
const ConnsPerNode = 2

// JobPerNode is what one node of the job costs the serving sidecar's own state: its member, lease and keep-alives,
// its part of each round (146 MiB at 4,096 nodes against 40 MiB at 64, docs/scale.md; rounded up).
const JobPerNode = 32 << 10

// limitStep is how LimitFor grows a limit.
const limitStep = 64 << 20

// minUsable is the least a limit must leave for the job and its clients.
const minUsable = 16 << 20

// leastLimit is the least limit, less the checkpoints, that leaves minUsable.
const leastLimit = (Base + minUsable) * 100 / SoftLimitPercent

// Budget is the limit divided. Every field is bytes.
type Budget struct {
	Limit       int64 // the container's memory limit (DefaultLimit when it has none)
	Checkpoints int64 // what the checkpoint volume may hold: a memory emptyDir's pages are charged to the container
	// GoLimit is the Go heap's soft limit: SoftLimitPercent of the limit less the checkpoints, which are no Go memory
	// but count against the same limit (a GOMEMLIMIT of 90 % of the whole limit would let the heap and a full
	// checkpoint volume pass it together).
	GoLimit int64
	// Job is the job's own state and the spare room: members, leases, rounds, and the connections and requests of
	// a job of thousands of nodes (146 MiB at 4,096 nodes, docs/scale.md).
	Job       int64
	C10dStore int64 // the c10d store's keys, values and queued elements, each with its cost
	C10dWaits int64 // the keys that the c10d store's clients wait for, each with its cost
	// C10dReplies is the c10d store's replies queued and not yet written to their clients' sockets.
	C10dReplies int64
	C10dConns   int64 // the c10d store's open connections, each with its cost
	V2Store     int64 // the v2 keys API's store and the values its event history holds
	V2Replies   int64 // the v2 keys API's replies built and not yet read by their clients
	// Etcd is the embedded etcd's v3 store, which every pod of the job reaches: its raft log and its keys' index
	// (EtcdLimits derives its quotas from it).
	Etcd   int64
	Legacy bool // torch's etcd backends use the v2 store: it gets the larger share
}

// shares of what is usable, in per mille: the job's default backend (the c10d store carries the rendezvous; the v2
// API is there for any python-etcd client, with nothing of the job's in it) and torch's etcd backends (the v2
// store carries torch's state, 140 KB a write at 1,024 nodes, and its history keeps the last 1,000 writes).
var shares = map[bool]struct{ c10dStore, c10dWaits, c10dReplies, c10dConns, v2Store, v2Replies, etcd int64 }{
	false: {c10dStore: 180, c10dWaits: 50, c10dReplies: 50, c10dConns: 180, v2Store: 40, v2Replies: 20, etcd: 40},
	true:  {c10dStore: 50, c10dWaits: 30, c10dReplies: 30, c10dConns: 90, v2Store: 290, v2Replies: 90, etcd: 40},
}

// Split divides limit (0 or less: none known, DefaultLimit) for a serving sidecar whose checkpoint volume may hold
// checkpoints bytes; legacy says torch's etcd backends write the v2 store. It fails when the limit leaves nothing
// for the clients, with the figures.
func Split(limit, checkpoints int64, legacy bool) (Budget, error) {
	if limit <= 0 {
		limit = DefaultLimit
	}
	goLimit := GoLimit(limit, checkpoints)
	usable := goLimit - Base
	if usable < minUsable {
		return Budget{}, fmt.Errorf("a memory limit of %d MiB leaves %d MiB for the rendezvous once the checkpoints (%d MiB) and the runtime (%d MiB) have theirs: give the serving sidecar a limit of at least %d MiB (rendezvous.sidecarResources.serve)",
			limit>>20, max(usable, 0)>>20, checkpoints>>20, Base>>20, (checkpoints+leastLimit)>>20+1)
	}
	s := shares[legacy]
	part := func(perMille int64) int64 { return usable / 1000 * perMille }
	b := Budget{Limit: limit, Checkpoints: checkpoints, GoLimit: goLimit, Legacy: legacy,
		C10dStore: part(s.c10dStore), C10dWaits: part(s.c10dWaits), C10dReplies: part(s.c10dReplies), C10dConns: part(s.c10dConns),
		V2Store: part(s.v2Store), V2Replies: part(s.v2Replies), Etcd: part(s.etcd)}
	b.Job = usable - b.clients()
	return b, nil
}

// Connections is how many c10d connections the budget holds.
func (b Budget) Connections() int { return int(b.C10dConns / ConnCost) }

// Carries says whether the budget holds a job of nodes nodes: their connections within the connection quota and
// their own state within the job's share.
func (b Budget) Carries(nodes int) bool {
	return b.Connections() >= ConnsPerNode*nodes && b.Job >= JobPerNode*int64(nodes)
}

// LimitFor is the least memory limit, limit or more (0 or less: DefaultLimit) in steps of 64 MiB, whose split
// carries a job of nodes nodes: the webhook raises the serving sidecar's limit to it (internal/mutate).
func LimitFor(limit, checkpoints int64, legacy bool, nodes int) int64 {
	if limit <= 0 {
		limit = DefaultLimit
	}
	for {
		if b, err := Split(limit, checkpoints, legacy); err == nil && b.Carries(nodes) {
			return limit
		}
		limit += limitStep
	}
}

// GoLimit is the Go heap's soft limit for a container of limit bytes whose checkpoint volume may hold checkpoints:
// SoftLimitPercent of what the checkpoints leave (0 or less: none leaves room for the heap).
func GoLimit(limit, checkpoints int64) int64 {
	return (limit - checkpoints) / 100 * SoftLimitPercent
}

// clients is what the clients' quotas may hold together.
func (b Budget) clients() int64 {
	return b.C10dStore + b.C10dWaits + b.C10dReplies + b.C10dConns + b.V2Store + b.V2Replies + b.Etcd
}

// String is the budget as serve logs it at its start.
func (b Budget) String() string {
	mib := func(n int64) string { return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20)) }
	return fmt.Sprintf("limit=%s checkpoints=%s job=%s c10d_store=%s c10d_waits=%s c10d_replies=%s c10d_connections=%s v2_store=%s v2_replies=%s etcd=%s",
		mib(b.Limit), mib(b.Checkpoints), mib(b.Job), mib(b.C10dStore), mib(b.C10dWaits), mib(b.C10dReplies), mib(b.C10dConns),
		mib(b.V2Store), mib(b.V2Replies), mib(b.Etcd))
}

// The embedded etcd's bounds. Its database keeps etcd's own quota (2 GiB): the job's own data there grows with its
// ranks and its checkpoint saves (every rank's pieces with their replicas, and 5 minutes of their history until
// etcd's compaction), which serve cannot size from its limit, and a full database refuses the job's writes until
// an operator disarms etcd's alarm. Measured (etcd 3.7 embedded, 8 writers filling a 16 MiB quota): a key of an
// empty value costs its index 225 B of heap for 62 B of database; a key of 1 KiB, 1.7 KiB with its raft entry.
const (
	// EtcdMaxRequestBytes is the largest v3 request: the job's own are a member (under 1 KiB) and a checkpoint
	// piece's announcement (its manifest, a few KiB); etcd's 1.5 MiB would let the raft log hold 15,000 of them.
	EtcdMaxRequestBytes = 64 << 10
	// EtcdSnapshotCatchUp is the raft entries kept after a snapshot for a follower to catch up: the job's etcd has
	// none (etcd's default, 5,000, kept for nothing).
	EtcdSnapshotCatchUp = 10
	// etcdLeastSnapshotCount keeps snapshots from coming at every write when the share is small.
	etcdLeastSnapshotCount = 10
)

// EtcdLimits are the embedded etcd's quotas.
type EtcdLimits struct {
	MaxRequestBytes int    // a request's size (--max-request-bytes)
	SnapshotCount   uint64 // raft entries between snapshots: the raft log that the heap holds
	SnapshotCatchUp uint64 // raft entries kept after a snapshot
}

// EtcdLimits gives half the etcd share to the raft log that the heap keeps between snapshots (its entries at the
// largest request each); the other half is its keys' index.
func (b Budget) EtcdLimits() EtcdLimits {
	return EtcdLimits{MaxRequestBytes: EtcdMaxRequestBytes, SnapshotCatchUp: EtcdSnapshotCatchUp,
		SnapshotCount: uint64(max(b.Etcd/2/EtcdMaxRequestBytes-EtcdSnapshotCatchUp, etcdLeastSnapshotCount))}
}

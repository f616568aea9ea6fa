package membudget

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const mib = 1 << 20

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		name               string
		limit, checkpoints int64
		legacy             bool
		c10dStore, v2Store int64 // MiB, rounded down
		job                int64 // MiB, rounded down
	}{
		{"the webhook's default limit", 512 * mib, 0, false, 74, 16, 181},
		{"no limit: the default's", 0, 0, false, 74, 16, 181},
		{"torch's etcd backends", 512 * mib, 0, true, 20, 119, 156},
		{"2 GiB", 2048 * mib, 0, false, 323, 71, 789},
		{"with 1 GiB of checkpoints beside: as without", 1536 * mib, 1024 * mib, false, 74, 16, 181},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Split(tc.limit, tc.checkpoints, tc.legacy)
			require.NoError(t, err)
			assert.Equal(t, tc.c10dStore, b.C10dStore/mib, "c10d store")
			assert.Equal(t, tc.v2Store, b.V2Store/mib, "v2 store")
			assert.Equal(t, tc.job, b.Job/mib, "job")
		})
	}
}

// Everything together, the runtime's base, the checkpoints, the job's share and every client's quota full at once,
// stays within the Go heap's soft limit, whatever the limit.
func TestSplitAddsUp(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		for limit := int64(96 * mib); limit <= 64<<30; limit += limit / 3 {
			for _, cp := range []int64{0, limit / 4} {
				b, err := Split(limit, cp, legacy)
				if err != nil {
					continue
				}
				total := Base + b.Checkpoints + b.Job + b.clients()
				require.LessOrEqual(t, total, limit, "limit %d, checkpoints %d, legacy %v: %s", limit, cp, legacy, b)
				require.LessOrEqual(t, total-b.Checkpoints, (limit-b.Checkpoints)/100*SoftLimitPercent, "limit %d, checkpoints %d, legacy %v: %s", limit, cp, legacy, b)
				require.Greater(t, b.Job, b.clients()/2, "the job's own state keeps a large share: %s", b)
				for _, q := range []int64{b.C10dStore, b.C10dWaits, b.C10dReplies, b.C10dConns, b.V2Store, b.V2Replies, b.Etcd} {
					require.Positive(t, q, "%s", b)
				}
			}
		}
	}
}

func TestSplitRefusesTooSmallALimit(t *testing.T) {
	_, err := Split(64*mib, 0, false)
	require.EqualError(t, err, "a memory limit of 64 MiB leaves 9 MiB for the rendezvous once the checkpoints (0 MiB) and the runtime (48 MiB) have theirs: give the serving sidecar a limit of at least 72 MiB (rendezvous.sidecarResources.serve)")
	_, err = Split(1024*mib, 1000*mib, false)
	require.ErrorContains(t, err, "the checkpoints (1000 MiB)")
}

func TestLimitFor(t *testing.T) {
	for _, tc := range []struct {
		name        string
		limit, cp   int64
		legacy      bool
		nodes       int
		want        int64 // MiB
		connections int
	}{
		{"a small job: the default", 0, 0, false, 8, 512, 1188},
		{"as many nodes as the default carries", 512 * mib, 0, false, 594, 512, 1188},
		{"one more", 512 * mib, 0, false, 595, 576, 1354},
		{"1,024 nodes", 512 * mib, 0, false, 1024, 896, 2184},
		{"4,096 nodes", 512 * mib, 0, false, 4096, 3264, 8322},
		{"4,096 nodes on torch's etcd backends", 512 * mib, 0, true, 4096, 6400, 8225},
		{"a limit above what the job needs stays", 2048 * mib, 0, false, 8, 2048, 5170},
		{"checkpoints come on top", 512*mib + 1024*mib, 1024 * mib, false, 1024, 896 + 1024, 2184},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := LimitFor(tc.limit, tc.cp, tc.legacy, tc.nodes)
			assert.Equal(t, tc.want, got/mib)
			b, err := Split(got, tc.cp, tc.legacy)
			require.NoError(t, err)
			assert.Equal(t, tc.connections, b.Connections())
			assert.True(t, b.Carries(tc.nodes))
			if got > max(tc.limit, DefaultLimit) {
				less, err := Split(got-limitStep, tc.cp, tc.legacy)
				require.True(t, err != nil || !less.Carries(tc.nodes), "the least such limit")
			}
		})
	}
}

// The raft log that the embedded etcd's heap keeps between snapshots stays within half its share from a limit of
// 256 MiB on (below it the least snapshot count is more), and etcd's defaults would not.
func TestEtcdLimits(t *testing.T) {
	b, err := Split(DefaultLimit, 0, false)
	require.NoError(t, err)
	assert.Equal(t, EtcdLimits{MaxRequestBytes: 64 << 10, SnapshotCount: 122, SnapshotCatchUp: 10}, b.EtcdLimits())
	raft := func(l EtcdLimits) int64 { return int64(l.SnapshotCount+l.SnapshotCatchUp) * int64(l.MaxRequestBytes) }
	require.Greater(t, raft(EtcdLimits{MaxRequestBytes: 1536 << 10, SnapshotCount: 10_000, SnapshotCatchUp: 5_000}), int64(DefaultLimit))
	for _, legacy := range []bool{false, true} {
		for limit := int64(256 * mib); limit <= 64<<30; limit += limit / 3 {
			b, err := Split(limit, 0, legacy)
			require.NoError(t, err)
			require.LessOrEqual(t, raft(b.EtcdLimits()), b.Etcd/2, "limit %d MiB: %+v of %s", limit>>20, b.EtcdLimits(), b)
		}
	}
}

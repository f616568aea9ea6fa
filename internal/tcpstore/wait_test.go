package tcpstore

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// storeWithConns is a store served to n connections that gather their replies.
func storeWithConns(t testing.TB, q Quotas, n int) (*store, []*conn, func(c *conn, r *Request) error) {
	t.Helper()
	m, err := newMetrics(nil)
	require.NoError(t, err)
	s := newStore(m, DefaultLimits(), q.withDefaults())
	cs := make([]*conn, n)
	for i := range cs {
		cs[i] = &conn{flushing: true} // no flush goroutine: the test reads c.tail
	}
	return s, cs, func(c *conn, r *Request) error { _, _, _, err := s.do(c, r); return err }
}

func repeat(k string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = k
	}
	return keys
}

func distinct(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return keys
}

// listed is how many entries the waiters' index holds, all keys together.
func listed(s *store) int {
	n := 0
	for _, l := range s.waiting {
		n += l.Len()
	}
	return n
}

// The waiters' index: a key named many times in one WAIT is listed once and counts once; ending a wait (CANCEL_WAIT,
// a disconnect, its answer) takes exactly its entries off, leaving every other waiter's; the index empties and is
// made anew once a flood of waits has gone; and waited keys count against a quota.
func TestWaitAccounting(t *testing.T) {
	t.Run("duplicates count once", func(t *testing.T) {
		s, cs, do := storeWithConns(t, Quotas{}, 2)
		require.NoError(t, do(cs[0], &Request{Op: OpWait, Keys: repeat("a", 64<<10)}))
		require.NoError(t, do(cs[1], &Request{Op: OpWait, Keys: repeat("a", 64<<10)}))
		require.Equal(t, 2, listed(s))
		require.Equal(t, 2, s.waitKeys)
		require.NoError(t, do(cs[0], &Request{Op: OpCancelWait}))
		require.Equal(t, 1, listed(s), "the other client still waits")
		require.NoError(t, do(cs[0], &Request{Op: OpSet, Key: "a", Value: []byte("1")}))
		require.Equal(t, []byte{stopWaiting}, cs[1].tail, "answered once the key came")
		require.Empty(t, s.waiting)
		require.Zero(t, s.waitKeys)
	})
	t.Run("ending a wait takes exactly its entries", func(t *testing.T) {
		s, cs, do := storeWithConns(t, Quotas{}, 3)
		require.NoError(t, do(cs[0], &Request{Op: OpWait, Keys: distinct("k", 1000)}))
		require.NoError(t, do(cs[1], &Request{Op: OpWait, Keys: distinct("k", 10)}))
		require.NoError(t, do(cs[2], &Request{Op: OpWait, Keys: []string{"k5", "other"}}))
		require.Equal(t, 1012, listed(s))
		s.drop(cs[0]) // a disconnect
		require.Equal(t, 12, listed(s))
		require.Len(t, s.waiting, 11)
		require.NoError(t, do(cs[0], &Request{Op: OpSet, Key: "k5", Value: nil}))
		require.Equal(t, 10, listed(s), "k5 came for both others")
		require.NoError(t, do(cs[0], &Request{Op: OpSet, Key: "other", Value: nil}))
		require.Equal(t, []byte{stopWaiting}, cs[2].tail)
		require.Nil(t, cs[2].wait)
		require.Equal(t, 9, s.waitKeys)
	})
	t.Run("the index is made anew once a flood has gone", func(t *testing.T) {
		s, cs, do := storeWithConns(t, Quotas{WaitBytes: 64 << 20}, 2)
		require.NoError(t, do(cs[0], &Request{Op: OpWait, Keys: distinct("f", 100_000)}))
		require.NoError(t, do(cs[1], &Request{Op: OpWait, Keys: []string{"stay"}}))
		require.Equal(t, 100_001, s.waitingPeak)
		require.NoError(t, do(cs[0], &Request{Op: OpCancelWait}))
		require.Equal(t, 1, s.waitingPeak, "a new map holds the one key left")
		require.Len(t, s.waiting, 1)
	})
	t.Run("quota", func(t *testing.T) {
		const key = 2 + WaitKeyCost // "a0" .. "b9": what waiting for one costs
		s, cs, do := storeWithConns(t, Quotas{WaitBytes: 10 * key}, 2)
		require.NoError(t, do(cs[0], &Request{Op: OpWait, Keys: distinct("a", 6)}))
		err := do(cs[1], &Request{Op: OpWait, Keys: distinct("b", 5)})
		var q *WaitQuotaError
		require.True(t, errors.As(err, &q), "%v", err)
		require.Equal(t, WaitQuotaError{Keys: 5, Bytes: 5 * key, Waiting: 6 * key, Quota: 10 * key}, *q)
		require.Nil(t, cs[1].wait)
		require.NoError(t, do(cs[1], &Request{Op: OpWait, Keys: append(distinct("b", 4), repeat("b0", 100)...)}), "4 keys, whatever the repeats")
		require.NoError(t, do(cs[0], &Request{Op: OpCancelWait}))
		require.NoError(t, do(cs[0], &Request{Op: OpBarrier, Key: "bar", WorldSize: 2}), "room again")
		require.Equal(t, 5, s.waitKeys)
		require.Equal(t, int64(4*key+3+WaitKeyCost), s.waitBytes)
		// A key's length counts: one key of 8 KiB (torch's limit) costs as much as 33 of "a0".
		long := strings.Repeat("k", 8<<10)
		err = do(cs[0], &Request{Op: OpWait, Keys: []string{long}})
		require.True(t, errors.As(err, &q), "%v", err)
		require.Equal(t, int64(len(long)+WaitKeyCost), q.Bytes)
		require.NoError(t, do(cs[1], &Request{Op: OpCancelWait}))
		require.Zero(t, s.waitBytes, "every wait ended, nothing waited for")
	})
	t.Run("queue push wakes in order", func(t *testing.T) {
		s, cs, do := storeWithConns(t, Quotas{}, 3)
		require.NoError(t, do(cs[0], &Request{Op: OpWait, Keys: []string{"q", "x"}})) // needs x too
		require.NoError(t, do(cs[1], &Request{Op: OpWait, Keys: []string{"q"}}))
		require.NoError(t, do(cs[2], &Request{Op: OpWait, Keys: []string{"q"}}))
		require.NoError(t, do(cs[0], &Request{Op: OpQueuePush, Key: "q", Value: []byte("e")}))
		require.NotNil(t, cs[0].wait, "q came for c0, which still waits for x")
		require.Equal(t, []byte{stopWaiting}, cs[1].tail, "the first whose keys are all there")
		require.Nil(t, cs[2].tail, "one element, one client woken")
		require.Equal(t, 2, listed(s), "c0 still waits for x, c2 for q")
	})
}

// BenchmarkCancelWait: two clients wait on one key named n times, one cancels. It was quadratic in n (every key's
// waiters walked per key of the wait: 8.05 s at 64 Ki under the store's lock); now it is linear in the wait's keys.
func BenchmarkCancelWait(b *testing.B) {
	for _, n := range []int{8 << 10, 64 << 10} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			keys := repeat("a", n)
			for b.Loop() {
				_, cs, do := storeWithConns(b, Quotas{}, 2)
				require.NoError(b, do(cs[0], &Request{Op: OpWait, Keys: keys}))
				require.NoError(b, do(cs[1], &Request{Op: OpWait, Keys: keys}))
				require.NoError(b, do(cs[0], &Request{Op: OpCancelWait}))
			}
		})
	}
}

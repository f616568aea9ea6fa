package tcpstore

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// keyBytesOf is what store.keyBytes must be: the length of kv's keys together.
func keyBytesOf(s *store) int64 {
	n := int64(0)
	for k := range s.kv {
		n += int64(len(k))
	}
	return n
}

// A reply is refused before it is built when it would pass Limits.MaxReplyLen (MULTI_GET: 8 bytes and the value per
// key named; LIST_KEYS: 8 bytes and the key per key, known without walking the store); what fits is answered.
func TestRepliesBoundedBeforeTheyAreBuilt(t *testing.T) {
	m, err := newMetrics(nil)
	require.NoError(t, err)
	s := newStore(m, Limits{MaxReplyLen: 1000}.withDefaults(), Quotas{}.withDefaults())
	c := &conn{flushing: true}
	do := func(r *Request) error { _, _, _, err := s.do(c, r); return err }
	tooLarge := func(err error) bool { var e *ReplyTooLargeError; return errors.As(err, &e) }

	require.NoError(t, do(&Request{Op: OpSet, Key: "v", Value: make([]byte, 400)}))
	require.NoError(t, do(&Request{Op: OpMultiGet, Keys: []string{"v", "v"}})) // 816
	c.parts, c.tail, c.queued = nil, nil, 0
	require.True(t, tooLarge(do(&Request{Op: OpMultiGet, Keys: []string{"v", "v", "v"}}))) // 1224
	require.Zero(t, c.queued, "nothing of a refused reply is queued")

	for _, k := range []string{"a", "bb", "ccc"} {
		require.NoError(t, do(&Request{Op: OpSet, Key: k, Value: nil}))
	}
	require.NoError(t, do(&Request{Op: OpListKeys}))
	c.parts, c.tail, c.queued = nil, nil, 0
	require.NoError(t, do(&Request{Op: OpMultiSet, Keys: []string{"k1", "k2"}, Values: [][]byte{nil, nil}}))
	require.NoError(t, do(&Request{Op: OpBarrier, Key: "barrier-key", WorldSize: 1}))
	require.NoError(t, do(&Request{Op: OpAdd, Key: "counter", Delta: 1}))
	require.NoError(t, do(&Request{Op: OpCompareSet, Key: "cas", Value: []byte("x")}))
	require.NoError(t, do(&Request{Op: OpDeleteKey, Key: "bb"}))
	require.NoError(t, do(&Request{Op: OpDeleteKey, Key: "missing"}))
	require.Equal(t, keyBytesOf(s), s.keyBytes, "every write that adds or removes a key accounts for it")
	for i := 0; len(s.kv)*8+int(s.keyBytes)+8 <= 1000; i++ {
		require.NoError(t, do(&Request{Op: OpSet, Key: string(rune('A'+i%26)) + string(rune('a'+i/26)), Value: nil}))
	}
	c.parts, c.tail, c.queued = nil, nil, 0
	require.True(t, tooLarge(do(&Request{Op: OpListKeys})))
	require.Zero(t, c.queued)
}

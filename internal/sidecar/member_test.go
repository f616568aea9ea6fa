package sidecar

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/membership"
)

// The round Events' processes come from here: a member's slots by host, none for a host that is not a member.
func TestMemberStateSlots(t *testing.T) {
	st := &memberState{}
	_, ok := st.slots("w-0")
	require.False(t, ok, "nothing listed yet")
	st.set(func(s *memberState) {
		s.byHost = map[string]membership.Member{"w-0": {Host: "w-0", Slots: 8}, "w-1": {Host: "w-1", Slots: 4, Index: 1}}
	})
	n, ok := st.slots("w-1")
	require.True(t, ok)
	require.Equal(t, 4, n)
	_, ok = st.slots("w-2")
	require.False(t, ok)
	m, ok := st.member("w-1")
	require.True(t, ok)
	require.Equal(t, 1, m.Index, "the elastic-training backend ranks by index")
}

package sidecar

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The round Events' processes come from here: a member's slots by host, none for a host that is not a member.
func TestMemberStateSlots(t *testing.T) {
	st := &memberState{}
	_, ok := st.slots("w-0")
	require.False(t, ok, "nothing listed yet")
	st.set(func(s *memberState) { s.slotsOf = map[string]int{"w-0": 8, "w-1": 4} })
	n, ok := st.slots("w-1")
	require.True(t, ok)
	require.Equal(t, 4, n)
	_, ok = st.slots("w-2")
	require.False(t, ok)
}

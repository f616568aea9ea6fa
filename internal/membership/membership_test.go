package membership

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDiffAndDescribe(t *testing.T) {
	a := []Member{{Host: "a", Slots: 1}, {Host: "b", Slots: 2}}
	b := []Member{{Host: "b", Slots: 2}, {Host: "c", Slots: 4}}
	joined, left := Diff(a, b)
	require.Equal(t, []string{"c"}, joined)
	require.Equal(t, []string{"a"}, left)
	require.Equal(t, "2 members, 6 slots: b:2 c:4", Describe(b))
}

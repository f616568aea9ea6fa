package naming

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStatefulSets(t *testing.T) {
	got, err := StatefulSets("mpi-worker,mpi-wide")
	require.NoError(t, err)
	assert.Equal(t, []string{"mpi-worker", "mpi-wide"}, got)
	for _, bad := range []string{"", "mpi-worker,", "Mpi", "a_b", "mpi-worker,,mpi-wide", strings.Repeat("a", 64)} {
		_, err := StatefulSets(bad)
		assert.Error(t, err, "%q", bad)
	}
}

// FuzzStatefulSets: whatever the annotation says, a name that passes is a DNS label, never a path or a list.
func FuzzStatefulSets(f *testing.F) {
	f.Add("mpi-worker,mpi-wide")
	f.Add("a,,b")
	f.Fuzz(func(t *testing.T, v string) {
		names, err := StatefulSets(v)
		if err != nil {
			return
		}
		for _, n := range names {
			if n == "" || len(n) > 63 || strings.ContainsAny(n, ",/. ") {
				t.Fatalf("%q passed from %q", n, v)
			}
		}
	})
}

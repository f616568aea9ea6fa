package atomicfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWrite(t *testing.T) {
	const mode = 0o444
	dir := t.TempDir()
	changed, err := Write(dir, "hostfile", []byte("a slots=1\n"), mode)
	require.NoError(t, err)
	require.True(t, changed)
	st, err := os.Stat(filepath.Join(dir, "hostfile"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(mode), st.Mode().Perm())

	changed, err = Write(dir, "hostfile", []byte("a slots=1\n"), mode)
	require.NoError(t, err)
	require.False(t, changed, "same content and mode: no rewrite")

	changed, err = Write(dir, "hostfile", []byte("b slots=2\n"), mode)
	require.NoError(t, err)
	require.True(t, changed)
	got, err := os.ReadFile(filepath.Join(dir, "hostfile"))
	require.NoError(t, err)
	require.Equal(t, "b slots=2\n", string(got))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary files left behind")
}

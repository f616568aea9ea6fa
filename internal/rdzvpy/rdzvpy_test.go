package rdzvpy

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Install lays out what importlib.metadata finds on PYTHONPATH: the package
// and the dist-info naming its entry point (the torch side runs in
// test/integration/sidecar's TestOwnRendezvous*).
func TestInstall(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, Install(dir))
	require.NoError(t, Install(dir), "again, over the read-only files of the first")
	ep, err := os.ReadFile(filepath.Join(dir, Dir, "et_rdzv-0.1.0.dist-info", "entry_points.txt"))
	require.NoError(t, err)
	require.Contains(t, string(ep), "[torchrun.handlers]\n"+Backend+" = et_rdzv:handler")
	fi, err := os.Stat(filepath.Join(dir, Dir, "et_rdzv", "__init__.py"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o444), fi.Mode().Perm())
}

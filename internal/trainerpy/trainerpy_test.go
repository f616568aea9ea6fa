package trainerpy

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// Install lays out what importlib.metadata finds on PYTHONPATH: the package
// and the dist-info naming its entry point (the torch side runs in
// test/integration/sidecar's TestElasticTrainingBackend*).
func TestInstall(t *testing.T) {
	// The package's version is the release's: the job chart's version.
	chart, err := os.ReadFile(filepath.Join("..", "..", "charts", "elastic-training", "Chart.yaml"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^version: (\S+)$`).FindSubmatch(chart)
	require.NotNil(t, m, "no version in the job chart's Chart.yaml")
	version := string(m[1])
	dir := t.TempDir()
	require.NoError(t, Install(dir))
	require.NoError(t, Install(dir), "again, over the read-only files of the first")
	ep, err := os.ReadFile(filepath.Join(dir, Dir, "elastic_training-"+version+".dist-info", "entry_points.txt"))
	require.NoError(t, err)
	require.Contains(t, string(ep), "[torchrun.handlers]\n"+Backend+" = elastic_training.rendezvous:handler")
	fi, err := os.Stat(filepath.Join(dir, Dir, "elastic_training", "rendezvous.py"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o444), fi.Mode().Perm())
}

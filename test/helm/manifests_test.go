package helm_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/strvals"

	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// TestWriteManifests writes every scenario's rendering (<scenario>.rev1.yaml) and, where a group can scale, the
// rendering of `helm upgrade --reuse-values --set <group>.replicas=N` (<scenario>.rev2.yaml) to
// $CHART_MANIFESTS_DIR, for test/helm/apiservercheck (kube-apiserver's create/update validation without a
// cluster). Skipped when the variable is unset.
func TestWriteManifests(t *testing.T) {
	dir := os.Getenv("CHART_MANIFESTS_DIR")
	if dir == "" {
		t.Skip("CHART_MANIFESTS_DIR not set")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ch := chartrender.Load(t, chartDir)
	for _, sc := range scenarios(t) {
		vals := merge(sc.read(t), pinned(t))
		r, err := render(ch, vals, chartrender.Options{})
		if err != nil {
			t.Fatalf("%s: %v", sc.name, err)
		}
		write(t, filepath.Join(dir, sc.name+".rev1.yaml"), manifest(r.Objects))
		sets := scaleSets(t, vals)
		if len(sets) == 0 || strings.Contains(sc.name, "mxnet") { // MXNet refuses to scale (see the upgrade test)
			continue
		}
		over := map[string]any{}
		for _, s := range sets {
			if err := strvals.ParseInto(s, over); err != nil {
				t.Fatal(err)
			}
		}
		r2, err := render(ch, chartutil.CoalesceTables(over, vals), chartrender.Options{Revision: 2})
		if err != nil {
			t.Fatalf("%s revision 2: %v", sc.name, err)
		}
		write(t, filepath.Join(dir, sc.name+".rev2.yaml"), manifest(r2.Objects))
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Package helm_test tests the charts through Helm's Go SDK. The job chart charts/elastic-training: golden
// renderings of every ci scenario and example, lint, the schema's and templates' error messages, and upgrade
// safety. The webhook add-on's chart charts/elastic-training-webhook: webhook_chart_test.go. Both are rendered
// client-side by internal/testenv/chartrender.
package helm_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"

	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

const (
	chartDir    = "../../charts/elastic-training"
	examplesDir = "../../examples"
	release     = "demo"
	namespace   = "ml"
)

// render renders the job chart as release demo in namespace ml (chartrender.Render: as `helm install`, or `helm
// upgrade` from o.Revision 2, schema validation included, lookup answered from o.Cluster).
func render(ch *chart.Chart, vals map[string]any, o chartrender.Options) (*chartrender.Rendered, error) {
	o.Release, o.Namespace = release, namespace
	return chartrender.Render(ch, vals, o)
}

// manifest joins objects as `helm template` prints them.
func manifest(objs []chartrender.Object) string {
	var b strings.Builder
	for _, o := range objs {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", o.Source, o.YAML)
	}
	return b.String()
}

// pinned are values that make renderings reproducible: the run id and the MPI SSH key are otherwise random.
func pinned(t testing.TB) map[string]any {
	key, err := os.ReadFile(filepath.Join("testdata", "ssh-test-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return map[string]any{"runId": "demo-pinned", "mpi": map[string]any{"ssh": map[string]any{"privateKey": string(key)}}}
}

// merge returns a copy of base with over's values on top (maps merged, everything else replaced).
func merge(base, over map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		if om, ok := v.(map[string]any); ok {
			if bm, ok := out[k].(map[string]any); ok {
				out[k] = merge(bm, om)
				continue
			}
		}
		out[k] = v
	}
	return out
}

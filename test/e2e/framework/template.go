package framework

import (
	"os"
	"sort"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/releaseutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// Values reads a values file of the repository (rel, as `helm -f rel`).
func (c *Cluster) Values(t testing.TB, rel string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(c.RepoPath(rel))
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return v
}

// HelmTemplate renders the chart in chartDir for release in ns with values client-side, as `helm template
// --kube-version <the cluster's>` does (the chart checks the Kubernetes version), and returns the objects of its
// manifest in document order (hooks left out).
func (c *Cluster) HelmTemplate(t testing.TB, chartDir, releaseName, ns string, values map[string]any) []*unstructured.Unstructured {
	t.Helper()
	ch := loadChart(t, "template", releaseName, chartDir)
	sv, err := c.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("the API server's version: %v", err)
	}
	kv, err := chartutil.ParseKubeVersion(sv.GitVersion)
	if err != nil {
		t.Fatalf("the API server's version %q: %v", sv.GitVersion, err)
	}
	in := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	in.ReleaseName, in.Namespace, in.KubeVersion = releaseName, ns, kv
	in.DryRun, in.Replace, in.ClientOnly = true, true, true
	rel, err := in.RunWithContext(t.Context(), ch, values)
	if err != nil {
		t.Fatalf("helm template %s (chart %s): %v", releaseName, chartDir, err)
	}
	docs := releaseutil.SplitManifests(rel.Manifest)
	keys := make([]string, 0, len(docs))
	for k := range docs {
		keys = append(keys, k)
	}
	sort.Sort(releaseutil.BySplitManifestsOrder(keys))
	var out []*unstructured.Unstructured
	for _, k := range keys {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(docs[k]), &m); err != nil {
			t.Fatalf("helm template %s (chart %s): %v", releaseName, chartDir, err)
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
	return out
}

package framework

import (
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// Values reads a values file of the repository (rel, as `helm -f rel`; chartrender.ReadValues).
func (c *Cluster) Values(t testing.TB, rel string) map[string]any {
	t.Helper()
	return chartrender.ReadValues(t, c.RepoPath(rel))
}

// HelmTemplate renders the chart in chartDir for release in ns with values client-side (chartrender), as `helm
// template --kube-version <the cluster's>` does (the chart checks the Kubernetes version), and returns the objects
// of its manifest, hooks left out, by template file and then in document order.
func (c *Cluster) HelmTemplate(t testing.TB, chartDir, releaseName, ns string, values map[string]any) []*unstructured.Unstructured {
	t.Helper()
	ch := chartrender.Load(t, chartDir)
	sv, err := c.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("the API server's version: %v", err)
	}
	kv, err := chartutil.ParseKubeVersion(sv.GitVersion)
	if err != nil {
		t.Fatalf("the API server's version %q: %v", sv.GitVersion, err)
	}
	r, err := chartrender.Render(ch, values, chartrender.Options{Release: releaseName, Namespace: ns, KubeVersion: kv})
	if err != nil {
		t.Fatalf("helm template %s (chart %s): %v", releaseName, chartDir, err)
	}
	var out []*unstructured.Unstructured
	for _, o := range r.Objects {
		if !o.Hook() {
			out = append(out, o.Unstructured())
		}
	}
	return out
}

// Package helm_test tests the job chart charts/elastic-training through Helm's Go SDK: golden renderings of
// every ci scenario and example, lint, the schema's and templates' error messages, and upgrade safety.
package helm_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

const (
	chartDir    = "../../charts/elastic-training"
	examplesDir = "../../examples"
	release     = "demo"
	namespace   = "ml"
)

// kubeVersion is what the chart is rendered for (Chart.yaml asks for >=1.29).
var kubeVersion = chartutil.KubeVersion{Version: "v1.36.3", Major: "1", Minor: "36"}

func loadChart(t testing.TB) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return ch
}

// renderOpts says how one revision is rendered.
type renderOpts struct {
	revision int
	// cluster holds the objects lookup finds (what an earlier revision left in the cluster).
	cluster []map[string]any
	// notes receives the rendered NOTES.txt when set.
	notes *string
}

// render renders the chart as `helm install`/`helm upgrade` would (schema validation included) and returns the
// templates' output by file name, NOTES.txt and partials left out.
func render(t testing.TB, ch *chart.Chart, vals map[string]any, o renderOpts) (map[string]string, error) {
	t.Helper()
	if o.revision == 0 {
		o.revision = 1
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = kubeVersion
	rv, err := chartutil.ToRenderValuesWithSchemaValidation(ch, vals, chartutil.ReleaseOptions{
		Name: release, Namespace: namespace, Revision: o.revision,
		IsInstall: o.revision == 1, IsUpgrade: o.revision > 1,
	}, caps, false)
	if err != nil {
		return nil, err
	}
	files, err := engine.RenderWithClientProvider(ch, rv, fakeCluster(o.cluster))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for name, content := range files {
		if strings.HasSuffix(name, "NOTES.txt") && o.notes != nil {
			*o.notes = content
		}
		if strings.HasSuffix(name, "NOTES.txt") || strings.TrimSpace(content) == "" {
			continue
		}
		out[name] = content
	}
	return out, nil
}

// object is one rendered manifest.
type object struct {
	Source string
	Kind   string
	Name   string
	YAML   string
	Obj    map[string]any
}

func (o object) key() string { return o.Kind + "/" + o.Name }

// objects splits rendered files into objects, sorted by source file then document order.
func objects(t testing.TB, files map[string]string) []object {
	t.Helper()
	var names []string
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []object
	for _, n := range names {
		docs := releaseutil.SplitManifests(files[n])
		var keys []string
		for k := range docs {
			keys = append(keys, k)
		}
		sort.Sort(releaseutil.BySplitManifestsOrder(keys))
		for _, k := range keys {
			doc := strings.TrimSpace(docs[k])
			if doc == "" {
				continue
			}
			var m map[string]any
			if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
				t.Fatalf("%s: invalid YAML: %v\n%s", n, err, doc)
			}
			if m == nil {
				continue
			}
			kind, _ := m["kind"].(string)
			meta, _ := m["metadata"].(map[string]any)
			name, _ := meta["name"].(string)
			out = append(out, object{Source: n, Kind: kind, Name: name, YAML: doc, Obj: m})
		}
	}
	return out
}

// manifest joins objects as `helm template` prints them.
func manifest(objs []object) string {
	var b strings.Builder
	for _, o := range objs {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", o.Source, o.YAML)
	}
	return b.String()
}

func readValues(t testing.TB, path string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValuesFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return v.AsMap()
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

// fakeCluster answers the chart's lookup calls from a list of objects, as a cluster holding them would.
func fakeCluster(objs []map[string]any) engine.ClientProvider { return clusterProvider{objs: objs} }

type clusterProvider struct{ objs []map[string]any }

func (p clusterProvider) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	return &fakeResource{objs: p.objs, apiVersion: apiVersion, kind: kind}, true, nil
}

// fakeResource implements the two calls lookup makes; any other call panics (nil embedded interface).
type fakeResource struct {
	dynamic.NamespaceableResourceInterface
	objs             []map[string]any
	apiVersion, kind string
	namespace        string
}

func (r *fakeResource) Namespace(ns string) dynamic.ResourceInterface {
	c := *r
	c.namespace = ns
	return &c
}

func (r *fakeResource) Get(_ context.Context, name string, _ metav1.GetOptions, _ ...string) (*unstructured.Unstructured, error) {
	for _, o := range r.objs {
		u := unstructured.Unstructured{Object: o}
		if u.GetAPIVersion() == r.apiVersion && u.GetKind() == r.kind && u.GetName() == name &&
			(r.namespace == "" || u.GetNamespace() == "" || u.GetNamespace() == r.namespace) {
			return u.DeepCopy(), nil
		}
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: strings.ToLower(r.kind) + "s"}, name)
}

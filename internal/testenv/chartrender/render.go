// Package chartrender renders this repository's Helm charts client-side, as
// `helm install` and `helm upgrade` would but without a cluster, for the
// charts' tests (test/helm) and for tests that send what a chart renders to a
// real API server (test/e2e): the Helm SDK's chart loader,
// chartutil.ToRenderValuesWithSchemaValidation (values.schema.json applied)
// and engine.RenderWithClientProvider, with the chart's lookup calls answered
// from a list of objects. Real installs against a cluster are
// test/e2e/framework's (HelmInstall).
package chartrender

import (
	"context"
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
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/releaseutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

// KubeVersion is the Kubernetes version charts are rendered for: the test
// cluster's (the charts ask for >=1.29).
var KubeVersion = chartutil.KubeVersion{Version: "v1.36.3", Major: "1", Minor: "36"}

// Dir is the directory of charts/<name> in this checkout.
func Dir(name string) string {
	return filepath.Join(testenv.RepoRoot(), "charts", name)
}

// AddSetFiles adds to vals what the usage of the example at path gives with --set-file: the `helm install` line of
// its leading comment (continued by trailing backslashes), whose files are relative to the repository's root, as
// a user types it there. Files without such a usage add nothing.
func AddSetFiles(path string, vals map[string]any) error {
	sets, err := UsageSetFiles(path)
	if err != nil {
		return err
	}
	for key, file := range sets {
		b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), file))
		if err != nil {
			return fmt.Errorf("%s: --set-file %s=%s: %w", path, key, file, err)
		}
		vals[key] = string(b)
	}
	return nil
}

// UsageSetFiles returns the --set-file values (key -> file) of the usage (Usage) of the values file at path.
func UsageSetFiles(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	fields := strings.Fields(Usage(string(b)))
	for i, f := range fields {
		if f == "--set-file" && i+1 < len(fields) {
			key, file, ok := strings.Cut(fields[i+1], "=")
			if !ok {
				return nil, fmt.Errorf("%s: --set-file %s: want key=file", path, fields[i+1])
			}
			out[key] = file
		}
	}
	return out, nil
}

// Usage returns the first `helm install` command in the comments of a values file, its continuation lines
// (trailing backslashes) joined; empty when there is none.
func Usage(doc string) string {
	var usage string
	for _, line := range strings.Split(doc, "\n") {
		text, ok := strings.CutPrefix(strings.TrimSpace(line), "#")
		text = strings.TrimSpace(text)
		if usage == "" && (!ok || !strings.HasPrefix(text, "helm install ")) {
			continue
		}
		if !ok {
			break
		}
		usage += " " + strings.TrimSuffix(text, "\\")
		if !strings.HasSuffix(text, "\\") {
			break
		}
	}
	return strings.TrimSpace(usage)
}

// Load loads the chart in dir, failing the test when it cannot.
func Load(t testing.TB, dir string) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(dir)
	if err != nil {
		t.Fatalf("load chart %s: %v", dir, err)
	}
	return ch
}

// ReadValues reads the values file at path as `helm install -f path` would,
// with what its usage gives with --set-file (AddSetFiles), failing the test when it cannot.
func ReadValues(t testing.TB, path string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValuesFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	if err := AddSetFiles(path, v); err != nil {
		t.Fatal(err)
	}
	return v.AsMap()
}

// Options says which release and revision a chart is rendered as.
type Options struct {
	Release, Namespace string
	// Revision 0 or 1 renders an install, 2 and up an upgrade (.Release.IsUpgrade).
	Revision int
	// Cluster holds the objects the chart's lookup calls find: what an earlier revision left in the cluster.
	Cluster []map[string]any
	// KubeVersion, when set, replaces the package's KubeVersion: a real cluster's, for objects sent to it.
	KubeVersion *chartutil.KubeVersion
}

// Object is one rendered manifest.
type Object struct {
	Source string // the template it came from, e.g. elastic-training/templates/workloads.yaml
	Kind   string
	Name   string
	YAML   string // the document as rendered, trimmed
	Obj    map[string]any
}

// Key is Kind/Name.
func (o Object) Key() string { return o.Kind + "/" + o.Name }

// Hook says whether the object is a Helm hook, which an install applies
// apart from the release's manifest (at its hook's time, or on `helm test`).
func (o Object) Hook() bool {
	_, ok := o.Unstructured().GetAnnotations()[release.HookAnnotation]
	return ok
}

// Unstructured is the object as unstructured (sharing its map).
func (o Object) Unstructured() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: o.Obj}
}

// Rendered is the output of one render.
type Rendered struct {
	// Objects are sorted by template file, then in document order.
	Objects []Object
	// Notes is the rendered NOTES.txt.
	Notes string
}

// Find returns the first object of kind named name (of any name when name is
// ""), or nil.
func (r *Rendered) Find(kind, name string) *unstructured.Unstructured {
	for _, o := range r.Objects {
		if o.Kind == kind && (name == "" || o.Name == name) {
			return o.Unstructured()
		}
	}
	return nil
}

// Cluster is what the cluster holds after this revision is applied in
// namespace: copies of the objects with their namespace set, for the next
// revision's Options.Cluster.
func (r *Rendered) Cluster(namespace string) []map[string]any {
	out := make([]map[string]any, 0, len(r.Objects))
	for _, o := range r.Objects {
		u := o.Unstructured().DeepCopy()
		u.SetNamespace(namespace)
		out = append(out, u.Object)
	}
	return out
}

// RenderDir loads the chart in dir and renders it (Render).
func RenderDir(dir string, values map[string]any, o Options) (*Rendered, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("load chart: %w", err)
	}
	return Render(ch, values, o)
}

// Render renders ch with the user-supplied values as `helm install` (or
// `helm upgrade`, from revision 2) would, values validated against the chart's
// values.schema.json, for KubeVersion (or o.KubeVersion), which must be one
// the chart's kubeVersion accepts. Template errors, schema violations and an
// unsupported Kubernetes version are returned as Helm reports them.
func Render(ch *chart.Chart, values map[string]any, o Options) (*Rendered, error) {
	if o.Revision == 0 {
		o.Revision = 1
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = KubeVersion
	if o.KubeVersion != nil {
		caps.KubeVersion = *o.KubeVersion
	}
	rv, err := chartutil.ToRenderValuesWithSchemaValidation(ch, values, chartutil.ReleaseOptions{
		Name: o.Release, Namespace: o.Namespace, Revision: o.Revision,
		IsInstall: o.Revision == 1, IsUpgrade: o.Revision > 1,
	}, caps, false)
	if err != nil {
		return nil, err
	}
	if kv := ch.Metadata.KubeVersion; kv != "" && !chartutil.IsCompatibleRange(kv, caps.KubeVersion.String()) {
		return nil, fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s", kv, caps.KubeVersion.String())
	}
	files, err := engine.RenderWithClientProvider(ch, rv, clusterProvider{objs: o.Cluster})
	if err != nil {
		return nil, err
	}
	out := &Rendered{}
	names := make([]string, 0, len(files))
	for name, content := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			out.Notes = content
			continue
		}
		if strings.TrimSpace(content) != "" {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		objs, err := split(n, files[n])
		if err != nil {
			return nil, err
		}
		out.Objects = append(out.Objects, objs...)
	}
	return out, nil
}

// split splits one template's output into its objects, in document order.
func split(source, content string) ([]Object, error) {
	docs := releaseutil.SplitManifests(content)
	keys := make([]string, 0, len(docs))
	for k := range docs {
		keys = append(keys, k)
	}
	sort.Sort(releaseutil.BySplitManifestsOrder(keys))
	var out []Object
	for _, k := range keys {
		doc := strings.TrimSpace(docs[k])
		if doc == "" {
			continue
		}
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			return nil, fmt.Errorf("%s: invalid YAML: %v\n%s", source, err, doc)
		}
		if len(m) == 0 {
			continue
		}
		kind, _ := m["kind"].(string)
		meta, _ := m["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		out = append(out, Object{Source: source, Kind: kind, Name: name, YAML: doc, Obj: m})
	}
	return out, nil
}

// clusterProvider answers the chart's lookup calls from a list of objects, as
// a cluster holding them would.
type clusterProvider struct{ objs []map[string]any }

func (p clusterProvider) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	return &fakeResource{objs: p.objs, apiVersion: apiVersion, kind: kind}, true, nil
}

// fakeResource implements the two calls a lookup by name makes; any other
// call panics (nil embedded interface). An object without a namespace is
// found in every namespace.
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

// List answers a lookup without a name: every object of the kind (in the namespace, when one is given).
func (r *fakeResource) List(_ context.Context, _ metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	l := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": r.apiVersion, "kind": r.kind + "List"}}
	for _, o := range r.objs {
		u := unstructured.Unstructured{Object: o}
		if u.GetAPIVersion() == r.apiVersion && u.GetKind() == r.kind &&
			(r.namespace == "" || u.GetNamespace() == "" || u.GetNamespace() == r.namespace) {
			l.Items = append(l.Items, *u.DeepCopy())
		}
	}
	return l, nil
}

// Package webhookchart renders charts/elastic-training-webhook with the Helm SDK,
// client-side (no cluster), for the chart's tests and for the integration test
// that registers the rendered MutatingWebhookConfiguration with a real API server.
package webhookchart

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

// Dir is the chart's directory in this repository.
func Dir() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "charts", "elastic-training-webhook")
}

// Rendered is the output of one render.
type Rendered struct {
	Objects []*unstructured.Unstructured
	Notes   string
}

// Find returns the object of kind and name, or nil.
func (r *Rendered) Find(kind, name string) *unstructured.Unstructured {
	for _, o := range r.Objects {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			return o
		}
	}
	return nil
}

// Render renders the chart as `helm install release -n namespace --set ...` would,
// validating values against values.schema.json.
func Render(release, namespace string, values map[string]any) (*Rendered, error) {
	return RenderUpgrade(release, namespace, values, nil)
}

// RenderUpgrade renders like Render, but as an upgrade of a release whose
// objects in the cluster are existing: the chart's lookup calls see them
// (this is how the generated CA is kept).
func RenderUpgrade(release, namespace string, values map[string]any, existing []*unstructured.Unstructured) (*Rendered, error) {
	chrt, err := loader.Load(Dir())
	if err != nil {
		return nil, fmt.Errorf("load chart: %w", err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.36.3", Major: "1", Minor: "36"}
	vals, err := chartutil.ToRenderValues(chrt, values, chartutil.ReleaseOptions{
		Name: release, Namespace: namespace, Revision: 1 + min(len(existing), 1), IsInstall: existing == nil, IsUpgrade: existing != nil,
	}, caps)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	var files map[string]string
	if existing == nil {
		files, err = engine.Render(chrt, vals)
	} else {
		files, err = engine.RenderWithClientProvider(chrt, vals, fakeClients{existing})
	}
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	out := &Rendered{}
	for _, n := range names {
		if strings.HasSuffix(n, "NOTES.txt") {
			out.Notes = files[n]
			continue
		}
		if !strings.HasSuffix(n, ".yaml") {
			continue
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader([]byte(files[n])), 4096)
		for {
			obj := map[string]any{}
			if err := dec.Decode(&obj); err != nil {
				if err == io.EOF {
					break
				}
				return nil, fmt.Errorf("%s: %w", n, err)
			}
			if len(obj) == 0 {
				continue
			}
			out.Objects = append(out.Objects, &unstructured.Unstructured{Object: obj})
		}
	}
	return out, nil
}

// fakeClients serves lookup from a fixed set of objects.
type fakeClients struct{ objs []*unstructured.Unstructured }

func (f fakeClients) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil, false, err
	}
	gvr := gv.WithResource(strings.ToLower(kind) + "s")
	objs := []runtime.Object{}
	for _, o := range f.objs {
		if o.GetAPIVersion() == apiVersion && o.GetKind() == kind {
			objs = append(objs, o.DeepCopy())
		}
	}
	c := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{gvr: kind + "List"}, objs...)
	return c.Resource(gvr), true, nil
}

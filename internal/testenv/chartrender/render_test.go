package chartrender

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

// testChart has two templates (rendered out of name order by the engine's map), a NOTES.txt, an empty template
// and a Secret generated on install and kept on upgrade through lookup.
func testChart() *chart.Chart {
	return &chart.Chart{
		Metadata: &chart.Metadata{APIVersion: "v2", Name: "demo", Version: "0.1.0"},
		Values:   map[string]any{"replicas": 1},
		Schema:   []byte(`{"type": "object", "properties": {"replicas": {"type": "integer", "minimum": 1}}, "additionalProperties": false}`),
		Templates: []*chart.File{
			{Name: "templates/b.yaml", Data: []byte(`apiVersion: v1
kind: ConfigMap
metadata:
  name: b
data:
  upgrade: {{ .Release.IsUpgrade | quote }}
  revision: {{ .Release.Revision | quote }}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: b2
`)},
			{Name: "templates/a.yaml", Data: []byte(`{{- $old := lookup "v1" "Secret" .Release.Namespace "kept" -}}
apiVersion: v1
kind: Secret
metadata:
  name: kept
data:
  key: {{ if $old }}{{ $old.data.key }}{{ else }}{{ randAlphaNum 8 | b64enc }}{{ end }}
`)},
			{Name: "templates/empty.yaml", Data: []byte("{{- if false }}x: y{{ end }}\n")},
			{Name: "templates/NOTES.txt", Data: []byte("installed {{ .Release.Name }}")},
		},
	}
}

func TestRender(t *testing.T) {
	ch := testChart()
	r, err := Render(ch, nil, Options{Release: "rel", Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range r.Objects {
		keys = append(keys, o.Key()+"@"+o.Source)
	}
	want := []string{"Secret/kept@demo/templates/a.yaml", "ConfigMap/b@demo/templates/b.yaml", "ConfigMap/b2@demo/templates/b.yaml"}
	if !slices.Equal(keys, want) {
		t.Fatalf("objects %v, want %v", keys, want)
	}
	if r.Notes != "installed rel" {
		t.Errorf("notes %q", r.Notes)
	}
	if got := r.Find("ConfigMap", "b").Object["data"]; got.(map[string]any)["upgrade"] != "false" {
		t.Errorf("revision 1 is an install: %v", got)
	}
	if r.Find("ConfigMap", "") == nil || r.Find("ConfigMap", "c") != nil {
		t.Error("Find by kind only, or by kind and name")
	}
	key := r.Find("Secret", "kept").Object["data"].(map[string]any)["key"]

	// An upgrade finds revision 1's Secret through lookup, in the namespace Cluster set.
	cluster := r.Cluster("ns")
	if ns := cluster[0]["metadata"].(map[string]any)["namespace"]; ns != "ns" {
		t.Errorf("Cluster set namespace %v", ns)
	}
	if _, ok := r.Objects[0].Obj["metadata"].(map[string]any)["namespace"]; ok {
		t.Error("Cluster changed the rendered objects")
	}
	up, err := Render(ch, map[string]any{"replicas": 2}, Options{Release: "rel", Namespace: "ns", Revision: 2, Cluster: cluster})
	if err != nil {
		t.Fatal(err)
	}
	if got := up.Find("Secret", "kept").Object["data"].(map[string]any)["key"]; got != key {
		t.Errorf("upgrade generated %v again, want %v kept", got, key)
	}
	if got := up.Find("ConfigMap", "b").Object["data"].(map[string]any); got["upgrade"] != "true" || got["revision"] != "2" {
		t.Errorf("revision 2 is an upgrade: %v", got)
	}
	// Not in another namespace.
	other, err := Render(ch, nil, Options{Release: "rel", Namespace: "other", Revision: 2, Cluster: cluster})
	if err != nil {
		t.Fatal(err)
	}
	if other.Find("Secret", "kept").Object["data"].(map[string]any)["key"] == key {
		t.Error("lookup found a Secret of another namespace")
	}
}

func TestRenderValidatesValues(t *testing.T) {
	_, err := Render(testChart(), map[string]any{"replicas": 0}, Options{Release: "rel", Namespace: "ns"})
	if err == nil || !strings.Contains(err.Error(), "replicas") {
		t.Fatalf("want the schema's error naming replicas, got %v", err)
	}
}

func TestDir(t *testing.T) {
	r, err := RenderDir(Dir("elastic-training-webhook"), nil, Options{Release: "elastic-training-webhook", Namespace: "elastic-training-system"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Find("MutatingWebhookConfiguration", "elastic-training-webhook") == nil {
		t.Error("no MutatingWebhookConfiguration")
	}
}

func TestRenderKubeVersion(t *testing.T) {
	ch := testChart()
	ch.Metadata.KubeVersion = ">=1.30.0-0"
	old := &chartutil.KubeVersion{Version: "v1.29.4", Major: "1", Minor: "29"}
	if _, err := Render(ch, nil, Options{Release: "rel", Namespace: "ns", KubeVersion: old}); err == nil || !strings.Contains(err.Error(), "incompatible with Kubernetes v1.29.4") {
		t.Errorf("a cluster older than the chart's kubeVersion: want helm's refusal, got %v", err)
	}
	if _, err := Render(ch, nil, Options{Release: "rel", Namespace: "ns"}); err != nil {
		t.Errorf("the default KubeVersion: %v", err)
	}
}

func TestHook(t *testing.T) {
	ch := testChart()
	ch.Templates = append(ch.Templates, &chart.File{Name: "templates/tests/t.yaml", Data: []byte(`apiVersion: v1
kind: Pod
metadata:
  name: t
  annotations:
    helm.sh/hook: test
`)})
	r, err := Render(ch, nil, Options{Release: "rel", Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	var hooks []string
	for _, o := range r.Objects {
		if o.Hook() {
			hooks = append(hooks, o.Key())
		}
	}
	if !slices.Equal(hooks, []string{"Pod/t"}) {
		t.Errorf("hooks %v, want [Pod/t]", hooks)
	}
}

func TestReadValues(t *testing.T) {
	examples := filepath.Join(testenv.RepoRoot(), "examples")
	v := ReadValues(t, filepath.Join(examples, "script-run.yaml"))
	if s, _ := v["script"].(string); !strings.Contains(s, "def main") {
		t.Errorf("script-run.yaml without its --set-file script=examples/train.py: %.80q", s)
	}
	if _, ok := ReadValues(t, filepath.Join(examples, "mpi-horovod.yaml"))["script"]; ok {
		t.Error("a script for an example whose usage sets none")
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"# x\n#   helm install a c -f x.yaml\nk: v\n", "helm install a c -f x.yaml"},
		{"#   helm install a c -f x.yaml \\\n#     --set-file script=s.py\n#   helm upgrade a\n", "helm install a c -f x.yaml  --set-file script=s.py"},
		{"#   helm install a c \\\nk: v\n", "helm install a c"},
		{"k: v # helm install no\n", ""},
	} {
		if got := Usage(tc.doc); got != tc.want {
			t.Errorf("Usage(%q) = %q, want %q", tc.doc, got, tc.want)
		}
	}
}

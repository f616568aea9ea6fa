package mutate

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	evanphx "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/mutate/mutatetest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.yaml from the current output")

func testConfig() Config {
	cfg := DefaultConfig()
	cfg.SidecarImage = "example.com/rdzv-sidecar:v0.1.0"
	cfg.ExtraAccelerators = []string{"example.com/tpu"}
	cfg.WebhookNamespace = "elastic-training-system"
	cfg.Version = "0.1.0"
	// As the webhook chart installs it: serving sidecars of PyTorch on the own backend may ask for a replacement.
	cfg.PodReplacement = PodReplacement{URL: "https://elastic-training-webhook.elastic-training-system.svc:443/replace-pod",
		CA: []byte("-----BEGIN CERTIFICATE-----\nMIIBtestCA\n-----END CERTIFICATE-----\n")}
	return cfg
}

// golden is what a <case>.golden.yaml holds: the admission warnings and the mutated pod.
type golden struct {
	Warnings []string    `json:"warnings,omitempty"`
	Pod      *corev1.Pod `json:"pod"`
}

func readPod(t testing.TB, file string) *corev1.Pod { return mutatetest.ReadPod(t, file) }

// TestGolden mutates every testdata/<case>.yaml and compares with
// testdata/<case>.golden.yaml; -update rewrites the golden files. Every case
// is also checked for idempotency, and a golden file without an input fails.
func TestGolden(t *testing.T) {
	inputs, err := filepath.Glob("testdata/*.yaml")
	require.NoError(t, err)
	used := map[string]bool{}
	n := 0
	for _, in := range inputs {
		if strings.HasSuffix(in, ".golden.yaml") {
			continue
		}
		n++
		name := strings.TrimSuffix(filepath.Base(in), ".yaml")
		goldenFile := strings.TrimSuffix(in, ".yaml") + ".golden.yaml"
		used[goldenFile] = true
		t.Run(name, func(t *testing.T) {
			pod := readPod(t, in)
			input := Input{Pod: pod, Namespace: pod.Namespace, Config: testConfig()}
			ok, why := ShouldMutate(pod, pod.Namespace, input.Config)
			require.True(t, ok, why)
			before := pod.DeepCopy()
			res, err := Mutate(input)
			require.NoError(t, err)
			got, warnings := res.Pod, res.Warnings
			require.Equal(t, before, pod, "Mutate modified its input")

			out, err := yaml.Marshal(golden{Warnings: warnings, Pod: got})
			require.NoError(t, err)
			if *update {
				require.NoError(t, os.WriteFile(goldenFile, out, 0o644))
			}
			want, err := os.ReadFile(goldenFile)
			require.NoError(t, err, "no golden file: run go test ./internal/mutate -update")
			if diff := cmp.Diff(string(want), string(out)); diff != "" {
				t.Errorf("%s mismatch (-want +got):\n%s", goldenFile, diff)
			}

			// The patch of the result, applied to the input as the API server sends it (the typed pod
			// printed) and to the input as written (no zero values, GPU counts as numbers), gives the result.
			typed, asWritten := mutatetest.JSONForms(t, in)
			for _, raw := range [][]byte{typed, asWritten} {
				require.NotEmpty(t, checkPatch(t, raw, input.Namespace, testConfig(), warnings))
			}
			require.Nil(t, checkPatch(t, mustJSON(t, got), input.Namespace, testConfig(), nil), "a mutated pod's patch")

			// Idempotent: a second pass is a no-op ...
			again, err := Mutate(Input{Pod: got, Namespace: pod.Namespace, Config: testConfig()})
			require.NoError(t, err)
			require.Empty(t, again.Warnings)
			require.Empty(t, again.Patch)
			if diff := cmp.Diff(got, again.Pod); diff != "" {
				t.Errorf("second Mutate changed the pod (-first +second):\n%s", diff)
			}
			// ... and not only because of the marker: without it the pod comes out the same.
			stripped := got.DeepCopy()
			delete(stripped.Annotations, constants.AnnotationMutated)
			again, err = Mutate(Input{Pod: stripped, Namespace: pod.Namespace, Config: testConfig()})
			require.NoError(t, err)
			if diff := cmp.Diff(got, again.Pod); diff != "" {
				t.Errorf("re-mutating without the marker changed the pod (-first +second):\n%s", diff)
			}
		})
	}
	require.GreaterOrEqual(t, n, 15, "golden cases")
	goldens, err := filepath.Glob("testdata/*.golden.yaml")
	require.NoError(t, err)
	for _, g := range goldens {
		if !used[g] {
			t.Errorf("%s has no input %s", g, strings.TrimSuffix(g, ".golden.yaml")+".yaml")
		}
	}
}

// checkPatch decodes raw as the webhook does, mutates it, and checks that the patch
// applied to raw (by the JSON patch library the API server uses) gives Mutate's result: the same pod, and
// the same JSON where raw is the typed pod printed. It returns the patch.
func checkPatch(t testing.TB, raw []byte, namespace string, cfg Config, wantWarnings []string) []byte {
	t.Helper()
	pod := &corev1.Pod{}
	require.NoError(t, kjson.UnmarshalCaseSensitivePreserveInts(raw, pod))
	typedInput := bytes.Equal(raw, mustJSON(t, pod))
	res, err := Mutate(Input{Pod: pod, Namespace: namespace, Config: cfg})
	require.NoError(t, err)
	require.Equal(t, wantWarnings, res.Warnings)
	got := res.Pod
	var patch []byte
	patched := raw
	if len(res.Patch) > 0 {
		patch = mustJSON(t, res.Patch)
		p, err := evanphx.DecodePatch(patch)
		require.NoError(t, err, "patch %s", patch)
		patched, err = p.Apply(raw)
		require.NoError(t, err, "patch %s", patch)
	}
	gotPatched := &corev1.Pod{}
	require.NoError(t, kjson.UnmarshalCaseSensitivePreserveInts(patched, gotPatched))
	if diff := cmp.Diff(got, gotPatched); diff != "" {
		t.Fatalf("the patch applied gives another pod (-Mutate's +patched):\n%s\npatch: %s", diff, patch)
	}
	if typedInput {
		require.JSONEq(t, string(mustJSON(t, got)), string(patched), "patch %s", patch)
	}
	return patch
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// TestMutatedPodsShareNothing: two pods mutated from one input share no
// memory with each other, with the input or with the configuration (parts of
// the sidecar are allocated together, and the webhook changes pods in place):
// scribbling over everything one result can reach leaves the other intact.
func TestMutatedPodsShareNothing(t *testing.T) {
	for _, file := range []string{"testdata/pytorch-tls-etcd-v2-serves-rdzv.yaml", "testdata/pytorch-user-values-win.yaml", "testdata/mxnet-worker.yaml"} {
		t.Run(filepath.Base(file), func(t *testing.T) {
			pod := readPod(t, file)
			cfg := testConfig()
			res, err := Mutate(Input{Pod: pod, Namespace: pod.Namespace, Config: cfg})
			require.NoError(t, err)
			first := res.Pod
			res, err = Mutate(Input{Pod: pod, Namespace: pod.Namespace, Config: cfg})
			require.NoError(t, err)
			second := res.Pod
			wantSecond, wantPod, wantCfg := second.DeepCopy(), pod.DeepCopy(), testConfig()

			scribble(reflect.ValueOf(first))
			if diff := cmp.Diff(wantSecond, second); diff != "" {
				t.Errorf("second pod changed with the first (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantPod, pod); diff != "" {
				t.Errorf("input changed with the first pod (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantCfg, cfg, cmp.AllowUnexported(resource.Quantity{})); diff != "" {
				t.Errorf("configuration changed with the first pod (-want +got):\n%s", diff)
			}
		})
	}
}

// scribble overwrites every string, bool and integer reachable from v, and
// every map value.
func scribble(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			scribble(v.Elem())
		}
	case reflect.Struct:
		if q, ok := v.Addr().Interface().(*resource.Quantity); ok {
			q.Add(resource.MustParse("7"))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				scribble(v.Field(i))
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			scribble(v.Index(i))
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(v.MapIndex(k))
			scribble(e)
			v.SetMapIndex(k, e)
		}
	case reflect.String:
		v.SetString(v.String() + "~")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(v.Int() + 1)
	}
}

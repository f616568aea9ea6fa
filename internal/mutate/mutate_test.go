package mutate

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/elastic-training/elastic-training/internal/constants"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.yaml from the current output")

func testConfig() Config {
	cfg := DefaultConfig()
	cfg.SidecarImage = "example.com/rdzv-sidecar:v0.1.0"
	cfg.ExtraAccelerators = []string{"example.com/tpu"}
	cfg.WebhookNamespace = "elastic-training-system"
	return cfg
}

// golden is what a <case>.golden.yaml holds: the admission warnings and the mutated pod.
type golden struct {
	Warnings []string    `json:"warnings,omitempty"`
	Pod      *corev1.Pod `json:"pod"`
}

func readPod(t testing.TB, file string) *corev1.Pod {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	pod := &corev1.Pod{}
	require.NoError(t, yaml.UnmarshalStrict(b, pod), file)
	return pod
}

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
			got, warnings, err := Mutate(input)
			require.NoError(t, err)
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

			// Idempotent: a second pass is a no-op ...
			again, w2, err := Mutate(Input{Pod: got, Namespace: pod.Namespace, Config: testConfig()})
			require.NoError(t, err)
			require.Empty(t, w2)
			if diff := cmp.Diff(got, again); diff != "" {
				t.Errorf("second Mutate changed the pod (-first +second):\n%s", diff)
			}
			// ... and not only because of the marker: without it the pod comes out the same.
			stripped := got.DeepCopy()
			delete(stripped.Annotations, constants.AnnotationMutated)
			again, _, err = Mutate(Input{Pod: stripped, Namespace: pod.Namespace, Config: testConfig()})
			require.NoError(t, err)
			if diff := cmp.Diff(got, again); diff != "" {
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

package helm_test

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/gpu"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// TestPodsGatedUntilMutated: in every scenario, every pod template carries the scheduling gate only the webhook
// removes (constants.SchedulingGate, the chart spells it out): the training pods' and the dedicated rendezvous pod's
// (the webhook gives it its sidecar image), and so does the helm test pod.
func TestPodsGatedUntilMutated(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	for _, sc := range scenarios(t) {
		r, err := render(ch, merge(sc.read(t), pinned(t)), chartrender.Options{})
		if err != nil {
			t.Fatalf("%s: %v", sc.name, err)
		}
		n := 0
		for _, o := range r.Objects {
			if o.Kind != "Job" && o.Kind != "StatefulSet" && o.Kind != "Deployment" {
				continue
			}
			raw, _, _ := unstructured.NestedMap(o.Obj, "spec", "template", "spec")
			var spec corev1.PodSpec
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &spec); err != nil {
				t.Fatalf("%s %s: %v", sc.name, o.Key(), err)
			}
			gated := slices.Contains(spec.SchedulingGates, corev1.PodSchedulingGate{Name: constants.SchedulingGate})
			if !gated {
				t.Errorf("%s %s (role %s): not gated", sc.name, o.Key(), roleOf(o))
			}
			n++
		}
		if test := r.Find("Pod", ""); test != nil {
			gates, _, _ := unstructured.NestedSlice(test.Object, "spec", "schedulingGates")
			if len(gates) != 1 {
				t.Errorf("%s: the helm test pod's gates: %v", sc.name, gates)
			}
		}
		if n == 0 {
			t.Errorf("%s: no workloads", sc.name)
		}
	}
}

// TestChartCountsAcceleratorsAsTheWebhook: the chart's gpuResource check (its rules generated from internal/gpu)
// accepts exactly the names the webhook counts.
func TestChartCountsAcceleratorsAsTheWebhook(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	names := []string{"cpu", "memory", "nvidia.com/gpus", "example.com/npu", "gpu.intel.com/memory.max", "gpu.intel.com/i915"}
	names = append(names, gpu.Rules.Exact...)
	names = append(names, gpu.Rules.Shares...)
	for _, p := range gpu.Rules.Prefixes {
		names = append(names, p, p+"x")
	}
	for _, name := range names {
		vals := merge(pinned(t), map[string]any{"command": []any{"torchrun", "t.py"}, "gpuResource": name,
			"workers": map[string]any{"gpus": 1}})
		_, err := render(ch, vals, chartrender.Options{})
		if want := gpu.IsAccelerator(corev1.ResourceName(name), nil); (err == nil) != want {
			t.Errorf("gpuResource %q: webhook counts it %v, chart render error %v", name, want, err)
		}
	}
}

// TestDeterministicRendering: for GitOps (Argo CD, Flux render the chart on every sync), two renders are
// byte-identical once what the chart would otherwise generate is given: the job chart with runId and
// mpi.ssh.privateKey, the webhook chart with cert-manager issuing its certificate.
func TestDeterministicRendering(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	for _, sc := range scenarios(t) {
		vals := merge(sc.read(t), pinned(t))
		a, err := render(ch, vals, chartrender.Options{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := render(ch, vals, chartrender.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if manifest(a.Objects)+a.Notes != manifest(b.Objects)+b.Notes {
			t.Errorf("%s: two renders differ", sc.name)
		}
	}
	cm := map[string]any{"tls": map[string]any{"certManager": map[string]any{"enabled": true}}}
	a, b := renderWebhook(t, cm), renderWebhook(t, cm)
	if manifest(a.Objects)+a.Notes != manifest(b.Objects)+b.Notes {
		t.Error("webhook chart with cert-manager: two renders differ")
	}
}

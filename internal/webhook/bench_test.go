package webhook

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/elastic-training/elastic-training/internal/mutate"
)

// benchPod is the benchmarks' pod (a golden input: the serving worker 0 of a
// PyTorch job), as JSON too, and the webhook configuration they mutate it with.
func benchPod(b *testing.B) (*corev1.Pod, []byte, mutate.Config) {
	pod, podJSON := loadPod(b, "../mutate/testdata/pytorch-worker0-serves-rdzv.yaml")
	cfg := mutate.DefaultConfig()
	cfg.SidecarImage = "example.com/rdzv-sidecar:v0.1.0"
	return pod, podJSON, cfg
}

// loadPod reads a pod file, and prints it as JSON as the API server would.
func loadPod(b *testing.B, file string) (*corev1.Pod, []byte) {
	raw, err := os.ReadFile(file)
	if err != nil {
		b.Fatal(err)
	}
	pod := &corev1.Pod{}
	if err := yaml.Unmarshal(raw, pod); err != nil {
		b.Fatal(err)
	}
	podJSON, err := json.Marshal(pod)
	if err != nil {
		b.Fatal(err)
	}
	return pod, podJSON
}

// BenchmarkHandle measures the mutating handler alone (no HTTP, no TLS),
// through admission.Webhook.Handle so that Response.Complete, which encodes
// Response.Patches when a handler leaves the encoding to it, is counted too.
func BenchmarkHandle(b *testing.B) {
	_, podJSON, cfg := benchPod(b)
	h := &admission.Webhook{Handler: NewPodMutator(cfg)}
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "u", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Namespace: "team-a",
		Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: podJSON},
	}}
	b.ReportAllocs()
	for b.Loop() {
		if r := h.Handle(context.Background(), req); !r.Allowed || len(r.Patch) == 0 {
			b.Fatal(r.Result.Message)
		}
	}
}

// BenchmarkHandleStages splits BenchmarkHandle's pod into the handler's
// stages, to show where a mutated pod's time goes.
func BenchmarkHandleStages(b *testing.B) {
	pod, podJSON, cfg := benchPod(b)
	in := mutate.Input{Pod: pod, Namespace: "team-a", Config: cfg}
	out, _, err := mutate.Mutate(in)
	if err != nil {
		b.Fatal(err)
	}
	before := mutate.Record(pod)
	for _, stage := range []struct {
		name string
		run  func() error
	}{
		{"decode", func() error { _, err := decodePod(podJSON); return err }},
		{"record", func() error { mutate.Record(pod); return nil }},
		// On a copy, as Mutate without PodOwned: the copy is part of the figure.
		{"mutate", func() error { _, _, err := mutate.Mutate(in); return err }},
		{"patch", func() error { _, err := before.Patch(out); return err }},
	} {
		b.Run(stage.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := stage.run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodePod decodes a worker pod of the chart as the API server sends
// it (with the Job controller's managed fields) into a whole corev1.Pod, and
// the way the handler does.
func BenchmarkDecodePod(b *testing.B) {
	_, podJSON := loadPod(b, "../mutate/testdata/pytorch-job-pod-as-sent.yaml")
	b.Run("whole", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := kjson.UnmarshalCaseSensitivePreserveInts(podJSON, &corev1.Pod{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("handler", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodePod(podJSON); err != nil {
				b.Fatal(err)
			}
		}
	})
}

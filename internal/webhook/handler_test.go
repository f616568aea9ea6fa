package webhook

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	evanphx "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/elastic-training/elastic-training/internal/mutate"
	"github.com/elastic-training/elastic-training/internal/mutate/mutatetest"
)

// goldenConfig is the configuration internal/mutate's golden files were made with.
func goldenConfig() mutate.Config {
	cfg := mutate.DefaultConfig()
	cfg.SidecarImage = "example.com/rdzv-sidecar:v0.1.0"
	cfg.ExtraAccelerators = []string{"example.com/tpu"}
	cfg.WebhookNamespace = "elastic-training-system"
	return cfg
}

// admit runs raw through the handler the way the server does (including
// Response.Complete, which serialises the patch) and returns the response.
func admit(t *testing.T, cfg mutate.Config, namespace string, raw []byte) admission.Response {
	t.Helper()
	return admitWith(t, cfg, nil, namespace, raw)
}

func admitWith(t *testing.T, cfg mutate.Config, events record.EventRecorder, namespace string, raw []byte) admission.Response {
	t.Helper()
	mutator, err := NewPodMutator(cfg, prometheus.NewRegistry(), events)
	require.NoError(t, err)
	wh := &admission.Webhook{Handler: mutator}
	return wh.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "uid-1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: namespace,
		Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
	}})
}

// applyPatch applies the response's JSON patch to raw as the API server does
// (k8s.io/apiserver's mutating dispatcher uses this json-patch library).
func applyPatch(t *testing.T, resp admission.Response, raw []byte) []byte {
	t.Helper()
	if len(resp.Patch) == 0 {
		return raw
	}
	require.NotNil(t, resp.PatchType)
	require.Equal(t, admissionv1.PatchTypeJSONPatch, *resp.PatchType)
	p, err := evanphx.DecodePatch(resp.Patch)
	require.NoError(t, err)
	out, err := p.Apply(raw)
	require.NoError(t, err, "patch %s", resp.Patch)
	return out
}

// TestPatchGivesMutatedPod: for every golden input of internal/mutate, the
// patch the webhook answers, applied to the pod in the request, gives exactly
// the pod (and the warnings) mutate.Mutate returns; the request's JSON is
// either the typed pod printed by encoding/json, as the API server sends it,
// or the input file's YAML turned into JSON as it stands (no zero values, GPU
// counts as numbers).
func TestPatchGivesMutatedPod(t *testing.T) {
	inputs, err := filepath.Glob("../mutate/testdata/*.yaml")
	require.NoError(t, err)
	n := 0
	for _, in := range inputs {
		if strings.HasSuffix(in, ".golden.yaml") {
			continue
		}
		n++
		pod := readPod(t, in)
		typed, asWritten := mutatetest.JSONForms(t, in)
		for _, raw := range []struct {
			name string
			json []byte
		}{{"typed", typed}, {"as written", asWritten}} {
			t.Run(strings.TrimSuffix(filepath.Base(in), ".yaml")+"/"+raw.name, func(t *testing.T) {
				cfg := goldenConfig()
				res, err := mutate.Mutate(mutate.Input{Pod: pod, Namespace: pod.Namespace, Config: cfg})
				require.NoError(t, err)
				want, warnings := res.Pod, res.Warnings

				resp := admit(t, cfg, pod.Namespace, raw.json)
				require.True(t, resp.Allowed, "%v", resp.Result)
				assert.Equal(t, warnings, resp.Warnings)
				got := &corev1.Pod{}
				require.NoError(t, json.Unmarshal(applyPatch(t, resp, raw.json), got))
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("patched pod differs from mutate.Mutate's (-want +got):\n%s", diff)
				}
			})
		}
	}
	require.GreaterOrEqual(t, n, 15, "golden inputs")
}

// TestDecodeErrors: a request whose pod cannot be decoded is answered with
// an error, not a crash or a patch.
func TestDecodeErrors(t *testing.T) {
	for _, raw := range []string{``, `{"metadata":`, `{"metadata":[]}`} {
		resp := admit(t, goldenConfig(), "team-a", []byte(raw))
		assert.False(t, resp.Allowed, "%q", raw)
		assert.Equal(t, int32(http.StatusBadRequest), resp.Result.Code, "%q", raw)
		assert.Empty(t, resp.Patch, "%q", raw)
	}
}

// TestPatchKeepsUnknownFields: a newer API server may send fields this
// binary's k8s.io/api does not know. The patch must leave them alone (not
// remove them because the typed pod cannot carry them).
func TestPatchKeepsUnknownFields(t *testing.T) {
	pod := readPod(t, "../mutate/testdata/pytorch-worker0-serves-rdzv.yaml")
	cfg := goldenConfig()
	res, err := mutate.Mutate(mutate.Input{Pod: pod, Namespace: pod.Namespace, Config: cfg})
	require.NoError(t, err)
	want := res.Pod

	typed, err := json.Marshal(pod)
	require.NoError(t, err)
	doc := map[string]any{}
	require.NoError(t, json.Unmarshal(typed, &doc))
	unknown := map[string]any{"a": "b", "n": []any{1.0, 2.0}}
	meta := doc["metadata"].(map[string]any)
	spec := doc["spec"].(map[string]any)
	trainer := spec["containers"].([]any)[0].(map[string]any)
	meta["futureMetadataField"] = "kept"
	spec["futureSpecField"] = unknown
	trainer["futureContainerField"] = unknown                            // in a list element the webhook changes
	trainer["resources"].(map[string]any)["futureResourcesField"] = true // in an object the webhook leaves alone
	raw, err := json.Marshal(doc)
	require.NoError(t, err)

	resp := admit(t, cfg, pod.Namespace, raw)
	require.True(t, resp.Allowed, "%v", resp.Result)
	var ops []struct{ Op, Path string }
	require.NoError(t, json.Unmarshal(resp.Patch, &ops))
	require.NotEmpty(t, ops)
	for _, op := range ops {
		assert.NotEqual(t, "remove", op.Op, "unexpected %s %s", op.Op, op.Path)
	}
	patched := applyPatch(t, resp, raw)

	got := map[string]any{}
	require.NoError(t, json.Unmarshal(patched, &got))
	gotSpec := got["spec"].(map[string]any)
	gotTrainer := gotSpec["containers"].([]any)[0].(map[string]any)
	assert.Equal(t, "kept", got["metadata"].(map[string]any)["futureMetadataField"])
	assert.Equal(t, unknown, gotSpec["futureSpecField"])
	assert.Equal(t, unknown, gotTrainer["futureContainerField"])
	assert.Equal(t, true, gotTrainer["resources"].(map[string]any)["futureResourcesField"])

	gotPod := &corev1.Pod{}
	require.NoError(t, json.Unmarshal(patched, gotPod))
	if diff := cmp.Diff(want, gotPod); diff != "" {
		t.Errorf("patched pod differs from mutate.Mutate's (-want +got):\n%s", diff)
	}
}

// TestPatchKeepsUnknownFieldsWithTheirElement: the sidecar goes in front of
// the pod's own init containers (and replaces an old rdzv-sidecar). Fields
// this binary does not know must stay with the init container that has them,
// not be left at its old index, now the sidecar's.
func TestPatchKeepsUnknownFieldsWithTheirElement(t *testing.T) {
	pod := readPod(t, "../mutate/testdata/pytorch-user-values-win.yaml")
	require.Equal(t, "fetch-data", pod.Spec.InitContainers[0].Name)
	cfg := goldenConfig()
	res, err := mutate.Mutate(mutate.Input{Pod: pod, Namespace: pod.Namespace, Config: cfg})
	require.NoError(t, err)
	want := res.Pod
	require.Equal(t, []string{"rdzv-sidecar", "fetch-data"}, []string{want.Spec.InitContainers[0].Name, want.Spec.InitContainers[1].Name})

	typed, err := json.Marshal(pod)
	require.NoError(t, err)
	doc := map[string]any{}
	require.NoError(t, json.Unmarshal(typed, &doc))
	inits := doc["spec"].(map[string]any)["initContainers"].([]any)
	inits[0].(map[string]any)["futureContainerField"] = "fetch-data's"
	raw, err := json.Marshal(doc)
	require.NoError(t, err)

	resp := admit(t, cfg, pod.Namespace, raw)
	require.True(t, resp.Allowed, "%v", resp.Result)
	got := map[string]any{}
	require.NoError(t, json.Unmarshal(applyPatch(t, resp, raw), &got))
	gotInits := got["spec"].(map[string]any)["initContainers"].([]any)
	require.Len(t, gotInits, 2)
	sidecar, fetch := gotInits[0].(map[string]any), gotInits[1].(map[string]any)
	assert.Equal(t, "rdzv-sidecar", sidecar["name"])
	assert.NotContains(t, sidecar, "futureContainerField", "the sidecar got another container's field")
	assert.Equal(t, "fetch-data", fetch["name"])
	assert.Equal(t, "fetch-data's", fetch["futureContainerField"])
}

// TestEventsOnTheOwner: a denial and each warning become a Warning Event on the pod's controller (the Job that
// creates it drops admission warnings); a pod with no controller gets none. client-go's FakeRecorder stands in for
// the API server here; test/e2e/workloads (TestWebhookEventsOnTheJob) reads the real Events with kubectl.
func TestEventsOnTheOwner(t *testing.T) {
	owned := func(edit func(*corev1.Pod)) []byte {
		pod := readPod(t, "../mutate/testdata/pytorch-worker3-joins.yaml")
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "bert-worker", UID: "u1", Controller: ptrTrue()}}
		edit(pod)
		b, err := json.Marshal(pod)
		require.NoError(t, err)
		return b
	}
	cases := []struct {
		desc string
		raw  []byte
		want []string
	}{
		{"denied", owned(func(p *corev1.Pod) { p.Annotations["elastic-training.io/max-node"] = "3" }),
			[]string{"Warning PodDenied elastic-training webhook denied a pod: annotation elastic-training.io/max-node"}},
		{"warned", owned(func(p *corev1.Pod) { p.Spec.Subdomain = "other" }),
			[]string{`Warning AdmissionWarning elastic-training webhook: spec.subdomain "other" is kept`}},
		{"no controller", owned(func(p *corev1.Pod) { p.OwnerReferences = nil; p.Spec.Subdomain = "other" }), nil},
		{"clean", owned(func(*corev1.Pod) {}), nil},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			rec := record.NewFakeRecorder(10)
			admitWith(t, goldenConfig(), rec, "team-a", tc.raw)
			close(rec.Events)
			var got []string
			for e := range rec.Events {
				got = append(got, e)
			}
			require.Len(t, got, len(tc.want), "events: %q", got)
			for i, w := range tc.want {
				assert.True(t, strings.HasPrefix(got[i], w), "event %q, want prefix %q", got[i], w)
			}
		})
	}
}

func ptrTrue() *bool { b := true; return &b }

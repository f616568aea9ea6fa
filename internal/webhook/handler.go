// Package webhook adapts the pure mutate package to controller-runtime's
// admission webhook server: it decodes the request, asks mutate.ShouldMutate,
// calls mutate.Mutate and turns the result into a JSON patch response. It holds
// no logic of its own.
package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/jsonpatch"
	"github.com/elastic-training/elastic-training/internal/mutate"
)

// Paths the server serves.
const (
	PathMutatePods = "/mutate-pods"
	// PathNoop admits everything without looking at it: the baseline the
	// benchmark compares PathMutatePods with, on the same server.
	PathNoop = "/noop"
)

var decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "elastic_training_webhook_pods_total",
	Help: "Pod admission decisions of the elastic-training webhook, by result (mutated, skipped, denied, errored).",
}, []string{"result"})

func init() { metrics.Registry.MustRegister(decisions) }

// PodMutator is the admission.Handler for pods.
type PodMutator struct {
	Config mutate.Config
}

// NewPodMutator returns a handler that mutates pods with cfg.
func NewPodMutator(cfg mutate.Config) *PodMutator {
	return &PodMutator{Config: cfg}
}

// Handle implements admission.Handler.
func (h *PodMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	// controller-runtime's request logger already carries the namespace, name,
	// user and request ID.
	log := logf.FromContext(ctx)
	if req.Operation != admissionv1.Create || req.Kind.Group != "" || req.Kind.Kind != "Pod" || req.SubResource != "" {
		decisions.WithLabelValues("skipped").Inc()
		return admission.Allowed("only pod CREATE is mutated")
	}
	pod, unknownFields, err := decodePod(req.Object.Raw)
	if err != nil {
		decisions.WithLabelValues("errored").Inc()
		return admission.Errored(http.StatusBadRequest, err)
	}
	if ok, why := mutate.ShouldMutate(pod, req.Namespace, h.Config); !ok {
		decisions.WithLabelValues("skipped").Inc()
		log.V(1).Info("pod skipped", "reason", why)
		return admission.Allowed(why)
	}
	// The patch is the difference between the typed pod before and after
	// Mutate. When the request carries fields this binary's k8s.io/api does
	// not know (a newer API server's), the raw JSON must not be diffed
	// against the mutated pod: the patch would remove them. They only live
	// inside objects, so list indices are the same in the raw and the typed
	// JSON and the typed diff applies to the raw pod; jsonpatch.Create keeps
	// list elements that only move (the pod's own init containers behind the
	// sidecar) where they are, so their unknown fields stay with them
	// (TestPatchKeepsUnknownFields*). Without unknown fields the raw JSON is
	// the typed pod, and printing it again would only cost time.
	original := req.Object.Raw
	if unknownFields {
		if original, err = json.Marshal(pod); err != nil {
			decisions.WithLabelValues("errored").Inc()
			return admission.Errored(http.StatusInternalServerError, err)
		}
	}
	if pod.Name == "" && req.Name != "" {
		pod.Name = req.Name
	}
	// The pod was decoded for this request alone: Mutate may change it in
	// place rather than copy it. What the denial log needs is read first.
	job, generateName := pod.Labels[constants.LabelJob], pod.GenerateName
	out, warnings, err := mutate.Mutate(mutate.Input{Pod: pod, PodOwned: true, Namespace: req.Namespace, Config: h.Config})
	if err != nil {
		decisions.WithLabelValues("denied").Inc()
		log.Info("pod denied", "job", job, "generateName", generateName, "reason", err.Error())
		return admission.Denied("elastic-training: " + err.Error())
	}
	buf := buffers.Get().(*bytes.Buffer)
	defer putBuffer(buf)
	// Encoder.Encode prints what json.Marshal does (and a newline, which
	// jsonpatch.Create ignores) into a buffer kept for the next request.
	if err := json.NewEncoder(buf).Encode(out); err != nil {
		decisions.WithLabelValues("errored").Inc()
		return admission.Errored(http.StatusInternalServerError, err)
	}
	mutated := buf.Bytes()
	decisions.WithLabelValues("mutated").Inc()
	// Debug level: a scale-up creates many pods at once and the decision
	// counters already say how many were mutated; denials are logged at info.
	if debug := log.V(1); debug.Enabled() {
		debug.Info("pod mutated", "job", out.Labels[constants.LabelJob], "hostname", out.Spec.Hostname,
			"result", out.Annotations[constants.AnnotationMutated], "warnings", len(warnings))
	}
	resp, err := patchResponse(original, mutated)
	if err != nil {
		decisions.WithLabelValues("errored").Inc()
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return resp.WithWarnings(warnings...)
}

// buffers holds the buffers the mutated pods are printed into: a pod's JSON
// is only diffed, and the patch copies what it keeps of it.
var buffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func putBuffer(b *bytes.Buffer) {
	// A very large pod's buffer is left to the garbage collector.
	if b.Cap() <= 1<<20 {
		b.Reset()
		buffers.Put(b)
	}
}

// patchResponse allows the pod with the JSON patch from original to mutated.
// It is admission.PatchResponseFromRaw with internal/jsonpatch instead of
// gomodules.xyz/jsonpatch/v2 (several times cheaper), and with the patch
// encoded here: Response.Complete encodes Response.Patches only when they
// are set. The response holds no reference to mutated, whose buffer Handle
// reuses (the operations' values are slices of it; the encoded patch copies
// them).
func patchResponse(original, mutated []byte) (admission.Response, error) {
	ops, err := jsonpatch.Create(original, mutated)
	if err != nil {
		return admission.Response{}, err
	}
	resp := admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: true}}
	if len(ops) == 0 {
		return resp, nil
	}
	if resp.Patch, err = jsonpatch.Marshal(ops); err != nil {
		return admission.Response{}, err
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.PatchType = &pt
	return resp, nil
}

// decodePod decodes the request's pod the way controller-runtime's
// admission.Decoder does in the end (its scheme-based deserializer hands a type
// it does not know to sigs.k8s.io/json, case-sensitive and not strict, so that
// fields a newer API server sends are ignored), without the deserializer's
// extra passes over the document to sniff its format and apiVersion/kind.
// unknownFields tells whether the JSON had fields the pod type has not (the
// same decoding, which also collects them, costs no more).
func decodePod(raw []byte) (pod *corev1.Pod, unknownFields bool, err error) {
	if len(raw) == 0 {
		return nil, false, errors.New("decode pod: there is no content to decode")
	}
	pod = &corev1.Pod{}
	unknown, err := kjson.UnmarshalStrict(raw, pod, kjson.DisallowUnknownFields)
	if err != nil {
		return nil, false, fmt.Errorf("decode pod: %w", err)
	}
	return pod, len(unknown) > 0, nil
}

// Noop admits every request unchanged.
func Noop() admission.Handler {
	return admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		return admission.Allowed("")
	})
}

// Package webhook adapts the pure mutate package to controller-runtime's
// admission webhook server: it decodes the request, asks mutate.ShouldMutate,
// calls mutate.Mutate and turns the result into a JSON patch response. It holds
// no logic of its own.
package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"

	"github.com/elastic-training/elastic-training/internal/constants"
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
	pod, err := decodePod(req.Object.Raw)
	if err != nil {
		decisions.WithLabelValues("errored").Inc()
		return admission.Errored(http.StatusBadRequest, err)
	}
	if ok, why := mutate.ShouldMutate(pod, req.Namespace, h.Config); !ok {
		decisions.WithLabelValues("skipped").Inc()
		log.V(1).Info("pod skipped", "reason", why)
		return admission.Allowed(why)
	}
	// The patch describes what Mutate added to the pod Record saw, rather
	// than the difference between the request's JSON and the mutated pod
	// printed: that is several times cheaper, and it never touches fields
	// this binary's k8s.io/api does not know (a newer API server's), which a
	// typed pod cannot carry.
	before := mutate.Record(pod)
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
	patch, err := before.Patch(out)
	if err != nil {
		decisions.WithLabelValues("errored").Inc()
		log.Error(err, "no patch for a mutated pod", "job", job, "generateName", generateName)
		return admission.Errored(http.StatusInternalServerError, err)
	}
	decisions.WithLabelValues("mutated").Inc()
	// Debug level: a scale-up creates many pods at once and the decision
	// counters already say how many were mutated; denials are logged at info.
	if debug := log.V(1); debug.Enabled() {
		debug.Info("pod mutated", "job", out.Labels[constants.LabelJob], "hostname", out.Spec.Hostname,
			"result", out.Annotations[constants.AnnotationMutated], "warnings", len(warnings))
	}
	// Response.Complete encodes Response.Patches only when they are set.
	resp := admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: true}}
	if patch != nil {
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = patch, &pt
	}
	return resp.WithWarnings(warnings...)
}

// decodePod decodes the request's pod the way controller-runtime's
// admission.Decoder does in the end (its scheme-based deserializer hands a type
// it does not know to sigs.k8s.io/json, case-sensitive and not strict, so that
// fields a newer API server sends are ignored), without the deserializer's
// extra passes over the document to sniff its format and apiVersion/kind.
//
// It leaves out what Mutate never reads and the patch never touches: the
// status, and metadata.managedFields, which the API server sends with every
// pod a controller creates: decoding them was a fifth of decoding a worker
// pod of the chart as sent (BenchmarkDecodePod). The decoder still scans
// them.
func decodePod(raw []byte) (*corev1.Pod, error) {
	if len(raw) == 0 {
		return nil, errors.New("decode pod: there is no content to decode")
	}
	var d admittedPod
	if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, &d); err != nil {
		return nil, fmt.Errorf("decode pod: %w", err)
	}
	return &corev1.Pod{TypeMeta: d.TypeMeta, ObjectMeta: d.Metadata.ObjectMeta, Spec: d.Spec}, nil
}

// admittedPod is a corev1.Pod without status and managed fields.
type admittedPod struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        struct {
		metav1.ObjectMeta
		// Shallower than ObjectMeta's field of the same name: it takes the key.
		ManagedFields skipped `json:"managedFields"`
	} `json:"metadata"`
	Spec corev1.PodSpec `json:"spec"`
}

// skipped takes a JSON value and keeps nothing of it.
type skipped struct{}

func (*skipped) UnmarshalJSON([]byte) error { return nil }

// Noop admits every request unchanged.
func Noop() admission.Handler {
	return admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		return admission.Allowed("")
	})
}

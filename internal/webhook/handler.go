// Package webhook adapts the pure mutate package to controller-runtime's
// admission webhook server: it decodes the request, asks mutate.ShouldMutate,
// calls mutate.Mutate and answers with its patch; what to change in a pod is
// mutate's alone. Around that it records denials and warnings as Events on
// the pod's Job or StatefulSet (handler.go), serves with TLS and bounded
// request bodies (server.go), and is the webhook chart's helm test client,
// `webhook check` (check.go).
package webhook

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/mutate"
)

// PathMutatePods is the path the server serves the pod webhook on.
const PathMutatePods = "/mutate-pods"

// PodMutator is the admission.Handler for pods.
type PodMutator struct {
	config    mutate.Config
	decoder   admission.Decoder
	decisions *prometheus.CounterVec
	events    record.EventRecorder // nil: none
	ca        *caFile              // with config.PodReplacement.URL: the CA serving sidecars get
}

// Event reasons on a pod's Job or StatefulSet.
const (
	ReasonDenied  = "PodDenied"        // the webhook denied a pod of it
	ReasonWarning = "AdmissionWarning" // the webhook admitted a pod with a warning
)

// NewPodMutator returns a handler that mutates pods with cfg and counts its
// decisions in reg. With events, denials and warnings also become Events on
// the pod's controller (its Job or StatefulSet): the controller that creates
// the pods drops admission warnings, and a denial otherwise shows only in its
// own, easily missed, FailedCreate event.
func NewPodMutator(cfg mutate.Config, reg prometheus.Registerer, events record.EventRecorder) (*PodMutator, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "elastic_training_webhook_pods_total",
		Help: "Pod admission decisions of the elastic-training webhook, by result (mutated, skipped, denied, errored).",
	}, []string{"result"})
	if err := reg.Register(decisions); err != nil {
		return nil, err
	}
	return &PodMutator{config: cfg, decoder: admission.NewDecoder(scheme), decisions: decisions, events: events}, nil
}

// Handle implements admission.Handler.
func (h *PodMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	// controller-runtime's request logger already carries the namespace, name,
	// user and request ID.
	log := logf.FromContext(ctx)
	if req.Operation != admissionv1.Create || req.Kind.Group != "" || req.Kind.Kind != "Pod" || req.SubResource != "" {
		h.decisions.WithLabelValues("skipped").Inc()
		return admission.Allowed("only pod CREATE is mutated")
	}
	pod := &corev1.Pod{}
	if err := h.decoder.Decode(req, pod); err != nil {
		h.decisions.WithLabelValues("errored").Inc()
		return admission.Errored(http.StatusBadRequest, err)
	}
	cfg := h.config
	if cfg.PodReplacement.URL != "" && h.ca != nil {
		cfg.PodReplacement.CA = h.ca.load()
	}
	if ok, why := mutate.ShouldMutate(pod, req.Namespace, cfg); !ok {
		h.decisions.WithLabelValues("skipped").Inc()
		log.V(1).Info("pod skipped", "reason", why)
		return admission.Allowed(why)
	}
	res, err := mutate.Mutate(mutate.Input{Pod: pod, Namespace: req.Namespace, Config: cfg})
	if err != nil {
		h.decisions.WithLabelValues("denied").Inc()
		log.Info("pod denied", "job", pod.Labels[constants.LabelJob], "generateName", pod.GenerateName, "reason", err.Error())
		h.event(pod, req.Namespace, corev1.EventTypeWarning, ReasonDenied, "elastic-training webhook denied a pod: "+err.Error())
		return admission.Denied("elastic-training: " + err.Error())
	}
	h.decisions.WithLabelValues("mutated").Inc()
	// Debug level: a scale-up creates many pods at once and the decision
	// counters already say how many were mutated; denials are logged at info.
	log.V(1).Info("pod mutated", "job", res.Pod.Labels[constants.LabelJob], "hostname", res.Pod.Spec.Hostname,
		"result", res.Pod.Annotations[constants.AnnotationMutated], "warnings", len(res.Warnings))
	for _, w := range res.Warnings {
		h.event(pod, req.Namespace, corev1.EventTypeWarning, ReasonWarning, "elastic-training webhook: "+w)
	}
	return admission.Patched("", res.Patch...).WithWarnings(res.Warnings...)
}

// event records an Event on the pod's controller, if it has one (a pod
// created directly has no object to carry it yet: it is not stored before
// admission). The recorder aggregates repeats, so a 500-pod Job with one
// problem gets one Event with a count.
func (h *PodMutator) event(pod *corev1.Pod, namespace, kind, reason, msg string) {
	owner := metav1.GetControllerOf(pod)
	if h.events == nil || owner == nil {
		return
	}
	h.events.Event(&corev1.ObjectReference{APIVersion: owner.APIVersion, Kind: owner.Kind, Name: owner.Name,
		UID: owner.UID, Namespace: namespace}, kind, reason, msg)
}

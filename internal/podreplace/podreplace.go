// Package podreplace is how the pod that serves a job's rendezvous has one of that job's pods replaced, after
// repeated hangs blamed on it (docs/hangs.md): it asks the webhook, which checks who asks and deletes the pod so
// that its Job makes a new one. A job's own rights cannot do this: a Job's pod names are not known in advance, and
// a Role without resourceNames would let the job delete every pod of its namespace.
//
// The ask is one HTTPS POST of a Request to the webhook's Path, with a service account token of the asking pod
// whose audience is Audience (projected into the serving sidecar by the webhook) as its bearer token. The webhook
// reviews the token (TokenReview), so it knows the asking pod by name and UID from the API server, not from the
// request.
package podreplace

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/elastic-training/elastic-training/internal/constants"
)

const (
	// Path is the webhook's route for a replacement, beside its admission route.
	Path = "/replace-pod"
	// Audience is the audience of the token an asker sends: only the webhook accepts it, and the API server's
	// own token of the pod is never sent anywhere else.
	Audience = constants.Domain + "/webhook"
	// TokenPath is where, in the serving sidecar's token volume (constants.TokenDir), the kubelet keeps that token.
	TokenPath = "webhook-token"
	// MaxRequestBytes bounds a request's body; MaxReasonBytes its reason.
	MaxRequestBytes = 4 << 10
	MaxReasonBytes  = 1 << 10
)

// Request asks for Pod, a pod of the asker's own job in its namespace, to be deleted (its Job makes a new one).
// Reason says why, for the webhook's log and the Event on the Job.
type Request struct {
	Pod    string `json:"pod"`
	Reason string `json:"reason"`
}

// Response is the webhook's answer: on success the pod deleted and the node it ran on; on refusal, Message says
// why (also the HTTP status's body).
type Response struct {
	Pod     string `json:"pod,omitempty"`
	Node    string `json:"node,omitempty"`
	Message string `json:"message"`
}

// ParseRequest decodes and checks a request body: one JSON object of known fields, a pod name Kubernetes accepts,
// a reason of printable text within MaxReasonBytes.
func ParseRequest(b []byte) (Request, error) {
	if len(b) > MaxRequestBytes {
		return Request{}, fmt.Errorf("request of %d bytes, more than %d", len(b), MaxRequestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var r Request
	if err := dec.Decode(&r); err != nil {
		return Request{}, fmt.Errorf("want a JSON object {\"pod\": ..., \"reason\": ...}: %w", err)
	}
	if dec.More() {
		return Request{}, errors.New("more than one JSON value")
	}
	if r.Pod == "" {
		return Request{}, errors.New("pod: empty")
	}
	if errs := validation.IsDNS1123Subdomain(r.Pod); len(errs) > 0 {
		return Request{}, fmt.Errorf("pod %q: %s", r.Pod, strings.Join(errs, "; "))
	}
	if len(r.Reason) > MaxReasonBytes {
		return Request{}, fmt.Errorf("reason of %d bytes, more than %d", len(r.Reason), MaxReasonBytes)
	}
	if i := strings.IndexFunc(r.Reason, func(c rune) bool { return !unicode.IsPrint(c) }); i >= 0 {
		return Request{}, fmt.Errorf("reason: a character that is not printable at byte %d", i)
	}
	return r, nil
}

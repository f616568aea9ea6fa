package podreplace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// Identity is who a token says the asker is: a service account and the pod the token is bound to.
type Identity struct {
	Namespace, ServiceAccount string
	Pod                       string
	PodUID                    types.UID
}

// API is what the server asks the API server. Get returns nil, nil for a pod that does not exist.
type API interface {
	Review(ctx context.Context, token string) (Identity, error)
	Get(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	Delete(ctx context.Context, namespace, name string, uid types.UID) error
}

// Errors of Review: the token is not one (401) or not a pod's (403).
var (
	ErrUnauthenticated = errors.New("unauthenticated")
	ErrNotAPod         = errors.New("not a pod's token")
)

// The extra fields the API server puts in a TokenReview of a token bound to a pod.
const (
	extraPodName = "authentication.kubernetes.io/pod-name"
	extraPodUID  = "authentication.kubernetes.io/pod-uid"
)

const (
	// apiTimeout bounds each call to the API server.
	apiTimeout = 10 * time.Second
	// Window is how long a job waits between two replacements: a serving sidecar that blames wrongly (or is
	// taken over) takes a pod a window at most.
	Window = 30 * time.Second
	// maxInFlight bounds the requests handled at once: each costs a TokenReview and up to three pod calls.
	maxInFlight = 8
	// maxJobs bounds the windows remembered; past it, new jobs wait for old windows to end.
	maxJobs = 10000
)

// NewAPI is API through client-go.
func NewAPI(cs kubernetes.Interface) API { return clientAPI{cs} }

type clientAPI struct{ cs kubernetes.Interface }

func (a clientAPI) Review(ctx context.Context, token string) (Identity, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	tr, err := a.cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{Audience}}}, metav1.CreateOptions{})
	if err != nil {
		return Identity{}, fmt.Errorf("token review: %w", err)
	}
	return identityOf(tr.Status)
}

// identityOf reads a TokenReview's verdict: authenticated for Audience, a service account's, bound to a pod.
func identityOf(st authenticationv1.TokenReviewStatus) (Identity, error) {
	if !st.Authenticated {
		why := st.Error
		if why == "" {
			why = "not authenticated"
		}
		return Identity{}, fmt.Errorf("%w: %s", ErrUnauthenticated, why)
	}
	audience := false
	for _, a := range st.Audiences {
		audience = audience || a == Audience
	}
	if !audience {
		return Identity{}, fmt.Errorf("%w: the token is not for audience %s", ErrUnauthenticated, Audience)
	}
	parts := strings.Split(st.User.Username, ":")
	if len(parts) != 4 || parts[0] != "system" || parts[1] != "serviceaccount" || parts[2] == "" || parts[3] == "" {
		return Identity{}, fmt.Errorf("%w: %q is not a service account", ErrNotAPod, st.User.Username)
	}
	id := Identity{Namespace: parts[2], ServiceAccount: parts[3]}
	if v := st.User.Extra[extraPodName]; len(v) == 1 {
		id.Pod = v[0]
	}
	if v := st.User.Extra[extraPodUID]; len(v) == 1 {
		id.PodUID = types.UID(v[0])
	}
	if id.Pod == "" || id.PodUID == "" {
		return Identity{}, fmt.Errorf("%w: the token of %s/%s is bound to no pod", ErrNotAPod, id.Namespace, id.ServiceAccount)
	}
	return id, nil
}

func (a clientAPI) Get(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	p, err := a.cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("getting pod %s/%s: %w", namespace, name, err)
	}
	return p, nil
}

// Delete leaves the grace period unset, so the pod's own applies: its trainer checkpoints and its preStop hook
// leaves the rendezvous as on any other deletion. The UID precondition keeps a new pod of the same name (a
// StatefulSet's) from being deleted for its predecessor.
func (a clientAPI) Delete(ctx context.Context, namespace, name string, uid types.UID) error {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	return a.cs.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
}

// Server serves Path: it deletes a pod of a job for that job's serving pod.
type Server struct {
	api     API
	log     logr.Logger
	events  record.EventRecorder // nil: none
	results *prometheus.CounterVec
	now     func() time.Time
	slots   chan struct{}

	mu   sync.Mutex
	last map[string]time.Time // namespace/job -> its last replacement
}

// Messages of a 200: this request deleted the pod, or it was on its way out already (then nothing is deleted and
// the job's window stays open for the next).
const (
	deletedMessage  = "deleted: its controller makes a new one"
	deletingMessage = "already being deleted"
	goneMessage     = "already gone"
)

// ReasonReplaced is the reason of the Warning Event on the replaced pod's Job or StatefulSet.
const ReasonReplaced = "PodReplaced"

// Results of the counter's label.
const (
	resultReplaced = "replaced" // this request deleted the pod
	resultAlready  = "already"  // the pod was being deleted or gone: nothing to do
	resultRefused  = "refused"  // the asker or the pod failed a check, or a bound was reached
	resultFailed   = "failed"   // the API server failed a call
)

// NewServer serves replacements through api, counting them in reg; events may be nil.
func NewServer(api API, log logr.Logger, reg prometheus.Registerer, events record.EventRecorder) (*Server, error) {
	results := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "elastic_training_webhook_pod_replacements_total",
		Help: "Requests of serving sidecars to replace a pod of their job, by result: replaced; already (being deleted or gone: nothing deleted); refused (a check or a bound); failed (the API server).",
	}, []string{"result"})
	if err := reg.Register(results); err != nil {
		return nil, fmt.Errorf("registering the pod replacement metric: %w", err)
	}
	// Every result from 0, so that a rate of refusals is there before the first one.
	for _, r := range []string{resultReplaced, resultAlready, resultRefused, resultFailed} {
		results.WithLabelValues(r)
	}
	return &Server{api: api, log: log, events: events, results: results, now: time.Now,
		slots: make(chan struct{}, maxInFlight), last: map[string]time.Time{}}, nil
}

// refusal is an answer other than 200 and 500: its status and what it says.
type refusal struct {
	status int
	msg    string
}

func (r *refusal) Error() string { return r.msg }

func refuse(status int, format string, args ...any) *refusal {
	return &refusal{status, fmt.Sprintf(format, args...)}
}

// decision is what handle made of a request, and what the log says of it: who asked, for which pod.
type decision struct {
	resp Response
	err  error // a *refusal, or an API server's failure
	kv   []any
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		// Each request holds an API server call of up to apiTimeout: without a bound, a flood of them (forged
		// tokens cost the asker nothing) would become a flood of TokenReviews.
		s.answer(w, decision{err: refuse(http.StatusServiceUnavailable, "busy: %d replacement requests in progress, ask again later", maxInFlight)})
		return
	}
	// With w, a body past the bound also closes the connection rather than draining it.
	r.Body = http.MaxBytesReader(w, r.Body, MaxRequestBytes)
	s.answer(w, s.handle(r))
}

func (s *Server) answer(w http.ResponseWriter, d decision) {
	status, result := http.StatusOK, resultReplaced
	resp := d.resp
	var rf *refusal
	switch {
	case d.err == nil && resp.Message != deletedMessage:
		result = resultAlready
		s.log.Info("pod replacement: nothing to delete", append(d.kv, "message", resp.Message)...)
	case d.err == nil:
		// Logged by handle, with the reason.
	case errors.As(d.err, &rf):
		status, result = rf.status, resultRefused
		resp = Response{Message: d.err.Error()}
		s.log.Info("pod replacement refused", append(d.kv, "status", status, "why", d.err.Error())...)
	default:
		status, result = http.StatusInternalServerError, resultFailed
		resp = Response{Message: d.err.Error()}
		s.log.Error(d.err, "pod replacement failed", d.kv...)
	}
	s.results.WithLabelValues(result).Inc()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(resp)
}

// bearer is the request's bearer token; the scheme's case does not matter (RFC 9110, 11.1).
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) < 7 || !strings.EqualFold(h[:7], "bearer ") {
		return ""
	}
	return strings.TrimSpace(h[7:])
}

// handle checks the asker and the pod, and deletes it.
func (s *Server) handle(r *http.Request) decision {
	if r.Method != http.MethodPost {
		return decision{err: refuse(http.StatusMethodNotAllowed, "%s: only POST", r.Method)}
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return decision{err: refuse(http.StatusBadRequest, "request body: %v", err)}
	}
	req, err := ParseRequest(body)
	if err != nil {
		return decision{err: refuse(http.StatusBadRequest, "%v", err)}
	}
	kv := []any{"pod", req.Pod}
	token := bearer(r)
	if token == "" {
		return decision{err: refuse(http.StatusUnauthorized, "no bearer token: a serving sidecar sends its token of audience %s", Audience), kv: kv}
	}
	ctx := r.Context()
	id, err := s.api.Review(ctx, token)
	switch {
	case errors.Is(err, ErrUnauthenticated):
		return decision{err: refuse(http.StatusUnauthorized, "%v", err), kv: kv}
	case errors.Is(err, ErrNotAPod):
		return decision{err: refuse(http.StatusForbidden, "%v", err), kv: kv}
	case err != nil:
		return decision{err: err, kv: kv}
	}
	kv = append(kv, "namespace", id.Namespace, "asker", id.Pod, "serviceAccount", id.ServiceAccount)
	job, err := s.asker(ctx, id)
	if err != nil {
		return decision{err: err, kv: kv}
	}
	kv = append(kv, "job", job)
	pod, err := s.api.Get(ctx, id.Namespace, req.Pod)
	switch {
	case err != nil:
		return decision{err: fmt.Errorf("the pod to replace: %w", err), kv: kv}
	case pod == nil:
		return decision{err: refuse(http.StatusNotFound, "pod %s/%s: not found", id.Namespace, req.Pod), kv: kv}
	case pod.Labels[constants.LabelJob] != job:
		return decision{err: refuse(http.StatusForbidden, "pod %s/%s is not of job %s (its label %s: %q)",
			id.Namespace, req.Pod, job, constants.LabelJob, pod.Labels[constants.LabelJob]), kv: kv}
	}
	kv = append(kv, "node", pod.Spec.NodeName)
	out := Response{Pod: pod.Name, Node: pod.Spec.NodeName}
	if pod.DeletionTimestamp != nil {
		out.Message = deletingMessage
		return decision{resp: out, kv: kv}
	}
	key := id.Namespace + "/" + job
	if wait, full := s.take(key); full {
		return decision{err: refuse(http.StatusTooManyRequests, "%d jobs had a pod replaced in the last %s: ask again in %s", maxJobs, Window, wait), kv: kv}
	} else if wait > 0 {
		return decision{err: refuse(http.StatusTooManyRequests, "job %s had a pod replaced less than %s ago: ask again in %s", key, Window, wait), kv: kv}
	}
	if err := s.api.Delete(ctx, pod.Namespace, pod.Name, pod.UID); err != nil {
		s.give(key)
		// Conflict: the UID precondition failed, the pod asked about is gone and another of its name took its place.
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			out.Message = goneMessage
			return decision{resp: out, kv: kv}
		}
		return decision{err: fmt.Errorf("deleting pod %s/%s: %w", pod.Namespace, pod.Name, err), kv: kv}
	}
	out.Message = deletedMessage
	s.log.Info("pod replaced", append(kv, "reason", req.Reason)...)
	if ref := controllerOf(pod); s.events != nil && ref != nil {
		s.events.Event(ref, corev1.EventTypeWarning, ReasonReplaced, fmt.Sprintf("Deleted pod %s on node %s, asked by the job's serving pod %s: %s",
			pod.Name, nodeOr(pod.Spec.NodeName), id.Pod, reasonOr(req.Reason)))
	}
	return decision{resp: out, kv: kv}
}

// asker is the job whose serving pod id is: a live pod of that name and UID, running as that service account,
// labelled with its job, and given by the webhook a token for this server (the projection only the webhook adds
// to serving sidecars).
func (s *Server) asker(ctx context.Context, id Identity) (string, error) {
	p, err := s.api.Get(ctx, id.Namespace, id.Pod)
	if err != nil {
		return "", fmt.Errorf("the asking pod: %w", err)
	}
	switch {
	case p == nil:
		return "", refuse(http.StatusForbidden, "asking pod %s/%s (uid %s) does not exist", id.Namespace, id.Pod, id.PodUID)
	case p.UID != id.PodUID:
		// A token outlives its pod by up to its expiry; a new pod of the same name (a StatefulSet's) is not its asker.
		return "", refuse(http.StatusForbidden, "asking pod %s/%s (uid %s) does not exist: the token is of an earlier pod of that name, not of uid %s",
			id.Namespace, id.Pod, id.PodUID, p.UID)
	case p.DeletionTimestamp != nil:
		return "", refuse(http.StatusForbidden, "asking pod %s/%s is being deleted", id.Namespace, id.Pod)
	case p.Spec.ServiceAccountName != id.ServiceAccount:
		return "", refuse(http.StatusForbidden, "asking pod %s/%s runs as %q, not %q", id.Namespace, id.Pod, p.Spec.ServiceAccountName, id.ServiceAccount)
	case p.Labels[constants.LabelJob] == "":
		return "", refuse(http.StatusForbidden, "asking pod %s/%s is of no job (no label %s)", id.Namespace, id.Pod, constants.LabelJob)
	case !mayAsk(p):
		return "", refuse(http.StatusForbidden, "asking pod %s/%s is not a serving pod (no token of audience %s in volume %s)", id.Namespace, id.Pod, Audience, constants.TokenVolumeName)
	}
	return p.Labels[constants.LabelJob], nil
}

// mayAsk says whether the webhook gave p a token for this server: only serving sidecars get one (internal/mutate),
// so a worker's compromised trainer cannot ask even with a token of its account minted for this audience. Anyone
// who may create pods in the namespace can write such a volume too, but may also delete its pods outright.
func mayAsk(p *corev1.Pod) bool {
	for _, v := range p.Spec.Volumes {
		if v.Name != constants.TokenVolumeName || v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			if src.ServiceAccountToken != nil && src.ServiceAccountToken.Audience == Audience {
				return true
			}
		}
	}
	return false
}

// take starts key's window, or says how long the current one has to go; full: no window can start, as maxJobs
// windows are open (wait: until the first ends). Windows past their end are forgotten only then: until maxJobs,
// keeping them costs less than sweeping.
func (s *Server) take(key string) (wait time.Duration, full bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if t, ok := s.last[key]; ok && now.Sub(t) < Window {
		return ceilSecond(Window - now.Sub(t)), false
	}
	if _, ok := s.last[key]; !ok && len(s.last) >= maxJobs {
		wait = Window
		for k, t := range s.last {
			if now.Sub(t) >= Window {
				delete(s.last, k)
			} else {
				wait = min(wait, Window-now.Sub(t))
			}
		}
		if len(s.last) >= maxJobs {
			return ceilSecond(wait), true
		}
	}
	s.last[key] = now
	return 0, false
}

// ceilSecond rounds up, so that an asker told to wait "1s" is not refused again for the last half second.
func ceilSecond(d time.Duration) time.Duration {
	return (d + time.Second - 1).Truncate(time.Second)
}

// give ends key's window after a deletion that did not happen.
func (s *Server) give(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.last, key)
}

// controllerOf is the Event's object: the pod's controller (its Job or StatefulSet), where the job's other Events are.
func controllerOf(p *corev1.Pod) *corev1.ObjectReference {
	c := metav1.GetControllerOf(p)
	if c == nil {
		return nil
	}
	return &corev1.ObjectReference{APIVersion: c.APIVersion, Kind: c.Kind, Name: c.Name, UID: c.UID, Namespace: p.Namespace}
}

func reasonOr(r string) string {
	if r == "" {
		return "no reason given"
	}
	return r
}

func nodeOr(n string) string {
	if n == "" {
		return "(none yet)"
	}
	return n
}

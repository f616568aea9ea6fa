package podreplace

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// fakeAPI stands in for the API server in these table tests; test/e2e/webhook's TestPodReplacement asks a real one.
type fakeAPI struct {
	mu        sync.Mutex
	tokens    map[string]Identity
	pods      map[string]*corev1.Pod // namespace/name
	deleted   []string
	failDel   error
	failRev   error
	failGet   error
	deleteErr func(ns, name string) error // as the API server answers when the pod went away in between
}

func (f *fakeAPI) Review(_ context.Context, token string) (Identity, error) {
	if f.failRev != nil {
		return Identity{}, f.failRev
	}
	switch id, ok := f.tokens[token]; {
	case ok && id.Pod == "":
		return Identity{}, ErrNotAPod
	case ok:
		return id, nil
	}
	return Identity{}, ErrUnauthenticated
}

func (f *fakeAPI) Get(_ context.Context, ns, name string) (*corev1.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failGet != nil {
		return nil, f.failGet
	}
	if p, ok := f.pods[ns+"/"+name]; ok {
		return p.DeepCopy(), nil
	}
	return nil, nil
}

func (f *fakeAPI) Delete(_ context.Context, ns, name string, uid types.UID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failDel != nil {
		return f.failDel
	}
	if f.deleteErr != nil {
		return f.deleteErr(ns, name)
	}
	if p, ok := f.pods[ns+"/"+name]; !ok || p.UID != uid {
		return errors.New("precondition failed")
	}
	delete(f.pods, ns+"/"+name)
	f.deleted = append(f.deleted, ns+"/"+name)
	return nil
}

func jobPod(ns, name, job string, serving bool) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name),
		Labels:          map[string]string{constants.LabelJob: job},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job + "-worker", UID: "job-uid", Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{ServiceAccountName: job, NodeName: "node2"}}
	if serving {
		p.Spec.Volumes = []corev1.Volume{{Name: constants.TokenVolumeName, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: Audience, Path: TokenPath}}}}}}}
	}
	return p
}

func TestServer(t *testing.T) {
	pods := []*corev1.Pod{
		jobPod("team", "a-worker-0-aaaaa", "a", true), jobPod("team", "a-worker-1-bbbbb", "a", false),
		jobPod("team", "a-worker-2-ccccc", "a", false), jobPod("team", "b-worker-0-ddddd", "b", true),
	}
	other := jobPod("team", "x-imposter", "a", true)
	other.Spec.ServiceAccountName = "someone-else"
	gone := jobPod("team", "a-worker-3-going", "a", false)
	gone.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	plain := jobPod("team", "plain", "", true)
	api := &fakeAPI{pods: map[string]*corev1.Pod{}, tokens: map[string]Identity{
		"serving-a": {Namespace: "team", ServiceAccount: "a", Pod: "a-worker-0-aaaaa", PodUID: "uid-a-worker-0-aaaaa"},
		"worker-a":  {Namespace: "team", ServiceAccount: "a", Pod: "a-worker-1-bbbbb", PodUID: "uid-a-worker-1-bbbbb"},
		"stale-a":   {Namespace: "team", ServiceAccount: "a", Pod: "a-worker-0-aaaaa", PodUID: "uid-of-an-earlier-pod"},
		"imposter":  {Namespace: "team", ServiceAccount: "a", Pod: "x-imposter", PodUID: "uid-x-imposter"},
		"plain":     {Namespace: "team", ServiceAccount: "", Pod: "plain", PodUID: "uid-plain"},
		"no-pod":    {Namespace: "team", ServiceAccount: "a"},
	}}
	for _, p := range append(pods, other, gone, plain) {
		api.pods[p.Namespace+"/"+p.Name] = p
	}
	now := time.Date(2026, 12, 7, 21, 0, 0, 0, time.UTC)
	reg := prometheus.NewRegistry()
	events := record.NewFakeRecorder(10)
	s, err := NewServer(api, logr.Discard(), reg, events)
	require.NoError(t, err)
	s.now = func() time.Time { return now }
	srv := httptest.NewServer(s)
	defer srv.Close()

	ask := func(method, token, body string) (int, Response) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+Path, strings.NewReader(body))
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out Response
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp.StatusCode, out
	}
	for _, tc := range []struct {
		name, method, token, body string
		status                    int
		says                      string
	}{
		{"GET", http.MethodGet, "serving-a", `{"pod":"a-worker-1-bbbbb"}`, 405, "only POST"},
		{"no token", http.MethodPost, "", `{"pod":"a-worker-1-bbbbb"}`, 401, "no bearer token"},
		{"a token the API server does not know", http.MethodPost, "forged", `{"pod":"a-worker-1-bbbbb"}`, 401, "unauthenticated"},
		{"a token bound to no pod", http.MethodPost, "no-pod", `{"pod":"a-worker-1-bbbbb"}`, 403, "not a pod's token"},
		{"garbage", http.MethodPost, "serving-a", `{"pod":`, 400, "want a JSON object"},
		{"the token of an earlier pod of that name", http.MethodPost, "stale-a", `{"pod":"a-worker-1-bbbbb"}`, 403, "does not exist"},
		{"a worker: no token for the webhook", http.MethodPost, "worker-a", `{"pod":"a-worker-2-ccccc"}`, 403, "is not a serving pod"},
		{"a pod of the job's label under another account", http.MethodPost, "imposter", `{"pod":"a-worker-1-bbbbb"}`, 403, `runs as "someone-else", not "a"`},
		{"a pod of no job", http.MethodPost, "plain", `{"pod":"a-worker-1-bbbbb"}`, 403, "is of no job"},
		{"another job's pod", http.MethodPost, "serving-a", `{"pod":"b-worker-0-ddddd"}`, 403, "is not of job a"},
		{"no such pod", http.MethodPost, "serving-a", `{"pod":"a-worker-9-zzzzz"}`, 404, "not found"},
		{"already being deleted", http.MethodPost, "serving-a", `{"pod":"a-worker-3-going"}`, 200, "already being deleted"},
		{"replaced", http.MethodPost, "serving-a", `{"pod":"a-worker-1-bbbbb","reason":"2 hangs blamed on it"}`, 200, "deleted: its controller makes a new one"},
		{"a second within the window", http.MethodPost, "serving-a", `{"pod":"a-worker-2-ccccc"}`, 429, "ask again in 30s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, resp := ask(tc.method, tc.token, tc.body)
			require.Equal(t, tc.status, status, resp.Message)
			require.Contains(t, resp.Message, tc.says)
		})
	}
	require.Equal(t, []string{"team/a-worker-1-bbbbb"}, api.deleted, "one deletion, the asked one")
	require.Equal(t, "Warning PodReplaced Deleted pod a-worker-1-bbbbb on node node2, asked by the job's serving pod a-worker-0-aaaaa: 2 hangs blamed on it", <-events.Events)

	// Another job has its own window; a failed deletion gives the window back.
	api.failDel = errors.New("etcd is down")
	status, resp := ask(http.MethodPost, "serving-a", `{"pod":"a-worker-2-ccccc"}`)
	require.Equal(t, 429, status, resp.Message)
	now = now.Add(Window)
	status, resp = ask(http.MethodPost, "serving-a", `{"pod":"a-worker-2-ccccc"}`)
	require.Equal(t, 500, status)
	require.Contains(t, resp.Message, "etcd is down")
	api.failDel = nil
	status, resp = ask(http.MethodPost, "serving-a", `{"pod":"a-worker-2-ccccc"}`)
	require.Equal(t, 200, status, resp.Message)
	require.Equal(t, Response{Pod: "a-worker-2-ccccc", Node: "node2", Message: "deleted: its controller makes a new one"}, resp)

	require.Equal(t, 2.0, testutil.ToFloat64(s.results.WithLabelValues("replaced")))
	require.Equal(t, 1.0, testutil.ToFloat64(s.results.WithLabelValues("already")))
	require.Equal(t, 1.0, testutil.ToFloat64(s.results.WithLabelValues("failed")))
	require.Equal(t, 13.0, testutil.ToFloat64(s.results.WithLabelValues("refused")))
}

// A TokenReview's verdict becomes an identity only for a pod-bound service account token of the webhook's audience.
func TestIdentityOf(t *testing.T) {
	pod := map[string]authenticationv1.ExtraValue{extraPodName: {"p"}, extraPodUID: {"u"}}
	for _, tc := range []struct {
		st   authenticationv1.TokenReviewStatus
		want error
	}{
		{authenticationv1.TokenReviewStatus{Authenticated: false, Error: "expired"}, ErrUnauthenticated},
		{authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: []string{"https://kubernetes.default.svc"},
			User: authenticationv1.UserInfo{Username: "system:serviceaccount:ns:sa", Extra: pod}}, ErrUnauthenticated},
		{authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: []string{Audience},
			User: authenticationv1.UserInfo{Username: "alice", Extra: pod}}, ErrNotAPod},
		{authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: []string{Audience},
			User: authenticationv1.UserInfo{Username: "system:serviceaccount:ns:sa"}}, ErrNotAPod},
		{authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: []string{Audience},
			User: authenticationv1.UserInfo{Username: "system:serviceaccount:ns:sa", Extra: pod}}, nil},
	} {
		id, err := identityOf(tc.st)
		require.ErrorIs(t, err, tc.want, "%+v", tc.st)
		if tc.want == nil {
			require.Equal(t, Identity{Namespace: "ns", ServiceAccount: "sa", Pod: "p", PodUID: "u"}, id)
		}
	}
}

// At most maxInFlight requests are handled at once; the next is told to come back.
func TestServerBusy(t *testing.T) {
	s, err := NewServer(&fakeAPI{}, logr.Discard(), prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	for range maxInFlight {
		s.slots <- struct{}{}
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest(http.MethodPost, Path, strings.NewReader(`{"pod":"p"}`)))
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.Contains(t, w.Body.String(), "busy")
}

// eventsSeen records the object of each Event, which record.FakeRecorder leaves out.
type eventsSeen struct {
	mu  sync.Mutex
	got []string
}

func (e *eventsSeen) Event(o runtime.Object, typ, reason, msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ref, ok := o.(*corev1.ObjectReference)
	if !ok {
		e.got = append(e.got, fmt.Sprintf("not an ObjectReference: %T", o))
		return
	}
	e.got = append(e.got, fmt.Sprintf("%s %s/%s %s/%s uid=%s: %s %s %s", ref.APIVersion, ref.Kind, ref.Name, ref.Namespace, ref.Name, ref.UID, typ, reason, msg))
}

func (e *eventsSeen) Eventf(o runtime.Object, typ, reason, format string, args ...any) {
	e.Event(o, typ, reason, fmt.Sprintf(format, args...))
}

func (e *eventsSeen) AnnotatedEventf(o runtime.Object, _ map[string]string, typ, reason, format string, args ...any) {
	e.Eventf(o, typ, reason, format, args...)
}

// The Event goes to the pod's controller, where the job's other Events are; a pod without one gets none.
func TestServerEventOnController(t *testing.T) {
	sts := jobPod("team", "m-worker-1", "m", false)
	sts.OwnerReferences = []metav1.OwnerReference{
		{APIVersion: "v1", Kind: "ConfigMap", Name: "not-the-controller", UID: "cm"},
		{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "m-worker", UID: "sts-uid", Controller: ptr.To(true)},
	}
	sts.Spec.NodeName = ""
	orphan := jobPod("team", "m-orphan", "m", false)
	orphan.OwnerReferences = nil
	serving := jobPod("team", "m-worker-0", "m", true)
	api := &fakeAPI{pods: map[string]*corev1.Pod{}, tokens: map[string]Identity{
		"serving": {Namespace: "team", ServiceAccount: "m", Pod: serving.Name, PodUID: serving.UID}}}
	for _, p := range []*corev1.Pod{sts, orphan, serving} {
		api.pods["team/"+p.Name] = p
	}
	ev := &eventsSeen{}
	s, err := NewServer(api, logr.Discard(), prometheus.NewRegistry(), ev)
	require.NoError(t, err)
	now := time.Now()
	s.now = func() time.Time { return now }
	for _, pod := range []string{sts.Name, orphan.Name} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, Path, strings.NewReader(`{"pod":"`+pod+`"}`))
		r.Header.Set("Authorization", "Bearer serving")
		s.ServeHTTP(w, r)
		require.Equal(t, http.StatusOK, w.Code, w.Body.String())
		now = now.Add(Window)
	}
	require.Equal(t, []string{"apps/v1 StatefulSet/m-worker team/m-worker uid=sts-uid: Warning PodReplaced " +
		"Deleted pod m-worker-1 on node (none yet), asked by the job's serving pod m-worker-0: no reason given"}, ev.got)
	require.Equal(t, []string{"team/m-worker-1", "team/m-orphan"}, api.deleted)
}

// A failing API server is a 500 that says which call failed, never a refusal the asker would take as final; a pod
// that went away between the look and the deletion is a 200, and the job's window stays open.
func TestServerAPIFailures(t *testing.T) {
	serving, worker := jobPod("team", "a-worker-0", "a", true), jobPod("team", "a-worker-1", "a", false)
	newAPI := func() *fakeAPI {
		return &fakeAPI{pods: map[string]*corev1.Pod{"team/a-worker-0": serving, "team/a-worker-1": worker},
			tokens: map[string]Identity{"serving": {Namespace: "team", ServiceAccount: "a", Pod: serving.Name, PodUID: serving.UID}}}
	}
	down := errors.New("connection refused")
	notFound := apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "a-worker-1")
	conflict := apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, "a-worker-1", errors.New("Precondition failed: UID in precondition: x, UID in object meta: y"))
	for _, tc := range []struct {
		name   string
		change func(*fakeAPI)
		status int
		says   string
		result string
	}{
		{"TokenReview fails", func(f *fakeAPI) { f.failRev = fmt.Errorf("token review: %w", down) }, 500, "token review: connection refused", resultFailed},
		{"get fails", func(f *fakeAPI) { f.failGet = down }, 500, "the asking pod: connection refused", resultFailed},
		{"delete fails", func(f *fakeAPI) { f.failDel = down }, 500, "deleting pod team/a-worker-1: connection refused", resultFailed},
		{"deleted in between", func(f *fakeAPI) { f.deleteErr = func(string, string) error { return notFound } }, 200, goneMessage, resultAlready},
		{"replaced by one of its name in between", func(f *fakeAPI) { f.deleteErr = func(string, string) error { return conflict } }, 200, goneMessage, resultAlready},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newAPI()
			tc.change(api)
			s, err := NewServer(api, logr.Discard(), prometheus.NewRegistry(), nil)
			require.NoError(t, err)
			ask := func() *httptest.ResponseRecorder {
				w := httptest.NewRecorder()
				r := httptest.NewRequest(http.MethodPost, Path, strings.NewReader(`{"pod":"a-worker-1"}`))
				r.Header.Set("Authorization", "Bearer serving")
				s.ServeHTTP(w, r)
				return w
			}
			w := ask()
			require.Equal(t, tc.status, w.Code, w.Body.String())
			var resp Response
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &resp))
			require.Contains(t, resp.Message, tc.says)
			require.Equal(t, 1.0, testutil.ToFloat64(s.results.WithLabelValues(tc.result)))
			api.failRev, api.failGet, api.failDel, api.deleteErr = nil, nil, nil, nil
			w = ask()
			require.Equal(t, http.StatusOK, w.Code, "no deletion happened, so the window is still open: %s", w.Body.String())
		})
	}
}

// Requests the server reads no further than it must: a body past MaxRequestBytes, a bearer in any case.
func TestServerRequests(t *testing.T) {
	serving, worker := jobPod("team", "a-worker-0", "a", true), jobPod("team", "a-worker-1", "a", false)
	api := &fakeAPI{pods: map[string]*corev1.Pod{"team/a-worker-0": serving, "team/a-worker-1": worker},
		tokens: map[string]Identity{"serving": {Namespace: "team", ServiceAccount: "a", Pod: serving.Name, PodUID: serving.UID}}}
	s, err := NewServer(api, logr.Discard(), prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	for _, tc := range []struct {
		name, auth, body string
		status           int
		says             string
	}{
		{"a body past the bound", "Bearer serving", `{"pod":"a-worker-1","reason":"` + strings.Repeat("x", MaxRequestBytes) + `"}`, 400, "request body too large"},
		{"Basic", "Basic c2VydmluZw==", `{"pod":"a-worker-1"}`, 401, "no bearer token"},
		{"an empty bearer", "Bearer  ", `{"pod":"a-worker-1"}`, 401, "no bearer token"},
		{"bearer in lower case", "bearer serving", `{"pod":"a-worker-1"}`, 200, deletedMessage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, Path, strings.NewReader(tc.body))
			r.Header.Set("Authorization", tc.auth)
			s.ServeHTTP(w, r)
			require.Equal(t, tc.status, w.Code, w.Body.String())
			require.Equal(t, "application/json", w.Header().Get("Content-Type"))
			require.Contains(t, w.Body.String(), tc.says)
		})
	}
}

// A job's window: one deletion per Window, the wait rounded up; at maxJobs open windows no new one starts until
// one ends, and the ended ones are forgotten.
func TestTake(t *testing.T) {
	s, err := NewServer(&fakeAPI{}, logr.Discard(), prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	now := time.Date(2026, 12, 7, 21, 0, 0, 0, time.UTC)
	s.now = func() time.Time { return now }
	take := func(key string) string {
		wait, full := s.take(key)
		return fmt.Sprint(wait, " ", full)
	}
	require.Equal(t, "0s false", take("ns/a"))
	now = now.Add(29500 * time.Millisecond)
	require.Equal(t, "1s false", take("ns/a"), "half a second left is a second to wait")
	require.Equal(t, "0s false", take("ns/b"), "another job has a window of its own")
	now = now.Add(500 * time.Millisecond)
	require.Equal(t, "0s false", take("ns/a"))
	s.give("ns/a")
	require.Equal(t, "0s false", take("ns/a"), "a window given back")

	s.last = map[string]time.Time{}
	for i := range maxJobs {
		s.last[fmt.Sprint("ns/job-", i)] = now.Add(-time.Duration(i) * time.Microsecond)
	}
	require.Equal(t, "30s true", take("ns/new"), "every window is open: the first to end does in 29.99 s")
	require.Equal(t, "30s false", take("ns/job-0"), "a job with an open window is still told its own wait")
	now = now.Add(Window - 5*time.Microsecond)
	require.Equal(t, "0s false", take("ns/new"), "the windows that ended are forgotten")
	require.Len(t, s.last, 6, "the five windows still open and the new one")
}

// Whatever a request holds, the server answers it with a status and a JSON Response, and deletes only as allowed.
func FuzzServeHTTP(f *testing.F) {
	for _, c := range [][3]string{
		{"POST", "Bearer serving", `{"pod":"a-worker-1","reason":"2 hangs"}`},
		{"POST", "Bearer worker", `{"pod":"a-worker-0"}`},
		{"POST", "Bearer serving", `{"pod":"b-worker-0"}`},
		{"GET", "", ""},
		{"POST", "bearer \x00", `{"pod":"a-worker-1"`},
	} {
		f.Add(c[0], c[1], []byte(c[2]))
	}
	f.Fuzz(func(t *testing.T, method, auth string, body []byte) {
		if !validMethod(method) {
			return // net/http refuses those before any handler
		}
		serving, worker, other := jobPod("team", "a-worker-0", "a", true), jobPod("team", "a-worker-1", "a", false), jobPod("team", "b-worker-0", "b", true)
		api := &fakeAPI{pods: map[string]*corev1.Pod{"team/a-worker-0": serving, "team/a-worker-1": worker, "team/b-worker-0": other},
			tokens: map[string]Identity{
				"serving": {Namespace: "team", ServiceAccount: "a", Pod: serving.Name, PodUID: serving.UID},
				"worker":  {Namespace: "team", ServiceAccount: "a", Pod: worker.Name, PodUID: worker.UID},
			}}
		s, err := NewServer(api, logr.Discard(), prometheus.NewRegistry(), nil)
		require.NoError(t, err)
		r := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
		r.Method = method
		r.Header.Set("Authorization", auth)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		var resp Response
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &resp), "status %d: %q", w.Code, w.Body.String())
		require.NotEmpty(t, resp.Message)
		for _, d := range api.deleted {
			require.Equal(t, "team/a-worker-", d[:len("team/a-worker-")], "deleted %s", d)
		}
		if len(api.deleted) > 0 {
			require.Equal(t, http.StatusOK, w.Code)
			require.Equal(t, "serving", bearer(r), "deleted for %q", auth)
		}
	})
}

func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for _, c := range m {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune(`()<>@,;:\"/[]?={}`, c) {
			return false
		}
	}
	return true
}

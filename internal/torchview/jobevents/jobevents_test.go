package jobevents

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	typedbatchv1 "k8s.io/client-go/kubernetes/typed/batch/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/elastic-training/elastic-training/internal/incluster"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

const (
	ns      = "train"
	jobName = "llm"
)

// fakeAPI is API over client-go's fake clientset.
type fakeAPI struct {
	typedcorev1.EventInterface
	jobs typedbatchv1.JobInterface
}

func (f fakeAPI) Job(ctx context.Context, name string) (metav1.Object, error) {
	j, err := f.jobs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return j, nil
}

func theJob() *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: jobName, Namespace: ns, UID: "job-uid"}}
}

// start records Events on Job llm of cs, until the test ends; the buffer has its log.
func start(t *testing.T, cs *fake.Clientset) (*Recorder, *testenv.SyncBuffer) {
	t.Helper()
	var log testenv.SyncBuffer
	e := New(fakeAPI{cs.CoreV1().Events(ns), cs.BatchV1().Jobs(ns)}, jobName, slog.New(slog.NewTextHandler(&log, nil)))
	t.Cleanup(e.Stop)
	return e, &log
}

// waitEvents waits until ns holds n Events and returns them, oldest first.
func waitEvents(t *testing.T, cs *fake.Clientset, n int) []corev1.Event {
	t.Helper()
	var evs []corev1.Event
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("%d Events", n), func() error {
		l, err := cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		if evs = l.Items; len(evs) < n {
			return fmt.Errorf("%d Events: %v", len(evs), messages(evs))
		}
		return nil
	})
	// Named <job>.<creation time in hex nanoseconds>: by name is oldest first.
	slices.SortFunc(evs, func(a, b corev1.Event) int { return strings.Compare(a.Name, b.Name) })
	return evs
}

func messages(evs []corev1.Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Message)
	}
	return out
}

func jobGets(cs *fake.Clientset) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.Matches("get", "jobs") {
			n++
		}
	}
	return n
}

func TestRecordsOnTheJob(t *testing.T) {
	cs := fake.NewClientset(theJob())
	e, _ := start(t, cs)
	e.Record("Round 1 of run r: 2 nodes, 16 processes")
	e.Record("Round 2 of run r: 3 nodes, 24 processes")

	evs := waitEvents(t, cs, 2)
	want := corev1.ObjectReference{Kind: "Job", APIVersion: "batch/v1", Namespace: ns, Name: jobName, UID: "job-uid"}
	for _, ev := range evs {
		if ev.InvolvedObject != want {
			t.Errorf("involvedObject %+v, want %+v: without the UID kubectl describe job does not show it", ev.InvolvedObject, want)
		}
		if ev.Reason != ReasonRound || ev.Type != corev1.EventTypeNormal || ev.Source.Component != "rdzv-sidecar" || ev.Namespace != ns {
			t.Errorf("Event %s/%s: reason %q, type %q, source %q", ev.Namespace, ev.Name, ev.Reason, ev.Type, ev.Source.Component)
		}
	}
	if got := messages(evs); !slices.Equal(got, []string{"Round 1 of run r: 2 nodes, 16 processes", "Round 2 of run r: 3 nodes, 24 processes"}) {
		t.Errorf("messages %q", got)
	}
	if n := jobGets(cs); n != 1 {
		t.Errorf("the Job was read %d times, want once for all Events", n)
	}
}

// A warning (a hang found) is a Warning Event with its own reason, on the same Job.
func TestRecordsWarnings(t *testing.T) {
	cs := fake.NewClientset(theJob())
	e, _ := start(t, cs)
	e.Warning(ReasonHang, "round 3 hung")
	evs := waitEvents(t, cs, 1)
	if ev := evs[0]; ev.Reason != ReasonHang || ev.Type != corev1.EventTypeWarning || ev.Message != "round 3 hung" || ev.InvolvedObject.Name != jobName {
		t.Errorf("Event: reason %q, type %q, message %q, on %s", ev.Reason, ev.Type, ev.Message, ev.InvolvedObject.Name)
	}
}

// client-go's correlator counts a repeated Event on the one it recorded (a patch) instead of creating another.
func TestRepeatedMessageIsCounted(t *testing.T) {
	cs := fake.NewClientset(theJob())
	e, _ := start(t, cs)
	e.Record("Round 1 of run r: 2 nodes, 2 processes")
	e.Record("Round 1 of run r: 2 nodes, 2 processes")
	testenv.Eventually(t, 10*time.Second, "one Event counted twice", func() error {
		l, err := cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(l.Items) != 1 || l.Items[0].Count != 2 {
			var counts []int32
			for _, ev := range l.Items {
				counts = append(counts, ev.Count)
			}
			return fmt.Errorf("Events with counts %v", counts)
		}
		return nil
	})
}

// A message while the Job cannot be read is dropped (logged); the Job is read again for the next one.
func TestJobMissing(t *testing.T) {
	cs := fake.NewClientset()
	e, log := start(t, cs)
	e.Record("Round 1 of run r: 1 nodes, 1 processes")
	testenv.Eventually(t, 10*time.Second, "the missing Job logged", func() error {
		if !strings.Contains(log.String(), "cannot record the rendezvous round") {
			return fmt.Errorf("log: %q", log.String())
		}
		return nil
	})
	if !strings.Contains(log.String(), "not found") {
		t.Errorf("the log does not say the Job is not found: %s", log)
	}

	if _, err := cs.BatchV1().Jobs(ns).Create(context.Background(), theJob(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Record("Round 2 of run r: 2 nodes, 2 processes")
	evs := waitEvents(t, cs, 1)
	if got := messages(evs); !slices.Equal(got, []string{"Round 2 of run r: 2 nodes, 2 processes"}) {
		t.Errorf("messages %q, want round 2's only", got)
	}
	if evs[0].InvolvedObject.UID != "job-uid" {
		t.Errorf("involvedObject %+v", evs[0].InvolvedObject)
	}
}

// Without the Role the job chart's rendezvous.events creates, the API server forbids reading the Job or creating
// Events: that round's Event is lost, and the recorder goes on once it is allowed.
func TestPermissionDenied(t *testing.T) {
	for _, c := range []struct {
		verb, resource string
		logged         string // what the log says, if it says anything: client-go logs a refused Event itself
	}{
		{"get", "jobs", "cannot record the rendezvous round"},
		{"create", "events", ""},
	} {
		t.Run(c.verb+" "+c.resource, func(t *testing.T) {
			cs := fake.NewClientset(theJob())
			var denied atomic.Bool
			cs.PrependReactor(c.verb, c.resource, func(k8stesting.Action) (bool, runtime.Object, error) {
				if denied.CompareAndSwap(false, true) {
					return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: c.resource}, "", fmt.Errorf("no Role"))
				}
				return false, nil, nil
			})
			e, log := start(t, cs)
			e.Record("Round 1 of run r: 1 nodes, 1 processes")
			e.Record("Round 2 of run r: 2 nodes, 2 processes")
			// Recorded in order: once round 2's Event is there, round 1's was refused.
			evs := waitEvents(t, cs, 1)
			if got := messages(evs); !slices.Equal(got, []string{"Round 2 of run r: 2 nodes, 2 processes"}) {
				t.Errorf("messages %q, want round 2's only", got)
			}
			if !denied.Load() {
				t.Error("never denied")
			}
			if c.logged != "" && (!strings.Contains(log.String(), c.logged) || !strings.Contains(log.String(), "forbidden")) {
				t.Errorf("the log does not say %q, forbidden: %s", c.logged, log)
			}
		})
	}
}

// Record never blocks the rendezvous: while the API server is slow, a full queue drops the message (logged).
func TestSlowAPIServerDropsMessages(t *testing.T) {
	cs := fake.NewClientset(theJob())
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	cs.PrependReactor("get", "jobs", func(k8stesting.Action) (bool, runtime.Object, error) {
		once.Do(func() { close(entered); <-release })
		return false, nil, nil
	})
	e, log := start(t, cs)
	defer close(release) // before Stop (t.Cleanup): the recorder waits in the Job's read
	e.Record("round 0")
	<-entered // round 0 taken: the queue is empty
	for i := range cap(e.queue) {
		e.Record(fmt.Sprintf("round %d", i+1))
	}
	if strings.Contains(log.String(), "dropped") {
		t.Fatalf("dropped before the queue was full: %s", log)
	}
	e.Record("one too many")
	if !strings.Contains(log.String(), "dropped an Event") {
		t.Errorf("a message past the full queue not dropped: %s", log)
	}
}

// NewAPI sends what client-go's typed clients would: the Job by its path, Events of the Job's namespace.
func TestNewAPIRequests(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodGet {
			json.NewEncoder(w).Encode(theJob()) //nolint:errcheck
			return
		}
		json.NewEncoder(w).Encode(&corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "ev", Namespace: ns}}) //nolint:errcheck
	}))
	defer srv.Close()
	kc, err := incluster.New(&rest.Config{Host: srv.URL}, ns, corev1.SchemeGroupVersion, corev1.AddToScheme)
	if err != nil {
		t.Fatal(err)
	}
	api, ctx := NewAPI(kc), context.Background()
	ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "ev", Namespace: ns}}

	j, err := api.Job(ctx, jobName)
	if err != nil || j.GetUID() != "job-uid" {
		t.Errorf("Job: %v, %v", j, err)
	}
	for _, call := range []func() (*corev1.Event, error){
		func() (*corev1.Event, error) { return api.Create(ctx, ev, metav1.CreateOptions{}) },
		func() (*corev1.Event, error) { return api.Update(ctx, ev, metav1.UpdateOptions{}) },
		func() (*corev1.Event, error) {
			return api.Patch(ctx, "ev", types.StrategicMergePatchType, []byte(`{"count":2}`), metav1.PatchOptions{})
		},
	} {
		if out, err := call(); err != nil || out.Name != "ev" {
			t.Errorf("%v, %v", out, err)
		}
	}
	want := []string{
		"GET /apis/batch/v1/namespaces/train/jobs/llm ",
		"POST /api/v1/namespaces/train/events application/json",
		"PUT /api/v1/namespaces/train/events/ev application/json",
		"PATCH /api/v1/namespaces/train/events/ev application/strategic-merge-patch+json",
	}
	if !slices.Equal(got, want) {
		t.Errorf("requests\n%q\nwant\n%q", got, want)
	}
}

// Package jobevents records messages as Events on one Job of the pod's
// namespace, so that `kubectl describe job` shows them next to the Job's own
// events: the serving sidecar's rendezvous rounds (torchview.Recorder). The
// pod's token (constants.TokenDir, mounted by the webhook or the chart) may
// create Events and get that one Job (its UID): NewAPI.
package jobevents

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/elastic-training/elastic-training/internal/incluster"
)

// ReasonRound is the reason of the Event recorded for each torch rendezvous round.
const ReasonRound = "RendezvousRound"

// API is what a Recorder needs of the API server, in the Job's namespace. Its
// Event methods are those of client-go's typed EventInterface, so that tests
// can give client-go's fake; the sidecar's is NewAPI.
type API interface {
	// Job reads the metadata of the Job named name (an Event needs its UID).
	Job(ctx context.Context, name string) (metav1.Object, error)
	Create(ctx context.Context, ev *corev1.Event, opts metav1.CreateOptions) (*corev1.Event, error)
	Update(ctx context.Context, ev *corev1.Event, opts metav1.UpdateOptions) (*corev1.Event, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Event, error)
}

// ReasonHang and ReasonStragglers are the reasons of the Warning Events of a round found hung, and of its slow
// ranks (internal/progress); ReasonCheckpointDoesNotFit of a checkpoint save or copy that did not fit in a pod's
// checkpoint.memory (checkpoint.Incident).
const (
	ReasonHang                 = "TrainingHung"
	ReasonStragglers           = "Stragglers"
	ReasonCheckpointDoesNotFit = "CheckpointDoesNotFit"
	// ReasonPodNotReplaced: the serving sidecar asked the webhook to replace a pod blamed for repeated hangs, and
	// it did not (the webhook's own Event on a replacement is PodReplaced).
	ReasonPodNotReplaced = "PodNotReplaced"
)

// Recorder records each message as a Normal Event with reason ReasonRound on
// the Job, and warnings with their own reasons.
type Recorder struct {
	log    *slog.Logger
	job    string
	api    API
	rec    record.EventRecorder
	queue  chan event
	cancel context.CancelFunc
	done   chan struct{}
}

// New records Events on job through api. Messages are recorded in order, off
// the caller's path, by one goroutine until Stop.
func New(api API, job string, log *slog.Logger) *Recorder {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(eventSink{api})
	host, _ := os.Hostname()
	ctx, cancel := context.WithCancel(context.Background())
	// The recorder is given object references, which need no scheme to resolve.
	e := &Recorder{log: log, job: job, api: api,
		rec:   b.NewRecorder(runtime.NewScheme(), corev1.EventSource{Component: "rdzv-sidecar", Host: host}),
		queue: make(chan event, 64), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		defer b.Shutdown()
		e.run(ctx)
	}()
	return e
}

// event is one Event to record.
type event struct{ kind, reason, msg string }

// Record queues one round's message; a full queue drops it (the log has it).
func (e *Recorder) Record(msg string) { e.queueEvent(event{corev1.EventTypeNormal, ReasonRound, msg}) }

// Warning queues a Warning Event of reason; a full queue drops it (the log has it).
func (e *Recorder) Warning(reason, msg string) {
	e.queueEvent(event{corev1.EventTypeWarning, reason, msg})
}

func (e *Recorder) queueEvent(ev event) {
	select {
	case e.queue <- ev:
	default:
		e.log.Warn("dropped an Event: the API server is slow", "job", e.job, "reason", ev.reason)
	}
}

func (e *Recorder) run(ctx context.Context) {
	var ref *corev1.ObjectReference
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-e.queue:
			if ref == nil {
				j, err := e.getJob(ctx)
				if err != nil {
					e.log.Warn("cannot record the rendezvous round as an Event on the Job (the job chart's rendezvous.events creates the Role that allows it)",
						"job", e.job, "err", err)
					continue
				}
				ref = &corev1.ObjectReference{Kind: "Job", APIVersion: "batch/v1", Namespace: j.GetNamespace(), Name: j.GetName(), UID: j.GetUID()}
			}
			e.rec.Event(ref, ev.kind, ev.reason, ev.msg)
		}
	}
}

// Stop ends the goroutine; Events already handed to the broadcaster are
// still sent.
func (e *Recorder) Stop() {
	e.cancel()
	<-e.done
}

// getJob reads the Job's name and UID (an Event without the UID does not show
// in `kubectl describe job`).
func (e *Recorder) getJob(ctx context.Context) (metav1.Object, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return e.api.Job(ctx, e.job)
}

// eventSink is client-go's EventSinkImpl over API: the broadcaster's sink
// takes no context.
type eventSink struct{ api API }

func (s eventSink) Create(ev *corev1.Event) (*corev1.Event, error) {
	return s.api.Create(context.Background(), ev, metav1.CreateOptions{})
}

func (s eventSink) Update(ev *corev1.Event) (*corev1.Event, error) {
	return s.api.Update(context.Background(), ev, metav1.UpdateOptions{})
}

func (s eventSink) Patch(ev *corev1.Event, data []byte) (*corev1.Event, error) {
	return s.api.Patch(context.Background(), ev.Name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
}

// NewAPI is API through the pod's core/v1 client (incluster: client-go's
// typed clientset would double the sidecar's binary).
func NewAPI(kc *incluster.Client) API { return restAPI{kc} }

// restAPI ignores the options: the sink passes none.
type restAPI struct{ kc *incluster.Client }

func (a restAPI) Job(ctx context.Context, name string) (metav1.Object, error) {
	raw, err := a.kc.API.Get().AbsPath("/apis/batch/v1/namespaces", a.kc.Namespace, "jobs", name).DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	var j metav1.PartialObjectMetadata
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, fmt.Errorf("job %s: %w", name, err)
	}
	return &j, nil
}

func (a restAPI) Create(ctx context.Context, ev *corev1.Event, _ metav1.CreateOptions) (*corev1.Event, error) {
	out := &corev1.Event{}
	return out, a.kc.API.Post().Namespace(ev.Namespace).Resource("events").Body(ev).Do(ctx).Into(out)
}

func (a restAPI) Update(ctx context.Context, ev *corev1.Event, _ metav1.UpdateOptions) (*corev1.Event, error) {
	out := &corev1.Event{}
	return out, a.kc.API.Put().Namespace(ev.Namespace).Resource("events").Name(ev.Name).Body(ev).Do(ctx).Into(out)
}

// Patch has no Event to take the namespace from; it is the Job's, the client's.
func (a restAPI) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, _ metav1.PatchOptions, _ ...string) (*corev1.Event, error) {
	out := &corev1.Event{}
	return out, a.kc.API.Patch(pt).Namespace(a.kc.Namespace).Resource("events").Name(name).Body(data).Do(ctx).Into(out)
}

// Package jobevents records messages as Events on one Job of the pod's
// namespace, so that `kubectl describe job` shows them next to the Job's own
// events: the serving sidecar's rendezvous rounds (torchview.Recorder). The
// pod's token (constants.TokenDir, mounted by the webhook or the chart) may
// create Events and get that one Job (its UID).
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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/elastic-training/elastic-training/internal/incluster"
)

// ReasonRound is the reason of the Event recorded for each torch rendezvous round.
const ReasonRound = "RendezvousRound"

// Recorder records each message as a Normal Event with reason ReasonRound on
// the Job.
type Recorder struct {
	log    *slog.Logger
	job    string
	ns     string
	api    rest.Interface
	rec    record.EventRecorder
	queue  chan string
	cancel context.CancelFunc
	done   chan struct{}
}

// New connects with the pod's in-cluster config. Messages are recorded in
// order, off the caller's path, by one goroutine until Stop.
func New(job string, log *slog.Logger) (*Recorder, error) {
	kc, err := incluster.CoreV1()
	if err != nil {
		return nil, fmt.Errorf("events on Job %s: %w", job, err)
	}
	api, namespace, sch := kc.API, kc.Namespace, kc.Scheme
	b := record.NewBroadcaster()
	b.StartRecordingToSink(eventSink{api})
	host, _ := os.Hostname()
	ctx, cancel := context.WithCancel(context.Background())
	e := &Recorder{log: log, job: job, ns: namespace, api: api,
		rec:   b.NewRecorder(sch, corev1.EventSource{Component: "rdzv-sidecar", Host: host}),
		queue: make(chan string, 64), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		defer b.Shutdown()
		e.run(ctx)
	}()
	return e, nil
}

// Record queues one message; a full queue drops it (the log has it).
func (e *Recorder) Record(msg string) {
	select {
	case e.queue <- msg:
	default:
		e.log.Warn("dropped a rendezvous Event: the API server is slow", "job", e.job)
	}
}

func (e *Recorder) run(ctx context.Context) {
	var ref *corev1.ObjectReference
	for {
		select {
		case <-ctx.Done():
			return
		case msg := <-e.queue:
			if ref == nil {
				j, err := e.getJob(ctx)
				if err != nil {
					e.log.Warn("cannot record the rendezvous round as an Event on the Job (the job chart's rendezvous.events creates the Role that allows it)",
						"job", e.job, "err", err)
					continue
				}
				ref = &corev1.ObjectReference{Kind: "Job", APIVersion: "batch/v1", Namespace: j.Namespace, Name: j.Name, UID: j.UID}
			}
			e.rec.Event(ref, corev1.EventTypeNormal, ReasonRound, msg)
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
func (e *Recorder) getJob(ctx context.Context) (*metav1.PartialObjectMetadata, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	raw, err := e.api.Get().AbsPath("/apis/batch/v1/namespaces", e.ns, "jobs", e.job).DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	var j metav1.PartialObjectMetadata
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, fmt.Errorf("job %s: %w", e.job, err)
	}
	return &j, nil
}

// eventSink is client-go's EventSinkImpl over the core/v1 REST client.
type eventSink struct{ api rest.Interface }

func (s eventSink) Create(ev *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	return out, s.api.Post().Namespace(ev.Namespace).Resource("events").Body(ev).Do(context.Background()).Into(out)
}

func (s eventSink) Update(ev *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	return out, s.api.Put().Namespace(ev.Namespace).Resource("events").Name(ev.Name).Body(ev).Do(context.Background()).Into(out)
}

func (s eventSink) Patch(ev *corev1.Event, data []byte) (*corev1.Event, error) {
	out := &corev1.Event{}
	return out, s.api.Patch(types.StrategicMergePatchType).Namespace(ev.Namespace).Resource("events").Name(ev.Name).
		Body(data).Do(context.Background()).Into(out)
}

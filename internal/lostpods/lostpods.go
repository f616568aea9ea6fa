// Package lostpods lets a StatefulSet replace a member pod whose node is lost.
//
// Kubernetes never replaces a StatefulSet pod on a node that stopped answering
// (kubernetes/kubernetes#54368): the taint manager evicts it once its
// not-ready/unreachable toleration runs out, but the pod stays Terminating until
// the node's kubelet confirms, which a lost node never does, and the StatefulSet
// will not start a second pod of the same name. The job's MPI workers are
// StatefulSet pods. The serving sidecar already sees such a pod leave the
// membership (its lease ends); from then on it watches that one pod, and once
// Kubernetes itself has given up on it (evicted by the taint manager, the
// node's judgement and the pod's toleration both spent) it deletes it for good,
// as an administrator would with `kubectl delete pod --force`. It never judges a
// node itself: a pod that only lost its lease is left alone.
package lostpods

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// API is what the reaper asks of the API server, about pods of its namespace.
type API interface {
	// Get returns the pod, or nil when there is none of that name.
	Get(ctx context.Context, name string) (*corev1.Pod, error)
	// ForceDelete deletes the pod with no grace period, only if its UID is uid.
	ForceDelete(ctx context.Context, name string, uid types.UID) error
}

// Config configures a Reaper.
type Config struct {
	API API
	// StatefulSets are the names of the job's member StatefulSets: only their
	// pods are ever deleted (the job's Role allows no other).
	StatefulSets []string
	Log          *slog.Logger
	// Interval between two looks at a pod that left (default 2 s), and how long
	// to keep looking before leaving it to others (default 15 min: the node's
	// grace period and any toleration a user sets).
	Interval, GiveUp time.Duration
}

// Reaper watches the pods that left the membership. Its methods are safe for
// concurrent use; nil does nothing.
type Reaper struct {
	cfg      Config
	pod      *regexp.Regexp // a pod name of one of the StatefulSets
	ctx      context.Context
	mu       sync.Mutex
	watching map[string]*watch
	wg       sync.WaitGroup
}

type watch struct{ stop context.CancelFunc }

// New returns a Reaper whose watches end with ctx.
func New(ctx context.Context, cfg Config) *Reaper {
	if cfg.Interval <= 0 {
		cfg.Interval = 2 * time.Second
	}
	if cfg.GiveUp <= 0 {
		cfg.GiveUp = 15 * time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	names := make([]string, len(cfg.StatefulSets))
	for i, s := range cfg.StatefulSets {
		names[i] = regexp.QuoteMeta(s)
	}
	return &Reaper{cfg: cfg, ctx: ctx, watching: map[string]*watch{},
		pod: regexp.MustCompile(`^(` + strings.Join(names, "|") + `)-[0-9]+$`)}
}

// MembersChanged is the membership's change (hosts: the members' DNS names,
// whose first label is the pod's hostname, its name for a StatefulSet pod).
func (r *Reaper) MembersChanged(joined, left []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range joined {
		if w, ok := r.watching[podName(h)]; ok {
			w.stop()
			delete(r.watching, podName(h))
		}
	}
	for _, h := range left {
		name := podName(h)
		if _, ok := r.watching[name]; ok || !r.pod.MatchString(name) || r.ctx.Err() != nil {
			continue
		}
		ctx, stop := context.WithTimeout(r.ctx, r.cfg.GiveUp)
		w := &watch{stop: stop}
		r.watching[name] = w
		r.wg.Go(func() {
			defer r.done(name, w)
			r.watch(ctx, name)
		})
	}
}

// Wait returns once every watch has ended (after ctx).
func (r *Reaper) Wait() {
	if r != nil {
		r.wg.Wait()
	}
}

func (r *Reaper) done(name string, w *watch) {
	w.stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watching[name] == w { // not a later watch of the same name
		delete(r.watching, name)
	}
}

// watch looks at the pod every Interval until it is gone, back, deleted here,
// or ctx ends.
func (r *Reaper) watch(ctx context.Context, name string) {
	log := r.cfg.Log.With("pod", name)
	log.Info("member left: watching its pod until Kubernetes evicts it from a lost node or it comes back")
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	var lastErr string
	for {
		p, err := r.cfg.API.Get(ctx, name)
		if ctx.Err() != nil { // the member came back meanwhile, or the sidecar stops
			return
		}
		switch {
		case err != nil:
			if err.Error() != lastErr { // once per distinct error, not every interval
				log.Warn("cannot read the pod (the job chart's forceDeleteLostPods creates the Role that allows it)", "err", err)
				lastErr = err.Error()
			}
		case p == nil:
			log.Info("pod gone: its StatefulSet replaces it")
			return
		default:
			if why, lost := Lost(p); lost {
				if err := r.cfg.API.ForceDelete(ctx, name, p.UID); err != nil {
					log.Warn("force-deleting the lost pod failed; trying again", "node", p.Spec.NodeName, "err", err)
					break
				}
				log.Info("force-deleted a pod lost with its node, so that its StatefulSet replaces it",
					"node", p.Spec.NodeName, "why", why)
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Lost says whether Kubernetes gave up on p with its node: the taint manager
// evicted it (its node not ready or unreachable for longer than p tolerates)
// and p is still there, which a StatefulSet pod stays until its kubelet
// answers. Only StatefulSet pods: a Job replaces its terminating pods itself.
func Lost(p *corev1.Pod) (why string, lost bool) {
	if p.DeletionTimestamp == nil || !ownedByStatefulSet(p) {
		return "", false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue && c.Reason == "DeletionByTaintManager" {
			return c.Message, true
		}
	}
	return "", false
}

func ownedByStatefulSet(p *corev1.Pod) bool {
	for _, o := range p.OwnerReferences {
		if o.Kind == "StatefulSet" && o.Controller != nil && *o.Controller {
			return true
		}
	}
	return false
}

// podName is a member host's first DNS label.
func podName(host string) string {
	name, _, _ := strings.Cut(host, ".")
	return name
}

package framework

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

// PollInterval is how often WaitFor checks its condition.
const PollInterval = 250 * time.Millisecond

// WaitFor polls cond (testenv.Poll, every PollInterval) until it returns true, and fails the test when timeout
// passes first. An error from cond with false means "not yet, because...": polling goes on, and the last error
// is part of the failure message. True ends the wait even with an error.
// It returns as soon as the test's context is done.
func (c *Cluster) WaitFor(t testing.TB, timeout time.Duration, desc string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	if err := testenv.Poll(t.Context(), timeout, PollInterval, cond); err != nil {
		t.Fatalf("waiting for %s: %v", desc, err)
	}
}

// WaitPodsReady waits until exactly n pods match the label selector in ns, none of them terminating and
// all of them Ready, and returns them sorted by name.
func (c *Cluster) WaitPodsReady(t testing.TB, ns, selector string, n int, timeout time.Duration) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	c.WaitFor(t, timeout, fmt.Sprintf("%d Ready pods %q in %s", n, selector, ns), func(ctx context.Context) (bool, error) {
		list, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err
		}
		var notReady []string
		for _, p := range list.Items {
			if p.DeletionTimestamp != nil || !PodReady(&p) {
				notReady = append(notReady, p.Name+" ("+string(p.Status.Phase)+")")
			}
		}
		if len(list.Items) != n || len(notReady) > 0 {
			return false, fmt.Errorf("%d pods, not ready: %v", len(list.Items), notReady)
		}
		pods = list.Items
		return true, nil
	})
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	return pods
}

// WaitPodPhase waits until the pod reaches the phase and returns it. Reaching the other terminal phase
// (Failed when waiting for Succeeded, and the reverse) fails the test at once.
func (c *Cluster) WaitPodPhase(t testing.TB, ns, name string, phase corev1.PodPhase, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	var final error
	c.WaitFor(t, timeout, fmt.Sprintf("pod %s/%s %s", ns, name, phase), func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		if p.Status.Phase == phase {
			return true, nil
		}
		if (p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded) && phase != p.Status.Phase {
			final = fmt.Errorf("pod %s/%s ended %s, not %s", ns, name, p.Status.Phase, phase)
			return true, nil
		}
		return false, fmt.Errorf("phase %s", p.Status.Phase)
	})
	if final != nil {
		t.Fatal(final)
	}
	return pod
}

// PodReady reports the pod's Ready condition.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// PodLogs returns the container's log (container "" = the only container).
func (c *Cluster) PodLogs(t testing.TB, ns, pod, container string) string {
	t.Helper()
	raw, err := c.podLogs(t.Context(), ns, pod, container)
	if err != nil {
		t.Fatalf("logs of %s/%s: %v", ns, pod, err)
	}
	return raw
}

// podLogs gives a read 30 s: the API server's call to the kubelet of a lost node can hang for minutes.
func (c *Cluster) podLogs(ctx context.Context, ns, pod, container string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	raw, err := c.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	return string(raw), err
}

// WaitForLog waits until the container's log contains substr and returns the whole log.
func (c *Cluster) WaitForLog(t testing.TB, ns, pod, container, substr string, timeout time.Duration) string {
	t.Helper()
	var log string
	c.WaitFor(t, timeout, fmt.Sprintf("%q in the log of %s/%s", substr, ns, pod), func(ctx context.Context) (bool, error) {
		l, err := c.podLogs(ctx, ns, pod, container)
		if err != nil {
			return false, err
		}
		log = l
		if !strings.Contains(l, substr) {
			return false, fmt.Errorf("not yet; log so far: %q", tail(l, 300))
		}
		return true, nil
	})
	return log
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// RdzvServer is the pod that serves job's rendezvous now: the holder of the Lease <job>-rdzv (internal/servinglease),
// which points the rendezvous Service at it.
func (c *Cluster) RdzvServer(ctx context.Context, ns, job string) (*corev1.Pod, error) {
	l, err := c.Client.CoordinationV1().Leases(ns).Get(ctx, naming.RendezvousService(job), metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return nil, fmt.Errorf("lease %s has no holder: nothing serves the rendezvous", l.Name)
	}
	return c.Client.CoreV1().Pods(ns).Get(ctx, *l.Spec.HolderIdentity, metav1.GetOptions{})
}

// RdzvView is GET /rendezvous of the pod that serves job's rendezvous, through the API server's pod proxy, as
// `kubectl get --raw .../pods/<holder>:2381/proxy/rendezvous` reads it (the chart's NOTES).
func (c *Cluster) RdzvView(ctx context.Context, ns, job string) ([]byte, error) {
	p, err := c.RdzvServer(ctx, ns, job)
	if err != nil {
		return nil, err
	}
	return c.Client.CoreV1().Pods(ns).ProxyGet("http", p.Name, strconv.Itoa(constants.SidecarHealthPort), "/rendezvous", nil).DoRaw(ctx)
}

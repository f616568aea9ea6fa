package framework

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// How the e2e tests see training progress: the trainers of examples/scripts log `step=N world_size=W` at every
// step (examples/scripts/elastic_train.py), and a job trains at a world size when every live pod's last step says so.

// LivePods are the selected pods that run and are not being deleted (a Pending replacement of a preempted pod
// does not train), by group and completion index.
func (c *Cluster) LivePods(ctx context.Context, ns, selector string) ([]corev1.Pod, error) {
	l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		gi, gj := out[i].Labels[constants.LabelGroup], out[j].Labels[constants.LabelGroup]
		return gi < gj || gi == gj && PodIndex(out[i]) < PodIndex(out[j])
	})
	return out, nil
}

// PodIndex is a pod's completion index (0 for a pod that has none).
func PodIndex(p corev1.Pod) int {
	i, _ := strconv.Atoi(p.Annotations["batch.kubernetes.io/job-completion-index"])
	return i
}

// TailLogs reads the last lines of a container's log. A pod on a lost node is still listed, and the API server's
// call to that node's kubelet can hang for minutes: a read gets 15 s.
func (c *Cluster) TailLogs(ctx context.Context, ns, pod, container string, lines int64) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	b, err := c.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container, TailLines: &lines}).DoRaw(ctx)
	return string(b), err
}

// StepLine is a trainer's log line of one step.
var StepLine = regexp.MustCompile(`step=(\d+) world_size=(\d+)`)

// LastStep returns the last training step a pod logged and the world size it ran at (-1 when none yet).
func LastStep(logs string) (step, world int) {
	m := StepLine.FindAllStringSubmatch(logs, -1)
	if len(m) == 0 {
		return -1, -1
	}
	step, _ = strconv.Atoi(m[len(m)-1][1])
	world, _ = strconv.Atoi(m[len(m)-1][2])
	return step, world
}

// WaitWorld waits until exactly n selected pods are live and every one of them (its container) last trained at
// world size n*slots, and returns how long that took.
func (c *Cluster) WaitWorld(t testing.TB, ns, selector, container string, n, slots int, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var last string
	c.WaitFor(t, timeout, fmt.Sprintf("%d pods (%s) training at world size %d", n, selector, n*slots), func(ctx context.Context) (bool, error) {
		pods, err := c.LivePods(ctx, ns, selector)
		if err != nil {
			return false, err
		}
		var states []string
		ok := len(pods) == n
		for _, p := range pods {
			if p.Annotations[constants.AnnotationMutated] == "" {
				// Without the webhook torchrun runs standalone and trains alone: say so now, not at the timeout.
				t.Fatalf("pod %s was created without the webhook's mutation (is the MutatingWebhookConfiguration installed?)", p.Name)
			}
			logs, err := c.TailLogs(ctx, ns, p.Name, container, 30)
			if err != nil {
				ok = false
				states = append(states, p.Name+": "+err.Error())
				continue
			}
			step, world := LastStep(logs)
			states = append(states, fmt.Sprintf("%s: step %d world %d", p.Name, step, world))
			ok = ok && world == n*slots
		}
		last = strings.Join(states, "; ")
		if ok {
			return true, nil
		}
		return false, fmt.Errorf("%d live pods: %s", len(pods), last)
	})
	t.Logf("%d pods at world size %d after %.1fs (%s)", n, n*slots, time.Since(start).Seconds(), last)
	return time.Since(start)
}

package framework

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

// LabelE2E marks every namespace the framework creates.
const LabelE2E = "elastic-training.io/e2e"

var nonDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// ours holds the namespaces this test binary created and has not deleted yet: SweepOrphans leaves them alone.
var ours sync.Map

// Namespace creates a namespace of its own for the test and deletes it when the test ends. When the test
// failed, it first logs the namespace's events, pod states and container logs. Set E2E_KEEP_NAMESPACES=1
// to keep namespaces for debugging; the next e2e run deletes them (SweepOrphans) before its tests start.
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	name := strings.Trim(nonDNS.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(name) > 40 {
		name = strings.TrimRight(name[:40], "-")
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return c.namespace(t, "e2e-"+name+"-"+hex.EncodeToString(b), false)
}

// NamespaceNamed is Namespace for a namespace whose name the test chooses (one that a setting names, such as a
// namespace the webhook excludes); one left by an earlier run is reused.
func (c *Cluster) NamespaceNamed(t testing.TB, name string) string {
	t.Helper()
	return c.namespace(t, name, true)
}

func (c *Cluster) namespace(t testing.TB, name string, reuse bool) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelE2E: "true"}}}
	if _, err := c.Client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil && !(reuse && apierrors.IsAlreadyExists(err)) {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	ours.Store(name, true)
	// Pods need the default ServiceAccount, which the controller-manager creates a moment later.
	c.WaitFor(t, time.Minute, "default ServiceAccount in "+name, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
	t.Cleanup(func() {
		defer ours.Delete(name)
		// t.Context() is already cancelled during cleanup.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if t.Failed() {
			t.Logf("namespace %s after the failure:\n%s", name, c.DumpNamespace(ctx, name))
		}
		if os.Getenv("E2E_KEEP_NAMESPACES") != "" {
			t.Logf("keeping namespace %s (E2E_KEEP_NAMESPACES)", name)
			return
		}
		if !c.Running() {
			return // a test stopped the cluster; nothing left to delete
		}
		if err := c.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete namespace %s: %v", name, err)
		}
	})
	return name
}

// SweepOrphans deletes the e2e namespaces that no running test owns and waits until they are gone. They are
// what a test binary left when it was killed (a timeout, ^C, a machine restart) or E2E_KEEP_NAMESPACES kept:
// their pods would still hold the node's fake GPUs and CPU, and a later MPI job would wait for GPUs forever.
// Main calls it under the e2e lock, so no other test binary can own one. It returns the names it deleted.
func (c *Cluster) SweepOrphans(ctx context.Context, timeout time.Duration) ([]string, error) {
	sel := metav1.ListOptions{LabelSelector: LabelE2E + "=true"}
	list, err := c.Client.CoreV1().Namespaces().List(ctx, sel)
	if err != nil {
		return nil, fmt.Errorf("list e2e namespaces: %w", err)
	}
	var orphans []string
	for _, ns := range list.Items {
		if _, owned := ours.Load(ns.Name); owned {
			continue
		}
		orphans = append(orphans, ns.Name)
		if ns.DeletionTimestamp != nil {
			continue
		}
		if err := c.Client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return orphans, fmt.Errorf("delete namespace %s: %w", ns.Name, err)
		}
	}
	if len(orphans) == 0 {
		return nil, nil
	}
	err = testenv.Poll(ctx, timeout, PollInterval, func(ctx context.Context) (bool, error) {
		var left []string
		for _, name := range orphans {
			_, err := c.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return false, err
			default:
				left = append(left, name)
			}
		}
		if len(left) > 0 {
			return false, fmt.Errorf("still terminating: %s", strings.Join(left, ", "))
		}
		return true, nil
	})
	if err != nil {
		return orphans, fmt.Errorf("namespaces left by an earlier run: %w", err)
	}
	return orphans, nil
}

// DumpNamespace returns the namespace's events (oldest first), pod states and the last 50 log lines of
// every container, for failure reports.
func (c *Cluster) DumpNamespace(ctx context.Context, ns string) string {
	var b strings.Builder
	evs, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(&b, "list events: %v\n", err)
	} else {
		items := evs.Items
		sort.Slice(items, func(i, j int) bool { return eventTime(items[i]).Before(eventTime(items[j])) })
		b.WriteString("--- events\n")
		for _, e := range items {
			fmt.Fprintf(&b, "%s %s %s/%s %s: %s\n", eventTime(e).Format("15:04:05"), e.Type,
				e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, strings.TrimSpace(e.Message))
		}
	}
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(&b, "list pods: %v\n", err)
		return b.String()
	}
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "--- pod %s phase=%s node=%s ip=%s\n", p.Name, p.Status.Phase, p.Spec.NodeName, p.Status.PodIP)
		restarted := map[string]bool{}
		for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
			fmt.Fprintf(&b, "  container %s ready=%v restarts=%d state=%s\n", cs.Name, cs.Ready, cs.RestartCount, stateString(cs.State))
			restarted[cs.Name] = cs.RestartCount > 0
		}
		var containers []string
		for _, ct := range p.Spec.InitContainers {
			containers = append(containers, ct.Name)
		}
		for _, ct := range p.Spec.Containers {
			containers = append(containers, ct.Name)
		}
		tail := int64(50)
		for _, ct := range containers {
			// A restarted container's last run is usually what failed.
			for _, previous := range []bool{true, false} {
				if previous && !restarted[ct] {
					continue
				}
				opts := &corev1.PodLogOptions{Container: ct, TailLines: &tail, Previous: previous}
				name := ct
				if previous {
					name += " (previous run)"
				}
				raw, err := c.Client.CoreV1().Pods(ns).GetLogs(p.Name, opts).DoRaw(ctx)
				if err != nil {
					fmt.Fprintf(&b, "  logs %s: %v\n", name, err)
					continue
				}
				fmt.Fprintf(&b, "  logs %s:\n%s\n", name, indent(string(raw), "    "))
			}
		}
	}
	return b.String()
}

func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

func stateString(s corev1.ContainerState) string {
	switch {
	case s.Running != nil:
		return "running"
	case s.Waiting != nil:
		return "waiting: " + s.Waiting.Reason + " " + s.Waiting.Message
	case s.Terminated != nil:
		return fmt.Sprintf("terminated: %s exit=%d %s", s.Terminated.Reason, s.Terminated.ExitCode, s.Terminated.Message)
	}
	return "unknown"
}

func indent(s, prefix string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return prefix + "(empty)"
	}
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

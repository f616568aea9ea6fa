package workloads

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// noWebhookNamespace is in the webhook's excludeNamespaces (installWebhook): the API server never calls the webhook
// for pods there, as if it were not installed.
const noWebhookNamespace = "e2e-no-webhook"

// TestWithoutWebhookPodsStayGated: a job whose pods the webhook never sees must not train alone as one-node jobs.
// The chart's scheduling gate, which only the webhook removes, keeps every pod SchedulingGated: nothing starts,
// and `kubectl get pods` says why. The same job in a namespace the webhook serves runs (every other test).
func TestWithoutWebhookPodsStayGated(t *testing.T) {
	t.Parallel() // no figure to keep honest: see main_test.go
	c := framework.Get(t)
	installWebhook(t, c)
	ctx := t.Context()
	ns := c.NamespaceNamed(t, noWebhookNamespace)
	const job = "gated"
	v := jobValues(t, c, pytorchValues, trainScript)
	useTrainer(v, framework.TrainerImages[0])
	installJob(t, c, ns, job, v)
	sel := groupSelector(job, constants.GroupWorker)

	var pods []corev1.Pod
	var err error
	c.WaitFor(t, 2*time.Minute, "2 worker pods, SchedulingGated", func(ctx context.Context) (bool, error) {
		pods, err = allPods(ctx, c, ns, sel)
		if err != nil || len(pods) < 2 {
			return false, err
		}
		for _, p := range pods {
			if !gated(p) {
				return false, fmt.Errorf("pod %s: phase %s, conditions %v", p.Name, p.Status.Phase, p.Status.Conditions)
			}
		}
		return true, nil
	})
	// The scheduler has seen them (it wrote the SchedulingGated condition) and held them: no waiting for a
	// placement that would have happened by now.
	pods, err = allPods(ctx, c, ns, sel)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 2 {
		t.Fatalf("%d worker pods, want 2", len(pods))
	}
	for _, p := range pods {
		if !gated(p) || p.Spec.NodeName != "" || p.Annotations[constants.AnnotationMutated] != "" {
			t.Errorf("pod %s: gated %v, node %q, mutated %q; want gated, unscheduled, unmutated", p.Name, gated(p), p.Spec.NodeName, p.Annotations[constants.AnnotationMutated])
		}
	}
	out, err := c.Kubectl(ctx, "-n", ns, "get", "pods", "-l", sel)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "SchedulingGated") {
		t.Errorf("kubectl get pods does not say SchedulingGated:\n%s", out)
	}
	t.Logf("without the webhook:\n%s", out)
}

// allPods lists the pods of selector in ns, whatever their phase (livePods counts running ones).
func allPods(ctx context.Context, c *framework.Cluster, ns, selector string) ([]corev1.Pod, error) {
	l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// gated: the pod still has the chart's gate and the scheduler says so.
func gated(p corev1.Pod) bool {
	if !slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == constants.SchedulingGate }) {
		return false
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonSchedulingGated {
			return true
		}
	}
	return false
}

// TestWebhookEventsOnTheJob: what the webhook decides about a Job's pods shows in `kubectl describe job`: a
// denial (here a misspelt annotation of ours) as a PodDenied Warning Event on the Job, not only as the Job
// controller's FailedCreate, and a warning (which the Job controller drops) as an AdmissionWarning Event.
func TestWebhookEventsOnTheJob(t *testing.T) {
	t.Parallel() // no figure to keep honest: see main_test.go
	c, ns := startTest(t)
	job := func(name string, edit func(*corev1.PodTemplateSpec)) {
		one := int32(1)
		indexed := batchv1.IndexedCompletion
		tpl := corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{
				Labels:      map[string]string{constants.LabelJob: name, constants.LabelRole: constants.RoleWorker, constants.LabelGroup: constants.GroupWorker},
				Annotations: map[string]string{constants.AnnotationFramework: constants.FrameworkCustom},
			},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Subdomain: name,
				SchedulingGates: []corev1.PodSchedulingGate{{Name: constants.SchedulingGate}},
				Containers:      []corev1.Container{{Name: trainer, Image: framework.BusyboxImage, ImagePullPolicy: corev1.PullNever, Command: []string{"true"}}}},
		}
		edit(&tpl)
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: batchv1.JobSpec{Parallelism: &one, Completions: &one, CompletionMode: &indexed, Template: tpl}}
		if _, err := c.Client.BatchV1().Jobs(ns).Create(t.Context(), j, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	job("typo", func(p *corev1.PodTemplateSpec) { p.Annotations[constants.Domain+"/max-node"] = "3" })
	job("warned", func(p *corev1.PodTemplateSpec) { p.Spec.Subdomain = "elsewhere" })
	for _, want := range []struct{ job, reason, msg string }{
		{"typo", "PodDenied", "annotation elastic-training.io/max-node=\"3\" is invalid"},
		{"warned", "AdmissionWarning", `spec.subdomain "elsewhere" is kept`},
	} {
		c.WaitFor(t, 2*time.Minute, fmt.Sprintf("a %s Event on Job %s", want.reason, want.job), func(ctx context.Context) (bool, error) {
			out, err := c.Kubectl(ctx, "-n", ns, "describe", "job", want.job)
			if err != nil {
				return false, err
			}
			if !strings.Contains(out, want.reason) || !strings.Contains(out, want.msg) {
				return false, fmt.Errorf("kubectl describe job %s:\n%s", want.job, out)
			}
			t.Logf("kubectl describe job %s shows:\n%s", want.job, eventsSection(out))
			return true, nil
		})
	}
}

// eventsSection is the Events part of kubectl describe's output.
func eventsSection(out string) string {
	if i := strings.Index(out, "Events:"); i >= 0 {
		return out[i:]
	}
	return out
}

// TestRestrictedPodSecurity: a namespace that enforces the restricted Pod Security level runs an elastic PyTorch job
// to Complete. Everything we render or inject (the sidecar, the scheduling-gated worker pods' other settings) passes
// as it is; the trainer is the user's and needs what the values below give it: a non-root user, no privilege
// escalation, no capabilities, the RuntimeDefault seccomp profile (the chart's podSecurityContext and
// securityContext values).
func TestRestrictedPodSecurity(t *testing.T) {
	t.Parallel() // no figure to keep honest: see main_test.go
	c, ns := startTest(t)
	nsObj, err := c.Client.CoreV1().Namespaces().Get(t.Context(), ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nsObj.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	nsObj.Labels["pod-security.kubernetes.io/enforce-version"] = "latest"
	if _, err := c.Client.CoreV1().Namespaces().Update(t.Context(), nsObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The level is enforced: a pod that runs as root is refused.
	root := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "as-root"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "c", Image: framework.BusyboxImage}}}}
	if _, err := c.Client.CoreV1().Pods(ns).Create(t.Context(), root, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil ||
		!strings.Contains(err.Error(), "violates PodSecurity") {
		t.Fatalf("a root pod in %s: want a PodSecurity refusal, got %v", ns, err)
	}
	const job = "restricted"
	v := jobValues(t, c, pytorchValues, trainScript)
	useTrainer(v, framework.TrainerImages[0])
	set(v, "args", []any{"--steps=20", "--step-seconds=0.2"})
	set(v, "podSecurityContext", map[string]any{"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
		"seccompProfile": map[string]any{"type": "RuntimeDefault"}})
	set(v, "securityContext", map[string]any{"allowPrivilegeEscalation": false, "capabilities": map[string]any{"drop": []any{"ALL"}}})
	installJob(t, c, ns, job, v)
	waitJobComplete(t, c, ns, naming.Workload(job, constants.GroupWorker), 5*time.Minute)
	out, err := c.Kubectl(t.Context(), "get", "ns", ns, "-o", "jsonpath={.metadata.labels}")
	if err != nil || !strings.Contains(out, `"pod-security.kubernetes.io/enforce":"restricted"`) {
		t.Fatalf("namespace %s labels %s (%v): not enforcing restricted", ns, out, err)
	}
}

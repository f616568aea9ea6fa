package framework

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// Where InstallWebhook installs the webhook chart: its namespace and release (its Deployment and its
// MutatingWebhookConfiguration have the release's name).
const (
	WebhookNamespace = "elastic-training-system"
	WebhookRelease   = "elastic-training-webhook"
)

// ImageValues are a chart's image values for a local image: repository and tag of ref, never pulled.
func ImageValues(ref string) map[string]any {
	repo, tag, _ := strings.Cut(ref, ":")
	return map[string]any{"repository": repo, "tag": tag, "pullPolicy": "Never"}
}

// InstallWebhook installs the webhook chart (charts/elastic-training-webhook) with the images just built, the
// namespaces in exclude in its webhook.excludeNamespaces (the API server never calls the webhook for pods there),
// and waits until the API server really mutates a training pod in probeNS. A webhook left installed by
// `make demo` or an earlier test is replaced, so the images just built are the ones tested. opts are added to
// the install's (Wait(3*time.Minute)): KeepAfterTest keeps the release after the test, else it is uninstalled
// when the test ends.
func (c *Cluster) InstallWebhook(t testing.TB, probeNS string, exclude []string, opts ...HelmOption) {
	t.Helper()
	excluded := make([]any, len(exclude))
	for i, ns := range exclude {
		excluded[i] = ns
	}
	c.InstallWebhookValues(t, probeNS, map[string]any{
		"image":   ImageValues(WebhookImage),
		"sidecar": map[string]any{"image": ImageValues(SidecarImage)},
		"webhook": map[string]any{"excludeNamespaces": excluded},
	}, opts...)
}

// InstallWebhookValues installs the webhook chart as InstallWebhook does, with the values given (as a user's
// `helm install --set ...` would: the images are the chart's unless values say otherwise).
func (c *Cluster) InstallWebhookValues(t testing.TB, probeNS string, values map[string]any, opts ...HelmOption) {
	t.Helper()
	ctx := t.Context()
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: WebhookNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", WebhookNamespace, err)
	}
	if _, err := c.Kubectl(ctx, "-n", WebhookNamespace, "get", "deployment", WebhookRelease); err == nil {
		c.HelmUninstall(t, WebhookNamespace, WebhookRelease, 2*time.Minute)
	}
	c.HelmInstall(t, WebhookNamespace, WebhookRelease, c.RepoPath("charts/elastic-training-webhook"), values,
		append([]HelmOption{Wait(3 * time.Minute)}, opts...)...)
	// Ready pods do not mean the API server can call them yet (kube-proxy lags): a server-side dry-run of a
	// training pod goes through admission exactly like a real create.
	desc := "the webhook to mutate a dry-run training pod"
	if probeNS != "default" {
		desc += " in " + probeNS
	}
	c.WaitFor(t, 2*time.Minute, desc, func(ctx context.Context) (bool, error) {
		ok, err := c.DryRunMutated(ctx, probeNS)
		if err == nil && !ok {
			err = errors.New("pod not mutated yet")
		}
		return ok, err
	})
}

// DryRunMutated creates a training pod in ns as a server-side dry-run (admission runs as for a real create,
// nothing is stored) and reports whether the webhook mutated it.
func (c *Cluster) DryRunMutated(ctx context.Context, ns string) (bool, error) {
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "webhook-probe", Labels: map[string]string{constants.LabelJob: "probe", constants.LabelRole: constants.RoleWorker, constants.LabelGroup: "worker"},
			Annotations: map[string]string{constants.AnnotationFramework: constants.FrameworkCustom, "batch.kubernetes.io/job-completion-index": "1"}},
		Spec: corev1.PodSpec{Hostname: "probe-worker-1", Subdomain: "probe", Containers: []corev1.Container{{Name: "trainer", Image: BusyboxImage}}},
	}
	got, err := c.Client.CoreV1().Pods(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return false, err
	}
	return got.Annotations[constants.AnnotationMutated] != "", nil
}

package webhook_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/mutate"
	"github.com/elastic-training/elastic-training/internal/podreplace"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
	"github.com/elastic-training/elastic-training/internal/webhook"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// TestPodReplacement runs the whole webhook as the chart deploys it (url mode: its --pod-replacement-url, its
// generated certificate and ca.crt, its ClusterRoles bound to the webhook's own ServiceAccount), registered with a
// real API server that mutates the pods of two real Indexed Jobs. The serving sidecar's part is played as the
// sidecar does it: podreplace.Client with the URL and CA the mutation gave the serving pod, and tokens the API
// server mints bound to a pod (TokenRequest), which the webhook has the API server review (TokenReview). Only the
// serving pod's token of the webhook's audience has a pod of its own job deleted, and the Job makes a new one.
func TestPodReplacement(t *testing.T) {
	ctx := t.Context()
	c := cp.Client
	ns := namespace(t, c, "replace")
	const webhookSA = "webhook" // the webhook's own account: the chart's rights, no more
	for _, sa := range []string{"a", "b", webhookSA} {
		_, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}

	port := testenv.FreePort(t)
	r, err := chartrender.RenderDir(chartrender.Dir("elastic-training-webhook"), map[string]any{
		"webhook": map[string]any{"url": fmt.Sprintf("https://127.0.0.1:%d%s", port, webhook.PathMutatePods), "timeoutSeconds": 10},
	}, chartrender.Options{Release: "elastic-training-webhook", Namespace: webhookNS})
	require.NoError(t, err)
	replaceURL := chartFlag(t, r, "--pod-replacement-url")
	require.Equal(t, fmt.Sprintf("https://127.0.0.1:%d%s", port, podreplace.Path), replaceURL, "the chart derives it from webhook.url")

	// The chart's ClusterRoles, bound to the webhook's account in this test's namespace.
	for _, role := range []string{"elastic-training-webhook-pod-replacement", "elastic-training-webhook-events"} {
		cr := &rbacv1.ClusterRole{}
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(r.Find("ClusterRole", role).Object, cr))
		cr.Name = ns + "-" + role
		_, err := c.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: cr.Name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: cr.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: webhookSA, Namespace: ns}}}, metav1.CreateOptions{})
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = c.RbacV1().ClusterRoleBindings().Delete(context.Background(), cr.Name, metav1.DeleteOptions{})
			_ = c.RbacV1().ClusterRoles().Delete(context.Background(), cr.Name, metav1.DeleteOptions{})
		})
	}
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, webhookSA, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	require.NoError(t, err)
	asWebhook := rest.AnonymousClientConfig(cp.REST)
	asWebhook.BearerToken = tr.Status.Token
	wc, err := kubernetes.NewForConfig(asWebhook)
	require.NoError(t, err)

	// The webhook, as cmd/webhook wires it with --pod-replacement-url and --events.
	certDir := t.TempDir()
	for k, v := range r.Find("Secret", "elastic-training-webhook-tls").Object["data"].(map[string]any) {
		b, err := base64.StdEncoding.DecodeString(v.(string))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(certDir, k), b, 0o600))
	}
	events := record.NewBroadcaster()
	defer events.Shutdown()
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: wc.CoreV1().Events("")})
	recorder := events.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "elastic-training-webhook"})
	reg := prometheus.NewRegistry()
	replacer, err := podreplace.NewServer(podreplace.NewAPI(wc), logr.Discard(), reg, recorder)
	require.NoError(t, err)
	cfg := mutate.DefaultConfig()
	cfg.SidecarImage = framework.SidecarImage
	cfg.WebhookNamespace = webhookNS
	cfg.PodReplacement.URL = replaceURL
	wctx, stop := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- webhook.Run(wctx, webhook.Options{Host: "127.0.0.1", Port: port, CertDir: certDir,
			HealthAddr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), Config: cfg, Log: logr.Discard(), Ready: ready,
			Events: recorder, Metrics: reg, Replace: replacer})
	}()
	defer func() { stop(); <-done }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("webhook: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("webhook not ready")
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(r.Find("MutatingWebhookConfiguration", "").Object, mwc))
	_ = c.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, mwc.Name, metav1.DeleteOptions{})
	_, err = c.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, mwc, metav1.CreateOptions{})
	require.NoError(t, err)
	// The webhook stops with this test: no later pod of a job may wait for it.
	t.Cleanup(func() {
		_ = c.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), mwc.Name, metav1.DeleteOptions{})
	})

	// Two jobs as the job chart renders a PyTorch worker group on the elastic-training backend: index 0 serves.
	job := func(name string, n int32) {
		t.Helper()
		meta := trainingMeta(name, "worker", "workers", map[string]string{constants.AnnotationRdzvBackend: constants.BackendElasticTraining})
		_, err := c.BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name + "-workers"}, Spec: batchv1.JobSpec{
			CompletionMode: ptr.To(batchv1.IndexedCompletion), Completions: ptr.To(n), Parallelism: ptr.To(n),
			Template: corev1.PodTemplateSpec{ObjectMeta: meta, Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever, Subdomain: name, ServiceAccountName: name,
				Containers: []corev1.Container{trainer("")},
			}},
		}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	job("a", 2)
	job("b", 1)
	index := func(job, idx string) corev1.Pod {
		t.Helper()
		pods := waitPods(t, c, ns, constants.LabelJob+"="+job+",batch.kubernetes.io/job-completion-index="+idx, 1)
		require.Len(t, pods, 1)
		return pods[0]
	}
	servingA, workerA, servingB := index("a", "0"), index("a", "1"), index("b", "0")

	// What the mutation gave each pod: the serving sidecars the URL, the CA and a token for the webhook; a worker none.
	sc := sidecarOf(&servingA)
	require.NotNil(t, sc, "job a's pods not mutated")
	require.Equal(t, "serve", sc.Args[0])
	require.Contains(t, sc.Args, "--replace-url="+replaceURL)
	ca := envOf(sc, constants.EnvWebhookCA)
	caFile, err := os.ReadFile(filepath.Join(certDir, constants.TLSCAName))
	require.NoError(t, err)
	require.Equal(t, string(caFile), ca, "the CA of the webhook's certificate directory")
	require.True(t, hasWebhookToken(&servingA) && hasWebhookToken(&servingB))
	require.False(t, hasWebhookToken(&workerA), "a worker gets no token for the webhook")
	require.NotContains(t, strings.Join(sidecarOf(&workerA).Args, " "), "--replace-url")

	// A token bound to pod p, for audiences (none: the API server's own).
	token := func(p corev1.Pod, audiences ...string) string {
		t.Helper()
		tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, p.Spec.ServiceAccountName, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			Audiences: audiences, ExpirationSeconds: ptr.To[int64](600),
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}}}, metav1.CreateOptions{})
		require.NoError(t, err)
		return tr.Status.Token
	}
	// Asks as the serving sidecar does: the token in a file as the kubelet writes it, the URL and CA as given.
	ask := func(tok, pod string) (podreplace.Response, error) {
		t.Helper()
		f := filepath.Join(t.TempDir(), podreplace.TokenPath)
		require.NoError(t, os.WriteFile(f, []byte(tok), 0o600))
		cli, err := podreplace.NewClient(replaceURL, []byte(ca), f)
		require.NoError(t, err)
		return cli.Replace(ctx, podreplace.Request{Pod: pod, Reason: "2 hangs blamed on it"})
	}
	exists := func(p corev1.Pod) bool {
		t.Helper()
		got, err := c.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false
		}
		require.NoError(t, err)
		return got.UID == p.UID && got.DeletionTimestamp == nil
	}

	t.Run("a token of the API server's audience is refused", func(t *testing.T) {
		_, err := ask(token(servingA), workerA.Name)
		require.ErrorContains(t, err, "401 Unauthorized")
		require.ErrorContains(t, err, "unauthenticated")
	})
	t.Run("a worker's token, even of the webhook's audience, is refused", func(t *testing.T) {
		_, err := ask(token(workerA, podreplace.Audience), servingA.Name)
		require.ErrorContains(t, err, "403 Forbidden")
		require.ErrorContains(t, err, "is not a serving pod")
	})
	t.Run("a serving pod cannot have another job's pod deleted", func(t *testing.T) {
		_, err := ask(token(servingA, podreplace.Audience), servingB.Name)
		require.ErrorContains(t, err, "403 Forbidden")
		require.ErrorContains(t, err, `pod replace/`+servingB.Name+` is not of job a`)
		_, err = ask(token(servingB, podreplace.Audience), workerA.Name)
		require.ErrorContains(t, err, "is not of job b")
	})
	require.True(t, exists(workerA) && exists(servingB) && exists(servingA), "nothing deleted so far")

	t.Run("the serving pod has its job's pod replaced", func(t *testing.T) {
		resp, err := ask(token(servingA, podreplace.Audience), workerA.Name)
		require.NoError(t, err)
		assert.Equal(t, workerA.Name, resp.Pod)
		require.False(t, exists(workerA), "the pod is neither gone nor being deleted")
		// Its Job makes a new pod of its index.
		require.NoError(t, testenv.Poll(ctx, 60*time.Second, 200*time.Millisecond, func(ctx context.Context) (bool, error) {
			l, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: constants.LabelJob + "=a,batch.kubernetes.io/job-completion-index=1"})
			if err != nil {
				return false, nil
			}
			for _, p := range l.Items {
				if p.UID != workerA.UID && p.DeletionTimestamp == nil {
					return true, nil
				}
			}
			return false, nil
		}), "no new pod of index 1")
		// The Event on the pod's Job says what was deleted, on which node, for whom and why.
		var got []string
		require.NoError(t, testenv.Poll(ctx, 30*time.Second, 200*time.Millisecond, func(ctx context.Context) (bool, error) {
			l, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Job,involvedObject.name=a-workers,reason=" + podreplace.ReasonReplaced})
			if err != nil {
				return false, nil
			}
			got = got[:0]
			for _, e := range l.Items {
				got = append(got, e.Type+" "+e.Message)
			}
			return len(got) > 0, nil
		}), "no %s Event on Job a-workers", podreplace.ReasonReplaced)
		assert.Equal(t, []string{"Warning Deleted pod " + workerA.Name + " on node (none yet), asked by the job's serving pod " + servingA.Name + ": 2 hangs blamed on it"}, got)
	})
	t.Run("a second replacement of the job within the window is refused", func(t *testing.T) {
		next := index("a", "1")
		_, err := ask(token(servingA, podreplace.Audience), next.Name)
		require.ErrorContains(t, err, "429 Too Many Requests")
		require.ErrorContains(t, err, "ask again in")
		require.True(t, exists(next))
	})
	t.Run("the token of a pod on its way out is refused", func(t *testing.T) {
		tok := token(servingB, podreplace.Audience)
		target := index("a", "1")
		require.NoError(t, c.CoreV1().Pods(ns).Delete(ctx, servingB.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
		// While the Job controller holds it (its finalizer) the API server still authenticates the token: the
		// webhook refuses a deleted asker. Once it is gone, the API server may go on authenticating the token for
		// a while (its view of bound pods lags): the webhook refuses an asker that does not exist.
		_, err := ask(tok, target.Name)
		require.Error(t, err)
		if !strings.Contains(err.Error(), "401 Unauthorized") && !strings.Contains(err.Error(), "does not exist") {
			require.ErrorContains(t, err, "asking pod replace/"+servingB.Name+" is being deleted")
		}
		require.NoError(t, testenv.Poll(ctx, 60*time.Second, 200*time.Millisecond, func(ctx context.Context) (bool, error) {
			_, err := c.CoreV1().Pods(ns).Get(ctx, servingB.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		}), "pod %s not gone", servingB.Name)
		_, err = ask(tok, target.Name)
		require.Error(t, err)
		if !strings.Contains(err.Error(), "401 Unauthorized") {
			require.ErrorContains(t, err, "403 Forbidden")
			require.ErrorContains(t, err, "asking pod replace/"+servingB.Name+" (uid "+string(servingB.UID)+") does not exist")
		}
		require.True(t, exists(target))
	})

	assert.Equal(t, 1.0, replacements(t, reg, "replaced"))
	assert.Equal(t, 7.0, replacements(t, reg, "refused"))
	assert.Equal(t, 0.0, replacements(t, reg, "failed"), "the chart's rights were enough for every call")
}

// chartFlag is the value of the webhook container's --name=value in the rendered Deployment.
func chartFlag(t *testing.T, r *chartrender.Rendered, name string) string {
	t.Helper()
	obj := r.Find("Deployment", "elastic-training-webhook")
	require.NotNil(t, obj)
	containers, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
	for _, c := range containers {
		args, _ := c.(map[string]any)["args"].([]any)
		for _, a := range args {
			if v, ok := strings.CutPrefix(fmt.Sprint(a), name+"="); ok {
				return v
			}
		}
	}
	t.Fatalf("the chart's Deployment has no %s", name)
	return ""
}

// hasWebhookToken says whether the mutation projected a token of the webhook's audience into the pod.
func hasWebhookToken(p *corev1.Pod) bool {
	for _, v := range p.Spec.Volumes {
		if v.Name == constants.TokenVolumeName && v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.ServiceAccountToken != nil && s.ServiceAccountToken.Audience == podreplace.Audience {
					return true
				}
			}
		}
	}
	return false
}

// replacements is the webhook's counter of replacement requests with result, as its /metrics serves it.
func replacements(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "elastic_training_webhook_pod_replacements_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no elastic_training_webhook_pod_replacements_total{result=%q}", result)
	return 0
}

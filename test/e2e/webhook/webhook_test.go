// Package webhook_test proves the admission webhook against a real
// kube-apiserver: the MutatingWebhookConfiguration rendered from
// charts/elastic-training-webhook (url mode, pointing at this test's webhook
// server) makes the API server mutate pods created directly and by the real
// Job and StatefulSet controllers.
package webhook_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/mutate"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
	"github.com/elastic-training/elastic-training/internal/webhook"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

const webhookNS = "elastic-training-system"

var cp *controlPlane

func TestMain(m *testing.M) {
	var err error
	start := time.Now()
	cp, err = startControlPlane()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: control plane:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "control plane ready in %s\n", time.Since(start).Round(time.Millisecond))
	code := m.Run()
	cp.stop()
	os.Exit(code)
}

// warnings collects the API server's warning headers (admission warnings).
type warnings struct {
	mu  sync.Mutex
	all []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.all = append(w.all, text)
}

type server struct {
	cancel context.CancelFunc
	done   chan error
}

// startWebhook renders the chart in url mode for a free port, writes the
// chart's generated serving certificate where the webhook reads it, starts the
// webhook and registers the chart's MutatingWebhookConfiguration.
func startWebhook(t *testing.T) *server {
	port := testenv.FreePort(t)
	r, err := chartrender.RenderDir(chartrender.Dir("elastic-training-webhook"), map[string]any{
		"webhook": map[string]any{"url": fmt.Sprintf("https://127.0.0.1:%d%s", port, webhook.PathMutatePods), "timeoutSeconds": 10},
	}, chartrender.Options{Release: "elastic-training-webhook", Namespace: webhookNS})
	require.NoError(t, err)
	secret := r.Find("Secret", "elastic-training-webhook-tls")
	require.NotNil(t, secret)
	certDir := t.TempDir()
	for k, v := range secret.Object["data"].(map[string]any) {
		b, err := base64.StdEncoding.DecodeString(v.(string))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(certDir, k), b, 0o600))
	}
	hport := testenv.FreePort(t)
	cfg := mutate.DefaultConfig()
	cfg.SidecarImage = framework.SidecarImage
	cfg.WebhookNamespace = webhookNS
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	s := &server{cancel: cancel, done: make(chan error, 1)}
	go func() {
		s.done <- webhook.Run(ctx, webhook.Options{Host: "127.0.0.1", Port: port, CertDir: certDir,
			HealthAddr: fmt.Sprintf("127.0.0.1:%d", hport), Config: cfg, Log: logr.Discard(), Ready: ready})
	}()
	select {
	case <-ready:
	case err := <-s.done:
		t.Fatalf("webhook: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("webhook not ready")
	}

	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(r.Find("MutatingWebhookConfiguration", "").Object, mwc))
	ctx2 := context.Background()
	_ = cp.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx2, mwc.Name, metav1.DeleteOptions{})
	_, err = cp.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx2, mwc, metav1.CreateOptions{})
	require.NoError(t, err)
	return s
}

func (s *server) stop() { s.cancel(); <-s.done }

func namespace(t *testing.T, c kubernetes.Interface, name string) string {
	ctx := context.Background()
	_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// Pods need the default ServiceAccount, which the controller manager creates.
	require.NoError(t, testenv.Poll(ctx, 60*time.Second, 200*time.Millisecond, func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}), "no default ServiceAccount in %s", name)
	return name
}

func trainingMeta(job, role, group string, ann map[string]string) metav1.ObjectMeta {
	a := map[string]string{
		constants.AnnotationFramework: constants.FrameworkPyTorch,
		constants.AnnotationMinNodes:  "1", constants.AnnotationMaxNodes: "4",
		constants.AnnotationRunID: job + "-abc12", constants.AnnotationRdzvHost: "true",
	}
	for k, v := range ann {
		a[k] = v
	}
	return metav1.ObjectMeta{
		Labels:      map[string]string{constants.LabelJob: job, constants.LabelRole: role, constants.LabelGroup: group},
		Annotations: a,
	}
}

func trainer(gpus string) corev1.Container {
	c := corev1.Container{Name: "trainer", Image: "local/trainer:dev", Command: []string{"torchrun", "train.py"}}
	if gpus != "" {
		c.Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resourceMust(gpus)}
	}
	return c
}

func sidecarOf(p *corev1.Pod) *corev1.Container {
	for i, c := range p.Spec.InitContainers {
		if c.Name == constants.SidecarContainerName {
			return &p.Spec.InitContainers[i]
		}
	}
	return nil
}

func envOf(c *corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func waitPods(t *testing.T, c kubernetes.Interface, ns, selector string, n int) []corev1.Pod {
	var pods []corev1.Pod
	err := testenv.Poll(context.Background(), 60*time.Second, 200*time.Millisecond, func(ctx context.Context) (bool, error) {
		l, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, nil
		}
		pods = l.Items
		return len(pods) >= n, nil
	})
	require.NoError(t, err, "want %d pods %s in %s, have %d", n, selector, ns, len(pods))
	return pods
}

func TestWebhookAgainstRealAPIServer(t *testing.T) {
	ctx := context.Background()
	w := &warnings{}
	cfg := rest.CopyConfig(cp.REST)
	cfg.WarningHandler = w
	c, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)

	srv := startWebhook(t)
	ns := namespace(t, c, "team-a")
	namespace(t, c, webhookNS)

	t.Run("pod created directly is mutated, with a warning for a contradicting user value", func(t *testing.T) {
		meta := trainingMeta("direct", "worker", "workers", nil)
		meta.Name = "direct-workers-0"
		meta.Labels["apps.kubernetes.io/pod-index"] = "0"
		tr := trainer("4")
		tr.Env = []corev1.EnvVar{{Name: "PET_MAX_RESTARTS", Value: "7"}}
		created, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{Containers: []corev1.Container{tr}}}, metav1.CreateOptions{})
		require.NoError(t, err)
		sc := sidecarOf(created)
		require.NotNil(t, sc, "no rdzv-sidecar")
		assert.Equal(t, "serve", sc.Args[0])
		assert.Equal(t, corev1.ContainerRestartPolicyAlways, *sc.RestartPolicy)
		assert.Contains(t, sc.Args, "--lease=direct-rdzv", "the serving pod serves while it holds the rendezvous Lease")
		assert.Equal(t, "direct", created.Spec.Subdomain)
		assert.Equal(t, "4", envOf(&created.Spec.Containers[0], "PET_NPROC_PER_NODE"))
		assert.Equal(t, "7", envOf(&created.Spec.Containers[0], "PET_MAX_RESTARTS"), "the user's value wins")
		assert.Equal(t, "direct-rdzv.team-a.svc.cluster.local:2379", envOf(&created.Spec.Containers[0], "PET_RDZV_ENDPOINT"))
		assert.Contains(t, strings.Join(w.all, "\n"), `env PET_MAX_RESTARTS="7" set in container "trainer" is kept`)
	})

	t.Run("malformed setting is denied with a readable message", func(t *testing.T) {
		meta := trainingMeta("bad", "worker", "workers", map[string]string{constants.AnnotationMinNodes: "many"})
		meta.Name = "bad-workers-0"
		meta.Labels["apps.kubernetes.io/pod-index"] = "0"
		_, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{Containers: []corev1.Container{trainer("")}}}, metav1.CreateOptions{})
		require.Error(t, err)
		assert.Contains(t, err.Error(), `denied the request: elastic-training: annotation elastic-training.io/min-nodes="many" is invalid`)
	})

	t.Run("indexed Job pods are mutated by index", func(t *testing.T) {
		meta := trainingMeta("bert", "worker", "workers", nil)
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "bert-workers"},
			Spec: batchv1.JobSpec{
				CompletionMode: ptr.To(batchv1.IndexedCompletion),
				Completions:    ptr.To[int32](3), Parallelism: ptr.To[int32](3),
				Template: corev1.PodTemplateSpec{ObjectMeta: meta, Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever, Subdomain: "bert",
					Containers: []corev1.Container{trainer("2")},
				}},
			},
		}
		_, err := c.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{})
		require.NoError(t, err)
		pods := waitPods(t, c, ns, constants.LabelJob+"=bert", 3)
		serving := 0
		for _, p := range pods {
			idx := p.Annotations["batch.kubernetes.io/job-completion-index"]
			sc := sidecarOf(&p)
			require.NotNil(t, sc, "pod %s not mutated", p.Name)
			host := fmt.Sprintf("bert-workers-%s.bert.team-a.svc.cluster.local", idx)
			assert.Contains(t, sc.Args, "--member-host="+host)
			assert.Contains(t, sc.Args, "--member-index="+idx)
			assert.Equal(t, "2", envOf(&p.Spec.Containers[0], "PET_NPROC_PER_NODE"))
			assert.Equal(t, host, envOf(&p.Spec.Containers[0], "PET_LOCAL_ADDR"))
			if idx == "0" {
				serving++
				assert.Equal(t, "serve", sc.Args[0])
				assert.Contains(t, sc.Args, "--lease=bert-rdzv")
			} else {
				assert.Equal(t, "join", sc.Args[0])
			}
		}
		assert.Equal(t, 1, serving)

		// Elastic scale-up (what `helm upgrade --set workers.replicas=4` does): the new pod joins.
		patch := []byte(`{"spec":{"completions":4,"parallelism":4}}`)
		_, err = c.BatchV1().Jobs(ns).Patch(ctx, "bert-workers", types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		require.NoError(t, err)
		pods = waitPods(t, c, ns, constants.LabelJob+"=bert,batch.kubernetes.io/job-completion-index=3", 1)
		sc := sidecarOf(&pods[0])
		require.NotNil(t, sc)
		assert.Equal(t, "join", sc.Args[0])
		assert.Contains(t, sc.Args, "--member-index=3")
	})

	t.Run("StatefulSet pods are mutated (MPI workers join)", func(t *testing.T) {
		meta := trainingMeta("hvd", "worker", "workers", map[string]string{
			constants.AnnotationFramework: constants.FrameworkMPI, constants.AnnotationRdzvHost: "false",
			constants.AnnotationMPIFlavour: constants.FlavourMPICH,
		})
		meta.Labels["app"] = "hvd-workers"
		sts := &appsv1.StatefulSet{
			ObjectMeta: metav1.ObjectMeta{Name: "hvd-workers"},
			Spec: appsv1.StatefulSetSpec{
				Replicas: ptr.To[int32](2), ServiceName: "hvd", PodManagementPolicy: appsv1.ParallelPodManagement,
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "hvd-workers"}},
				Template: corev1.PodTemplateSpec{ObjectMeta: meta, Spec: corev1.PodSpec{Containers: []corev1.Container{trainer("8")}}},
			},
		}
		_, err := c.AppsV1().StatefulSets(ns).Create(ctx, sts, metav1.CreateOptions{})
		require.NoError(t, err)
		pods := waitPods(t, c, ns, constants.LabelJob+"=hvd", 2)
		for _, p := range pods {
			sc := sidecarOf(&p)
			require.NotNil(t, sc, "pod %s not mutated", p.Name)
			assert.Equal(t, "join", sc.Args[0])
			assert.Contains(t, sc.Args, "--hostfile-flavour=mpich")
			assert.Contains(t, sc.Args, "--member-slots=8")
			assert.Contains(t, sc.Args, "--member-host="+p.Name+".hvd.team-a.svc.cluster.local")
		}
	})

	t.Run("pods in the webhook's namespace are not sent to it", func(t *testing.T) {
		meta := trainingMeta("own", "worker", "workers", nil)
		meta.Name = "own-0"
		created, err := c.CoreV1().Pods(webhookNS).Create(ctx, &corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{Containers: []corev1.Container{trainer("")}}}, metav1.CreateOptions{})
		require.NoError(t, err)
		assert.Nil(t, sidecarOf(created))
	})

	// From here on the webhook is down.
	srv.stop()

	t.Run("while the webhook is down, a pod without the job label is created unchanged", func(t *testing.T) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain", Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx"}}}}
		start := time.Now()
		created, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		require.NoError(t, err)
		assert.Less(t, time.Since(start), 5*time.Second, "the API server must not even call the webhook")
		assert.Empty(t, created.Spec.InitContainers)
		assert.Equal(t, pod.Spec.Containers[0].Env, created.Spec.Containers[0].Env)
		assert.NotContains(t, created.Annotations, constants.AnnotationMutated)
	})

	t.Run("while the webhook is down, a training pod is refused (failurePolicy Fail)", func(t *testing.T) {
		meta := trainingMeta("late", "worker", "workers", nil)
		meta.Name = "late-workers-0"
		meta.Labels["apps.kubernetes.io/pod-index"] = "0"
		_, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{Containers: []corev1.Container{trainer("")}}}, metav1.CreateOptions{})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "pods.elastic-training.io")
	})
}

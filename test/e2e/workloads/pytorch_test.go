package workloads

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/internal/torchview"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

const (
	pytorchValues = "examples/local/pytorch-elastic.yaml"
	trainScript   = "examples/scripts/elastic_train.py"
	jobChart      = "charts/elastic-training"
)

// TestElasticPyTorch is the TorchElastic ElasticJob case: 2 workers (min 1, max 4) train, `helm upgrade` takes
// them to 3, then 4, then back to 2, every live worker trains at each new world size, the Job ends Complete,
// and `helm uninstall` leaves nothing behind. Every torch of the trainer images (2.14 and 2.6), every rendezvous
// backend the chart offers; and the chart's default backend in an image without python-etcd, as stock torch
// images are.
func TestElasticPyTorch(t *testing.T) {
	for _, img := range framework.TrainerImages {
		for _, backend := range []string{"etcd-v2", "etcd", "c10d"} {
			t.Run("torch-"+img.Torch+"/"+backend, func(t *testing.T) {
				testElasticPyTorch(t, img, backend)
			})
		}
	}
	t.Run("no-python-etcd/chart-defaults", func(t *testing.T) {
		testElasticPyTorch(t, framework.StockTrainer, "")
	})
}

func testElasticPyTorch(t *testing.T, img framework.Trainer, backend string) {
	c := framework.Get(t)
	installWebhook(t, c)
	ns := c.Namespace(t)
	const job = "elastic"
	v := jobValues(t, c, pytorchValues, trainScript)
	useTrainer(v, img)
	if backend != "" { // "": the chart's default
		set(v, "rendezvous.backend", backend)
	}
	set(v, "args", []any{"--steps=120", "--step-seconds=0.5"})
	set(v, "tests.stableFor", "10s") // the default 30s, ×7 jobs, adds minutes and proves nothing more
	set(v, "tests.minMembers", 2)

	start := time.Now()
	c.HelmInstall(t, ns, job, c.RepoPath(jobChart), v)
	waitWorld(t, c, ns, groupSelector(job, "worker"), 2, 1, 3*time.Minute)
	t.Logf("helm install -> first training step at world 2: %.1fs", time.Since(start).Seconds())
	logTorch(t, c, ns, job, img)
	// The chart's test hook: a torch round of both agents, alive, that holds (TestHelmTestFailsOnCrashLoop: and
	// not on a crash-looping job).
	start = time.Now()
	c.HelmTest(t, ns, job, 2*time.Minute)
	t.Logf("helm test passed: %.1fs", time.Since(start).Seconds())
	// The job's view of the rendezvous, as `kubectl get --raw .../services/<job>-rdzv:health/proxy/rendezvous`
	// shows it through the API server.
	raw, err := c.Client.CoreV1().Services(ns).ProxyGet("http", job+"-rdzv", "health", "/rendezvous", nil).DoRaw(t.Context())
	if err != nil {
		t.Fatalf("GET /rendezvous through the API server's service proxy: %v", err)
	}
	var view torchview.View
	if err := json.Unmarshal(raw, &view); err != nil || view.WorldSize != 2 || !view.Complete {
		t.Fatalf("the rendezvous view says %s (%v), want a complete round of 2", raw, err)
	}
	t.Logf("kubectl get --raw .../%s-rdzv:health/proxy/rendezvous: %s", job, raw)
	// And as Events on the Job: the serving sidecar records each round there (rendezvous.events).
	workerJob := naming.Workload(job, "worker")
	c.WaitFor(t, time.Minute, "a RendezvousRound Event of world size 2 on Job "+workerJob, func(ctx context.Context) (bool, error) {
		out, err := c.Kubectl(ctx, "-n", ns, "describe", "job", workerJob)
		if err != nil {
			return false, err
		}
		if !strings.Contains(out, "RendezvousRound") || !strings.Contains(out, ": world size 2") {
			return false, fmt.Errorf("kubectl describe job %s:\n%s", workerJob, eventsSection(out))
		}
		t.Logf("kubectl describe job %s shows:\n%s", workerJob, eventsSection(out))
		return true, nil
	})

	for _, n := range []int{3, 4, 2} {
		c.HelmUpgrade(t, ns, job, c.RepoPath(jobChart), map[string]any{"workers": map[string]any{"replicas": n}}, framework.ReuseValues())
		d := waitWorld(t, c, ns, groupSelector(job, "worker"), n, 1, 2*time.Minute)
		t.Logf("helm upgrade --set workers.replicas=%d -> every worker at world %d: %.1fs", n, n, d.Seconds())
	}

	waitJobComplete(t, c, ns, naming.Workload(job, "worker"), 5*time.Minute)
	// Survivors of the last scale-down finished the run at world size 2.
	pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: "elastic-training.io/job=" + job})
	if err != nil {
		t.Fatal(err)
	}
	done := 0
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded {
			continue
		}
		logs := c.PodLogs(t, ns, p.Name, trainer)
		if strings.Contains(logs, "done steps=120 world_size=2") {
			done++
		}
	}
	if done != 2 {
		t.Errorf("%d succeeded pods logged the end of training at world size 2, want 2", done)
	}

	c.HelmUninstall(t, ns, job, 2*time.Minute)
	waitEmpty(t, c, ns)
}

// useTrainer makes the job run in a trainer image.
func useTrainer(v map[string]any, img framework.Trainer) {
	repo, tag, _ := strings.Cut(img.Image, ":")
	set(v, "image.repository", repo)
	set(v, "image.tag", tag)
}

// logTorch checks that every live worker runs the image's torch (examples/scripts/elastic_train.py prints it
// when it joins) and logs it.
func logTorch(t *testing.T, c *framework.Cluster, ns, job string, img framework.Trainer) {
	t.Helper()
	pods, err := livePods(t.Context(), c, ns, groupSelector(job, "worker"))
	if err != nil || len(pods) == 0 {
		t.Fatalf("list the workers: %d pods, %v", len(pods), err)
	}
	var seen string
	for _, p := range pods {
		logs := c.PodLogs(t, ns, p.Name, trainer)
		m := regexp.MustCompile(`torch=(\S+)`).FindStringSubmatch(logs)
		if m == nil || strings.Split(m[1], "+")[0] != img.Torch {
			t.Fatalf("%s (%s) does not log torch=%s when it joins:\n%s", p.Name, img.Image, img.Torch, logs)
		}
		seen = m[1]
	}
	t.Logf("torch %s (%s)", seen, img.Image)
}

func waitJobComplete(t testing.TB, c *framework.Cluster, ns, name string, timeout time.Duration) {
	t.Helper()
	c.WaitFor(t, timeout, "Job "+name+" Complete", func(ctx context.Context) (bool, error) {
		j, err := c.Client.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range j.Status.Conditions {
			if cond.Status != corev1.ConditionTrue {
				continue
			}
			switch cond.Type {
			case batchv1.JobComplete:
				return true, nil
			case batchv1.JobFailed:
				return false, fmt.Errorf("job failed: %s: %s", cond.Reason, cond.Message)
			}
		}
		return false, fmt.Errorf("active %d succeeded %d failed %d", j.Status.Active, j.Status.Succeeded, j.Status.Failed)
	})
}

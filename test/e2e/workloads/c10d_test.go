package workloads

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// TestC10dOutlivesWorkerZero is the fault that ends a c10d job where torch's TCPStore lives in worker 0's agent
// (Kubeflow's PyTorchJob, torchrun's docs; pytorch#147064): worker 0's pod is deleted. Here the workers are
// preemptible, so the chart gives the rendezvous a dedicated pod whose sidecar serves the store: the survivors
// re-form, the replacement joins, nothing trained is lost, and the Job completes. Then the rendezvous pod itself is
// deleted, and the job recovers from that too.
func TestC10dOutlivesWorkerZero(t *testing.T) {
	c := framework.Get(t)
	installWebhook(t, c)
	ns := c.Namespace(t)
	const job = "c10d"
	v := jobValues(t, c, pytorchValues, trainScript)
	useTrainer(v, framework.TrainerImages[0])
	set(v, "rendezvous.backend", constants.BackendC10d)
	sharedDir(t, v, ns)
	set(v, "args", []any{"--steps=240", "--step-seconds=0.5", "--checkpoint-dir=/data/checkpoints"})
	set(v, "workers", map[string]any{"replicas": 3, "minReplicas": 1, "maxReplicas": 4, "preemptible": true})
	c.HelmInstall(t, ns, job, c.RepoPath(jobChart), v)
	sel := groupSelector(job, constants.GroupWorker)
	waitWorld(t, c, ns, sel, 3, 1, 3*time.Minute)

	pods, err := livePods(t.Context(), c, ns, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if podIndex(p) != 0 {
			continue
		}
		if p.Labels[constants.LabelRdzvServer] == "true" {
			t.Fatalf("worker 0 (%s) serves the rendezvous; the dedicated pod should", p.Name)
		}
		before, start := snapshot(t, c, ns, sel), time.Now()
		if err := c.Client.CoreV1().Pods(ns).Delete(t.Context(), p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Logf("c10d: recovered from deleting worker 0 (%s) in %.1fs", p.Name, waitRecovered(t, c, ns, sel, 3, before, start).Seconds())
	}
	rdzvPod := naming.Workload(job, constants.GroupRdzv) + "-0"
	if rdzv := c.PodLogs(t, ns, rdzvPod, constants.SidecarContainerName); !strings.Contains(rdzv, "backend=c10d") {
		t.Errorf("no c10d round in the rendezvous pod's log:\n%s", rdzv)
	}
	// The dedicated pod records the rounds on the workers' Job too (its token, the Role bound to `default`).
	out, err := c.Kubectl(t.Context(), "-n", ns, "describe", "job", naming.Workload(job, constants.GroupWorker))
	if err != nil || !strings.Contains(out, "RendezvousRound") || !strings.Contains(out, "world size 3") {
		t.Errorf("no RendezvousRound Event of world size 3 on the workers' Job (%v):\n%s", err, eventsSection(out))
	}

	// The store itself restarts (its keys are in memory): the agents lose the rendezvous, their pods are replaced
	// (preemptible groups restart nothing in place) and train on from the shared checkpoints.
	before, start := snapshot(t, c, ns, sel), time.Now()
	if err := c.Client.CoreV1().Pods(ns).Delete(t.Context(), rdzvPod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("c10d: recovered from deleting the rendezvous pod %s in %.1fs", rdzvPod, waitRecovered(t, c, ns, sel, 3, before, start).Seconds())
	waitJobComplete(t, c, ns, naming.Workload(job, constants.GroupWorker), 5*time.Minute)
	c.HelmUninstall(t, ns, job, 2*time.Minute)
	waitEmpty(t, c, ns)
}

package workloads

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

var joinedLine = regexp.MustCompile(`joined rank=\d+ world_size=(\d+) restart=\d+ host=\S+ resume_step=(\d+)`)

// progress is what the test knows of one worker's training before a fault. restarts counts the trainer
// container's restarts in place (restartPolicy OnFailure), after which its log starts again from nothing.
type progress struct{ joins, step, restarts int }

func trainerRestarts(p corev1.Pod) int {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == trainer {
			return int(cs.RestartCount)
		}
	}
	return 0
}

func snapshot(t testing.TB, c *framework.Cluster, ns, selector string) map[string]progress {
	t.Helper()
	pods, err := c.LivePods(t.Context(), ns, selector)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]progress{}
	for _, p := range pods {
		logs := c.PodLogs(t, ns, p.Name, trainer)
		step, _ := framework.LastStep(logs)
		out[p.Name] = progress{joins: len(joinedLine.FindAllString(logs, -1)), step: step, restarts: trainerRestarts(p)}
	}
	return out
}

// waitRecovered waits until n workers train at world size n again after a fault, every one of them having
// re-joined a rendezvous since, and checks that no training progress was lost: the step the job resumed from is
// at least the furthest step any worker had reached before the fault.
func waitRecovered(t *testing.T, c *framework.Cluster, ns, selector string, n int, before map[string]progress, start time.Time) time.Duration {
	t.Helper()
	furthest := 0
	for _, p := range before {
		furthest = max(furthest, p.step)
	}
	c.WaitFor(t, 4*time.Minute, fmt.Sprintf("%d workers re-joined and training at world size %d", n, n), func(ctx context.Context) (bool, error) {
		pods, err := c.LivePods(ctx, ns, selector)
		if err != nil || len(pods) != n {
			return false, fmt.Errorf("%d live pods (err %v)", len(pods), err)
		}
		for _, p := range pods {
			logs, err := c.Client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: trainer}).DoRaw(ctx)
			if err != nil {
				return false, err
			}
			joins := joinedLine.FindAllStringSubmatch(string(logs), -1)
			// A replacement pod (a new name) starts from 0 joins, and so does a trainer restarted in place.
			already := before[p.Name].joins
			if trainerRestarts(p) > before[p.Name].restarts {
				already = 0
			}
			if len(joins) <= already {
				return false, fmt.Errorf("%s has not re-joined yet", p.Name)
			}
			if _, world := framework.LastStep(string(logs)); world != n {
				return false, fmt.Errorf("%s last trained at world %d", p.Name, world)
			}
			if resume, _ := strconv.Atoi(joins[len(joins)-1][2]); resume < furthest {
				t.Errorf("%s resumed from step %d, but step %d had been reached before the fault: progress lost", p.Name, resume, furthest)
			}
		}
		return true, nil
	})
	return time.Since(start)
}

// TestFaults breaks a running elastic PyTorch job in the ways clusters do and checks that it recovers with
// nothing lost. Checkpoints are on a shared directory (hostPath here, a PVC on a real cluster), since a
// replaced pod starts with an empty filesystem.
func TestFaults(t *testing.T) {
	c, ns := startTest(t)
	const job = "faulty"
	v := jobValues(t, c, pytorchValues, trainScript)
	sharedDir(t, v, ns)
	set(v, "args", []any{"--steps=5000", "--step-seconds=0.5", "--checkpoint-dir=/data/checkpoints"})
	set(v, "workers", map[string]any{"replicas": 3, "minReplicas": 1, "maxReplicas": 4})
	// A pod blamed for one hang is replaced (the default waits for two): the frozen pod below goes, its Job makes
	// a new one.
	set(v, "hang", map[string]any{"replaceAfter": 1})
	// Settings from a ConfigMap, as users keep them: none of torchrun's, so the kubelet leaves the webhook's envFrom
	// probes unexpanded and the workers start warm (mutate.EnvFromProbes; the expanded case: TestWarmStart).
	settings := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: job + "-settings"}, Data: map[string]string{"TRAIN_NOTE": "from a ConfigMap"}}
	if _, err := c.Client.CoreV1().ConfigMaps(ns).Create(t.Context(), settings, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	set(v, "envFrom", []any{map[string]any{"configMapRef": map[string]any{"name": settings.Name}}})
	sel := installTraining(t, c, ns, job, v, 3)
	// Let every worker write a checkpoint before breaking things.
	c.WaitFor(t, time.Minute, "a few training steps", func(ctx context.Context) (bool, error) {
		for _, p := range snapshot(t, c, ns, sel) {
			if p.step < 3 {
				return false, nil
			}
		}
		return true, nil
	})
	podOf := func(index int) corev1.Pod {
		t.Helper()
		pods, err := c.LivePods(t.Context(), ns, sel)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods {
			if framework.PodIndex(p) == index {
				return p
			}
		}
		t.Fatalf("no live worker with index %d", index)
		return corev1.Pod{}
	}

	t.Run("kill -9 of a training process", func(t *testing.T) {
		before, p := snapshot(t, c, ns, sel), podOf(1)
		ps, err := c.Kubectl(t.Context(), "-n", ns, "exec", p.Name, "-c", trainer, "--", "ps", "-eo", "pid=,ppid=,args=")
		if err != nil {
			t.Fatalf("ps: %v: %s", err, ps)
		}
		if !strings.Contains(string(ps), "multiprocessing.forkserver") {
			t.Errorf("%s's workers started cold beside an envFrom that sets none of torchrun's choices:\n%s", p.Name, ps)
		}
		start := time.Now()
		signalWorkers(t, c, ns, p.Name, "KILL")
		t.Logf("recovered from kill -9 of the trainer in %s in %.1fs", p.Name, waitRecovered(t, c, ns, sel, 3, before, start).Seconds())
	})

	// A hang as users meet it: a training process that stops without exiting (SIGSTOP: alive, its pod's lease
	// renewed), and every other rank blocked in its next all_reduce, which gloo would end after 30 minutes. The
	// script says its progress every step (elastic_training.progress); the serving sidecar finds no rank advancing
	// for the chart's default timeout (60 s at these 0.5 s steps), restarts the round and records why on the Job.
	t.Run("a frozen training process (SIGSTOP)", func(t *testing.T) {
		before, p := snapshot(t, c, ns, sel), podOf(1)
		start := time.Now()
		signalWorkers(t, c, ns, p.Name, "STOP")
		workerJob := naming.Workload(job, constants.GroupWorker)
		event := func(reason string, ok func(string) bool) {
			t.Helper()
			c.WaitFor(t, 3*time.Minute, "a "+reason+" Event on Job "+workerJob, func(ctx context.Context) (bool, error) {
				evs, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + reason + ",involvedObject.name=" + workerJob})
				if err != nil || len(evs.Items) == 0 {
					return false, err
				}
				if m := evs.Items[0].Message; !ok(m) {
					return false, fmt.Errorf("the Event says %q", m)
				}
				t.Logf("Event %s after %.1fs: %s", reason, time.Since(start).Seconds(), evs.Items[0].Message)
				return true, nil
			})
		}
		// The frozen pod is named: as frozen (its heartbeat stopped while the others' went on), or, frozen before
		// its first step of the round (the kill -9 above just restarted it), as the rank that said nothing in it;
		// not as the others, which wait for it in their next all_reduce.
		event("TrainingHung", func(m string) bool {
			return strings.Contains(m, "hung: no rank advanced") && strings.Contains(m, "Stopped first: rank") &&
				strings.Contains(m, "("+job+"-worker-1.") && (strings.Contains(m, ", frozen (silent ") || strings.Contains(m, ", no step said in this round"))
		})
		// The hang was blamed on it (hang.replaceAfter 1): the serving pod had the webhook delete it, as no Role of
		// the job could, and the Job makes a new pod of its index, which joins the others.
		event("PodReplaced", func(m string) bool {
			return strings.Contains(m, "Deleted pod "+p.Name) && strings.Contains(m, "a hang blamed on it")
		})
		c.WaitFor(t, 2*time.Minute, "a new pod of worker 1", func(ctx context.Context) (bool, error) {
			pods, err := c.LivePods(ctx, ns, sel)
			for _, q := range pods {
				if framework.PodIndex(q) == 1 && q.UID != p.UID {
					t.Logf("worker 1 replaced: %s on %s -> %s on %s", p.Name, p.Spec.NodeName, q.Name, q.Spec.NodeName)
					return true, nil
				}
			}
			return false, err
		})
		t.Logf("recovered from a frozen trainer in %s, replaced, in %.1fs (hang timeout 60 s)", p.Name, waitRecovered(t, c, ns, sel, 3, before, start).Seconds())
	})

	t.Run("delete a worker pod", func(t *testing.T) {
		before, p := snapshot(t, c, ns, sel), podOf(2)
		start := time.Now()
		if err := c.Client.CoreV1().Pods(ns).Delete(t.Context(), p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Logf("recovered from deleting %s in %.1fs", p.Name, waitRecovered(t, c, ns, sel, 3, before, start).Seconds())
	})

	t.Run("delete the pod that serves the rendezvous", func(t *testing.T) {
		before, p := snapshot(t, c, ns, sel), podOf(0)
		if s, err := c.RdzvServer(t.Context(), ns, job); err != nil || s.Name != p.Name {
			t.Fatalf("worker 0 (%s) does not hold the rendezvous lease: %v %v", p.Name, s, err)
		}
		start := time.Now()
		if err := c.Client.CoreV1().Pods(ns).Delete(t.Context(), p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Logf("recovered from deleting the rendezvous pod %s in %.1fs", p.Name, waitRecovered(t, c, ns, sel, 3, before, start).Seconds())
	})

	t.Run("webhook stopped", func(t *testing.T) {
		scaleWebhook(t, c, 0)
		stopped := true
		t.Cleanup(func() {
			if stopped {
				scaleWebhook(t, c, 2)
			}
		})
		// A new pod of the job is refused, with an event that says why...
		c.HelmUpgrade(t, ns, job, c.RepoPath(jobChart), map[string]any{"workers": map[string]any{"replicas": 4}}, framework.ReuseValues())
		var msg string
		c.WaitFor(t, 2*time.Minute, "a FailedCreate event on the Job naming the webhook", func(ctx context.Context) (bool, error) {
			evs, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=FailedCreate,involvedObject.name=" + naming.Workload(job, constants.GroupWorker)})
			if err != nil {
				return false, err
			}
			for _, e := range evs.Items {
				if strings.Contains(e.Message, "elastic-training") && strings.Contains(e.Message, "webhook") {
					msg = e.Message
					return true, nil
				}
			}
			return false, fmt.Errorf("%d FailedCreate events, none naming the webhook", len(evs.Items))
		})
		t.Logf("job pod refused while the webhook is down: %s", msg)
		// ...while a pod of any other workload is created as usual,
		other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "unrelated"}, Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers:                    []corev1.Container{{Name: "c", Image: framework.BusyboxImage, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "600"}}}}}
		if _, err := c.Client.CoreV1().Pods(ns).Create(t.Context(), other, metav1.CreateOptions{}); err != nil {
			t.Fatalf("a pod without the job label was refused while the webhook is down: %v", err)
		}
		// ...and the job keeps training at its size.
		c.WaitWorld(t, ns, sel, trainer, 3, 1, time.Minute)
		before := snapshot(t, c, ns, sel)
		start := time.Now()
		scaleWebhook(t, c, 2)
		stopped = false
		t.Logf("webhook back: job scaled to 4 after %.1fs", waitRecovered(t, c, ns, sel, 4, before, start).Seconds())
	})

	c.HelmUninstall(t, ns, job, 2*time.Minute)
}

func scaleWebhook(t *testing.T, c *framework.Cluster, n int) {
	t.Helper()
	if out, err := c.Kubectl(context.Background(), "-n", framework.WebhookNamespace, "scale", "deployment/"+framework.WebhookRelease, fmt.Sprintf("--replicas=%d", n)); err != nil {
		t.Fatalf("scale webhook to %d: %v: %s", n, err, out)
	}
	c.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d webhook pods", n), func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(framework.WebhookNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		ready := 0
		for i := range pods.Items {
			if pods.Items[i].DeletionTimestamp == nil && framework.PodReady(&pods.Items[i]) {
				ready++
			}
		}
		if ready != n || len(pods.Items) != n {
			return false, fmt.Errorf("%d pods, %d ready", len(pods.Items), ready)
		}
		return true, nil
	})
}

// TestC10dOutlivesWorkerZero is the fault that ends a c10d job where torch's TCPStore lives in worker 0's agent
// (Kubeflow's PyTorchJob, torchrun's docs; pytorch#147064): worker 0's pod is deleted. Here the workers are
// preemptible, so the chart gives the rendezvous a dedicated pod whose sidecar serves the store: the survivors
// re-form, the replacement joins, nothing trained is lost, and the Job completes. Then the rendezvous pod itself is
// deleted, and the job recovers from that too. Its outcome does not depend on timing (the recovery times it logs
// are taken beside the package's parallel tests), so it runs with them: see main_test.go.
func TestC10dOutlivesWorkerZero(t *testing.T) {
	t.Parallel()
	c, ns := startTest(t)
	const job = "c10d"
	v := jobValues(t, c, pytorchValues, trainScript)
	useTrainer(v, framework.TrainerImages[0])
	set(v, "rendezvous.backend", constants.BackendC10d)
	sharedDir(t, v, ns)
	// Enough steps that the job is still training after its second recovery on a busy machine.
	set(v, "args", []any{"--steps=160", "--step-seconds=0.5", "--checkpoint-dir=/data/checkpoints"})
	set(v, "workers", map[string]any{"replicas": 3, "minReplicas": 1, "maxReplicas": 4, "preemptible": true})
	sel := installTraining(t, c, ns, job, v, 3)

	pods, err := c.LivePods(t.Context(), ns, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if framework.PodIndex(p) != 0 {
			continue
		}
		if s, err := c.RdzvServer(t.Context(), ns, job); err != nil || s.Name == p.Name {
			t.Fatalf("worker 0 (%s) serves the rendezvous; the dedicated pod should (%v)", p.Name, err)
		}
		before, start := snapshot(t, c, ns, sel), time.Now()
		if err := c.Client.CoreV1().Pods(ns).Delete(t.Context(), p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Logf("c10d: recovered from deleting worker 0 (%s) in %.1fs", p.Name, waitRecovered(t, c, ns, sel, 3, before, start).Seconds())
	}
	rdzvPod := c.WaitPodsReady(t, ns, groupSelector(job, constants.GroupRdzv), 1, time.Minute)[0].Name
	if rdzv := c.PodLogs(t, ns, rdzvPod, constants.SidecarContainerName); !strings.Contains(rdzv, "backend=c10d") {
		t.Errorf("no c10d round in the rendezvous pod's log:\n%s", rdzv)
	}
	// The dedicated pod records the rounds on the workers' Job too (its token, the Role bound to `default`).
	out, err := c.Kubectl(t.Context(), "-n", ns, "describe", "job", naming.Workload(job, constants.GroupWorker))
	if err != nil || !strings.Contains(out, "RendezvousRound") || !strings.Contains(out, ": 3 nodes") {
		t.Errorf("no RendezvousRound Event of 3 nodes on the workers' Job (%v):\n%s", err, eventsSection(out))
	}

	// The store itself restarts (its keys are in memory): the agents lose the rendezvous, their pods are replaced
	// (preemptible groups restart nothing in place) and train on from the shared checkpoints.
	before, start := snapshot(t, c, ns, sel), time.Now()
	if err := c.Client.CoreV1().Pods(ns).Delete(t.Context(), rdzvPod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("c10d: recovered from deleting the rendezvous pod %s in %.1fs", rdzvPod, waitRecovered(t, c, ns, sel, 3, before, start).Seconds())
	waitJobComplete(t, c, ns, naming.Workload(job, constants.GroupWorker), 5*time.Minute)
	uninstallJob(t, c, ns, job)
}

// signalWorkers sends sig to the training processes of pod's trainer, as a user with kubectl exec would.
func signalWorkers(t *testing.T, c *framework.Cluster, ns, pod, sig string) {
	t.Helper()
	ps, err := c.Kubectl(t.Context(), "-n", ns, "exec", pod, "-c", trainer, "--", "ps", "-eo", "pid=,ppid=,args=")
	if err != nil {
		t.Fatalf("ps: %v: %s", err, ps)
	}
	pids := workerPids(string(ps))
	if len(pids) == 0 {
		t.Fatalf("no training process in %s:\n%s", pod, ps)
	}
	if out, err := c.Kubectl(t.Context(), "-n", ns, "exec", pod, "-c", trainer, "--", "sh", "-c", "kill -"+sig+" "+strings.Join(pids, " ")); err != nil {
		t.Fatalf("kill -%s %v: %v: %s", sig, pids, err, out)
	}
}

// workerPids are the torchrun workers in ps's lines (pid, ppid, command line): the agent's children, each a
// `python3 -u <script>`, or with the warm start (docs/warm-start.md) the children of the agent's fork server,
// whose command line is the fork server's.
func workerPids(ps string) []string {
	type proc struct{ pid, ppid, args string }
	var procs []proc
	for _, line := range strings.Split(ps, "\n") {
		if f := strings.Fields(line); len(f) >= 3 {
			procs = append(procs, proc{f[0], f[1], strings.Join(f[2:], " ")})
		}
	}
	children := func(pid string) []proc {
		return slices.DeleteFunc(slices.Clone(procs), func(p proc) bool { return p.ppid != pid })
	}
	var pids []string
	for _, agent := range procs {
		if !strings.Contains(agent.args, "/torchrun ") {
			continue
		}
		for _, ch := range children(agent.pid) {
			if strings.Contains(ch.args, "multiprocessing.forkserver") {
				for _, w := range children(ch.pid) {
					pids = append(pids, w.pid)
				}
			} else if strings.Contains(ch.args, "python") {
				pids = append(pids, ch.pid)
			}
		}
	}
	return pids
}

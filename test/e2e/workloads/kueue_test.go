package workloads

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// kueueGate is the scheduling gate Kueue's Job webhook puts on an elastic Job's pods, lifted from the pods of
// an admitted slice.
const kueueGate = "kueue.x-k8s.io/elastic-job"

// TestKueue: PyTorch jobs queued by the real Kueue (v0.17.0, elastic Jobs on: framework.StartKueue) in a LocalQueue
// whose ClusterQueue has a quota of 6 (fake) GPUs, one per worker (workers.gpus: 1). The chart renders the queue
// label and, for a job whose replicas may change (minReplicas < maxReplicas), Kueue's elastic-Job annotation.
//   - A (elastic, 2 workers) is admitted and trains; B (2 workers, fixed) too: 4 of 6 GPUs.
//   - helm upgrade A to 3 workers: the quota admits it, A trains at 3 (5 of 6).
//   - C (2 workers) with 1 GPU free is admitted whole or not at all: its Job stays suspended with no pod, and its
//     Workload says the quota is short.
//   - helm upgrade A to 5 workers (2 more, 1 free): Kueue admits an increase whole or not at all (a new Workload
//     slice for all 5), so both new pods wait, gated, while A trains at 3.
//   - helm uninstall B frees 2 GPUs: A's slice is admitted, the gates are lifted, A trains at 5.
func TestKueue(t *testing.T) {
	t.Parallel() // no figure to keep honest: see main_test.go
	c, ns := startTest(t)
	c.StartKueue(t)
	c.LabelKueueNamespace(t, ns)
	cq := ns // ClusterQueues are cluster-wide: one of the test's own
	applyKueueObjects(t, c, ns, cq, 6)

	values := func(replicas, lo, hi int) map[string]any {
		v := jobValues(t, c, pytorchValues, trainScript)
		set(v, "queue.kueue", "lq")
		set(v, "workers.gpus", 1)
		set(v, "workers.replicas", replicas)
		set(v, "workers.minReplicas", lo)
		set(v, "workers.maxReplicas", hi)
		set(v, "args", []any{"--steps=100000", "--step-seconds=0.5"})
		return v
	}
	a := installTraining(t, c, ns, "a", values(2, 1, 5), 2)
	if !workloadAdmitted(t, c, ns, "a-worker") {
		t.Fatalf("job a trains but its Workload is not admitted: %s", workloadsState(t, c, ns))
	}
	installTraining(t, c, ns, "b", values(2, 2, 2), 2)

	scaleWorkers(t, c, ns, "a", 3)
	c.WaitWorld(t, ns, a, trainer, 3, 1, 3*time.Minute)

	installJob(t, c, ns, "c", values(2, 2, 2))
	c.WaitFor(t, 2*time.Minute, "job c's Workload pending on quota", func(ctx context.Context) (bool, error) {
		w, err := ownedWorkload(ctx, c, ns, "c-worker")
		if err != nil || w == nil {
			return false, err
		}
		q := w.condition("QuotaReserved")
		return q != nil && q.Status == "False" && strings.Contains(q.Message, "insufficient"), fmt.Errorf("%+v", w.Status.Conditions)
	})
	if pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: groupSelector("c", constants.GroupWorker)}); err != nil {
		t.Error(err)
	} else if len(pods.Items) != 0 {
		t.Errorf("job c, not admitted, has pods %v: want none (a job is admitted whole or not at all)", podNames(pods.Items))
	}
	if job, err := c.Client.BatchV1().Jobs(ns).Get(t.Context(), "c-worker", metav1.GetOptions{}); err != nil || job.Spec.Suspend == nil || !*job.Spec.Suspend {
		t.Errorf("job c-worker is not suspended while it waits for quota: %v", err)
	}
	c.HelmUninstall(t, ns, "c", 2*time.Minute)

	scaleWorkers(t, c, ns, "a", 5)
	c.WaitFor(t, 2*time.Minute, "job a's 2 new pods gated by Kueue", func(ctx context.Context) (bool, error) {
		gated, err := gatedPods(ctx, c, ns, a)
		if err != nil {
			return false, err
		}
		return len(gated) == 2, fmt.Errorf("gated: %v", gated)
	})
	c.WaitWorld(t, ns, a, trainer, 3, 1, time.Minute) // still trains at its admitted size
	t.Logf("a asks for 5 workers with 1 GPU free: 2 pods wait gated, 3 train (%s)", workloadsState(t, c, ns))

	freed := time.Now()
	c.HelmUninstall(t, ns, "b", 2*time.Minute)
	c.WaitWorld(t, ns, a, trainer, 5, 1, 3*time.Minute)
	t.Logf("b uninstalled: a's gated pods admitted and a trains at 5 after %.1fs", time.Since(freed).Seconds())
	if gated, err := gatedPods(t.Context(), c, ns, a); err != nil || len(gated) != 0 {
		t.Errorf("pods still gated after admission: %v, %v", gated, err)
	}
	uninstallJob(t, c, ns, "a")
}

// applyKueueObjects creates a ResourceFlavor, ClusterQueue cq (quota: gpus of the fake GPU resource, for ns only,
// BestEffortFIFO so that a job that does not fit does not hold back one that does) and LocalQueue lq in ns; they
// are deleted when the test ends, before Kueue stops.
func applyKueueObjects(t *testing.T, c *framework.Cluster, ns, cq string, gpus int) {
	t.Helper()
	manifest := fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: %[1]s}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: %[1]s}
spec:
  namespaceSelector:
    matchLabels: {kubernetes.io/metadata.name: %[2]s}
  queueingStrategy: BestEffortFIFO
  resourceGroups:
    - coveredResources: [%[3]s]
      flavors:
        - name: %[1]s
          resources:
            - {name: %[3]s, nominalQuota: %[4]d}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: lq, namespace: %[2]s}
spec: {clusterQueue: %[1]s}
`, cq, ns, framework.FakeGPUResource, gpus)
	file := filepath.Join(t.TempDir(), "queues.yaml")
	if err := os.WriteFile(file, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Kubectl(t.Context(), "apply", "-f", file); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = c.Kubectl(ctx, "delete", "-f", file, "--ignore-not-found", "--wait=false")
	})
}

// workload is what the test reads of a Kueue Workload.
type workload struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
	Status   struct {
		Conditions []metav1.Condition `json:"conditions"`
	} `json:"status"`
}

func (w *workload) condition(typ string) *metav1.Condition {
	for i := range w.Status.Conditions {
		if w.Status.Conditions[i].Type == typ {
			return &w.Status.Conditions[i]
		}
	}
	return nil
}

func workloads(ctx context.Context, c *framework.Cluster, ns string) ([]workload, error) {
	out, err := c.Kubectl(ctx, "-n", ns, "get", "workloads.kueue.x-k8s.io", "-o", "json")
	if err != nil {
		return nil, err
	}
	var l struct{ Items []workload }
	return l.Items, json.Unmarshal([]byte(out), &l)
}

// ownedWorkload is the newest Workload of Job job (an elastic Job has one per slice), or nil.
func ownedWorkload(ctx context.Context, c *framework.Cluster, ns, job string) (*workload, error) {
	all, err := workloads(ctx, c, ns)
	if err != nil {
		return nil, err
	}
	var newest *workload
	for i, w := range all {
		if slices.ContainsFunc(w.Metadata.OwnerReferences, func(o metav1.OwnerReference) bool { return o.Kind == "Job" && o.Name == job }) &&
			(newest == nil || w.Metadata.CreationTimestamp.After(newest.Metadata.CreationTimestamp.Time)) {
			newest = &all[i]
		}
	}
	return newest, nil
}

func workloadAdmitted(t *testing.T, c *framework.Cluster, ns, job string) bool {
	w, err := ownedWorkload(t.Context(), c, ns, job)
	if err != nil || w == nil {
		return false
	}
	a := w.condition("Admitted")
	return a != nil && a.Status == "True"
}

// workloadsState is each Workload's name and conditions, for the log.
func workloadsState(t *testing.T, c *framework.Cluster, ns string) string {
	all, err := workloads(t.Context(), c, ns)
	if err != nil {
		return err.Error()
	}
	var s []string
	for _, w := range all {
		var conds []string
		for _, cd := range w.Status.Conditions {
			conds = append(conds, cd.Type+"="+string(cd.Status))
		}
		s = append(s, w.Metadata.Name+" "+strings.Join(conds, ","))
	}
	return strings.Join(s, "; ")
}

// gatedPods are the pods of selector that Kueue's elastic-Job gate holds.
func gatedPods(ctx context.Context, c *framework.Cluster, ns, selector string) ([]string, error) {
	l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	var gated []string
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil && slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == kueueGate }) {
			gated = append(gated, p.Name)
		}
	}
	return gated, nil
}

func podNames(pods []corev1.Pod) []string {
	var n []string
	for _, p := range pods {
		n = append(n, p.Name)
	}
	return n
}

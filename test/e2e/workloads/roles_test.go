package workloads

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// priorityClass creates a cluster-wide PriorityClass for the test (they are not namespaced) and removes it after.
func priorityClass(t *testing.T, c *framework.Cluster, name string, value int32) {
	t.Helper()
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
	if _, err := c.Client.SchedulingV1().PriorityClasses().Create(t.Context(), pc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("priority class %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = c.Client.SchedulingV1().PriorityClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// TestRolesAndPriorities is the ElasticDL case: 2 core workers at high priority and 2 burst workers at low
// priority (preemptible, so the rendezvous moves to a dedicated high-priority pod) train in one world. A
// higher-priority pod that needs the node's (fake) GPUs makes the real kube-scheduler preempt the burst
// workers: the core workers keep training at world 2. When that pod goes, the burst workers' replacements are
// scheduled again and the job takes them back at world 4.
func TestRolesAndPriorities(t *testing.T) {
	c, ns := startTest(t)
	const job = "edl"
	priorityClass(t, c, "e2e-core", 100000)
	priorityClass(t, c, "e2e-hog", 50000)
	priorityClass(t, c, "e2e-burst", 1000)

	v := jobValues(t, c, pytorchValues, trainScript)
	set(v, "args", []any{"--steps=2000", "--step-seconds=0.5"})
	set(v, "workers", map[string]any{"replicas": 2, "minReplicas": 2, "maxReplicas": 2, "gpus": 1, "priorityClassName": "e2e-core"})
	set(v, "workerGroups", map[string]any{"burst": map[string]any{"replicas": 2, "minReplicas": 0, "maxReplicas": 2, "gpus": 1,
		"preemptible": true, "priorityClassName": "e2e-burst"}})
	set(v, "rendezvous.priorityClassName", "e2e-core")
	// One node's GPUs are what the hog below takes: on the other node it would find them free and preempt nothing.
	onNode := map[string]any{"kubernetes.io/hostname": framework.NodeName}
	set(v, "nodeSelector", onNode)
	set(v, "rendezvous.nodeSelector", onNode)
	installJob(t, c, ns, job, v)

	// The StatefulSet controller creates the pod a moment after the install returns.
	var rdzv *corev1.PodList
	c.WaitFor(t, time.Minute, "the rendezvous pod", func(ctx context.Context) (bool, error) {
		var err error
		rdzv, err = c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: groupSelector(job, constants.GroupRdzv)})
		return err == nil && len(rdzv.Items) > 0, err
	})
	if len(rdzv.Items) != 1 {
		t.Fatalf("want one dedicated rendezvous pod (burst workers are preemptible): %d pods", len(rdzv.Items))
	}
	c.WaitWorld(t, ns, workersSelector(job), trainer, 4, 1, 3*time.Minute)

	// All 8 fake GPUs are needed by a pod above the burst workers' priority and below the core's.
	free := framework.FakeGPUCount - 2
	hog := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-hog"},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": framework.NodeName},
			PriorityClassName:             "e2e-hog",
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "hog", Image: framework.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sleep", "3600"},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					corev1.ResourceName(framework.FakeGPUResource): resource.MustParse(fmt.Sprint(free))}}}},
		},
	}
	start := time.Now()
	if _, err := c.Client.CoreV1().Pods(ns).Create(t.Context(), hog, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.WaitPodPhase(t, ns, hog.Name, corev1.PodRunning, 2*time.Minute)
	t.Logf("burst workers preempted, gpu-hog running after %.1fs", time.Since(start).Seconds())
	d := c.WaitWorld(t, ns, workersSelector(job), trainer, 2, 1, 2*time.Minute)
	core, err := c.LivePods(t.Context(), ns, workersSelector(job))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range core {
		if p.Labels[constants.LabelGroup] != constants.GroupWorker {
			t.Errorf("pod %s of group %s trains while the burst group should be preempted", p.Name, p.Labels[constants.LabelGroup])
		}
	}
	t.Logf("core workers training alone at world 2 %.1fs after preemption", d.Seconds())
	ev, _ := c.Kubectl(t.Context(), "-n", ns, "get", "events", "--field-selector=reason=Preempted", "-o", "name")
	if !strings.Contains(ev, "event") {
		t.Errorf("no Preempted event: the burst workers were not preempted by the scheduler")
	}

	if err := c.Client.CoreV1().Pods(ns).Delete(t.Context(), hog.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	d = c.WaitWorld(t, ns, workersSelector(job), trainer, 4, 1, 3*time.Minute)
	t.Logf("burst workers back, world 4 again %.1fs after the GPUs were freed", d.Seconds())

	// The dedicated pod is replaced (its node drained, a rollout), and the next one serves an empty store. The
	// agents stay up and re-form there: no pod fails and no trainer restarts. Agents that exited failed the burst
	// pods (restartPolicy Never), which their Job replaced only after its back-off, 10 s doubling with each failed
	// pod of the Job (torch's c10d backend still exits: TestC10dOutlivesWorkerZero).
	rdzvPod := c.WaitPodsReady(t, ns, groupSelector(job, constants.GroupRdzv), 1, time.Minute)[0].Name
	before := snapshot(t, c, ns, workersSelector(job))
	start = time.Now()
	if err := c.Client.CoreV1().Pods(ns).Delete(t.Context(), rdzvPod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("world 4 again %.1fs after the rendezvous pod %s was deleted", waitRecovered(t, c, ns, workersSelector(job), 4, before, start).Seconds(), rdzvPod)
	after := snapshot(t, c, ns, workersSelector(job))
	for name, p := range before {
		if a, ok := after[name]; !ok || a.restarts != p.restarts {
			t.Errorf("worker %s failed or restarted after the rendezvous pod's deletion (live %v, restarts %d -> %d): want the agents to re-form in place",
				name, ok, p.restarts, a.restarts)
		}
	}

	uninstallJob(t, c, ns, job)
}

// TestScriptRun is the petctl case: `--set-file script=train.py` with arguments runs on 3 workers in a stock
// image (the host runtime image), with a shared directory (hostPath here, a PVC on a real cluster) where the
// job writes its checkpoints.
func TestScriptRun(t *testing.T) {
	t.Parallel() // no figure to keep honest: see main_test.go
	c, ns := startTest(t)
	const job = "script"

	v := jobValues(t, c, pytorchValues, trainScript)
	shared := sharedDir(t, v, ns)
	set(v, "args", []any{"--steps=20", "--step-seconds=0.2", "--checkpoint-dir=/data/checkpoints"})
	set(v, "workers", map[string]any{"replicas": 3, "minReplicas": 3, "maxReplicas": 3})
	installJob(t, c, ns, job, v)

	waitJobComplete(t, c, ns, naming.Workload(job, constants.GroupWorker), 3*time.Minute)
	ckpts, _ := filepath.Glob(filepath.Join(shared, "checkpoints", "state-*.pt"))
	if len(ckpts) != 3 {
		t.Fatalf("checkpoints in the shared directory: %v, want one per worker (3)", ckpts)
	}
	for _, f := range ckpts {
		if !strings.Contains(f, "."+job+"."+ns+".svc") {
			t.Errorf("checkpoint %s is not named after a worker's DNS name", f)
		}
	}
	pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: groupSelector(job, constants.GroupWorker)})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if logs := c.PodLogs(t, ns, p.Name, trainer); !strings.Contains(logs, "done steps=20 world_size=3") {
			t.Errorf("%s did not finish 20 steps at world size 3 with the script's arguments:\n%s", p.Name, logs)
		}
	}
	uninstallJob(t, c, ns, job)
}

var dmlcLine = regexp.MustCompile(`(?m)^dmlc (.*)$`)

// TestMXNetParameterServer is the MXNet case: scheduler, servers and workers start with one consistent DMLC_*
// contract. Each pod prints the values it got; the scheduler (examples/scripts/dmlc_roles.py) releases the job
// only when the servers and workers that registered with it over the network match the counts it was given,
// and the test checks every pod's values against the chart's settings.
func TestMXNetParameterServer(t *testing.T) {
	t.Parallel() // no figure to keep honest: see main_test.go
	c, ns := startTest(t)
	const job, servers, workers, port = "ps", 2, 3, 9091
	installJob(t, c, ns, job, jobValues(t, c, "examples/local/mxnet-ps.yaml", "examples/scripts/dmlc_roles.py"))

	waitJobComplete(t, c, ns, naming.Workload(job, constants.GroupWorker), 3*time.Minute)
	// The scheduler is an Indexed Job's pod (Kubernetes replaces it if its node is lost): hostname <job>-scheduler-0.
	scheds, err := c.LivePods(t.Context(), ns, groupSelector(job, constants.GroupScheduler))
	if err != nil || len(scheds) != 1 {
		t.Fatalf("want one scheduler pod: %d, %v", len(scheds), err)
	}
	sched := scheds[0].Name
	c.WaitForLog(t, ns, sched, trainer, fmt.Sprintf("all registered servers=%d workers=%d worker_ids=[0, 1, 2]", servers, workers), time.Minute)

	want := map[string]string{
		"DMLC_PS_ROOT_URI":  naming.PodFQDN(naming.Workload(job, constants.GroupScheduler)+"-0", naming.HeadlessService(job), ns, framework.ClusterDomain),
		"DMLC_PS_ROOT_PORT": fmt.Sprint(port),
		"DMLC_NUM_SERVER":   fmt.Sprint(servers),
		"DMLC_NUM_WORKER":   fmt.Sprint(workers),
	}
	pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: constants.LabelJob + "=" + job})
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]int{}
	var ids []string
	for _, p := range pods.Items {
		role := p.Labels[constants.LabelRole]
		m := dmlcLine.FindStringSubmatch(c.PodLogs(t, ns, p.Name, trainer))
		if m == nil {
			t.Errorf("%s (%s) printed no dmlc line", p.Name, role)
			continue
		}
		got := map[string]string{}
		for _, kv := range strings.Fields(m[1]) {
			k, v, _ := strings.Cut(kv, "=")
			got[k] = v
		}
		roles[got["DMLC_ROLE"]]++
		if got["DMLC_ROLE"] != role {
			t.Errorf("%s: DMLC_ROLE=%q, want its role label %q", p.Name, got["DMLC_ROLE"], role)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s (%s): %s=%q, want %q", p.Name, role, k, got[k], v)
			}
		}
		if role == constants.RoleWorker {
			ids = append(ids, got["DMLC_WORKER_ID"])
		}
	}
	sort.Strings(ids)
	if fmt.Sprint(roles) != fmt.Sprintf("map[scheduler:1 server:%d worker:%d]", servers, workers) || fmt.Sprint(ids) != "[0 1 2]" {
		t.Errorf("roles %v, worker ids %v; want 1 scheduler, %d servers, %d workers with ids 0..2", roles, ids, servers, workers)
	}

	uninstallJob(t, c, ns, job)
}

// Package workloads runs the seed workloads for real on the local cluster, as a user would: the webhook
// installed from its chart, a job installed with `helm install`, scaled with `helm upgrade`, watched through
// pod logs, removed with `helm uninstall`.
package workloads

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// Tests that measure something (scaling, faults, node loss, preemption, MPI's hostfile latency) run one at a time:
// the cluster and the machine's 2 cores are theirs alone, so their figures stay honest. Those whose outcome does not
// depend on timing (the scheduling gate, Events, Pod Security, a crash-looping job's helm test, the script and MXNet
// jobs) call t.Parallel: Go runs them together once the others are done, up to -parallel at a time (make e2e: 4),
// each in its own namespace. Not TestElasticPyTorch's cases: two at a time, torch 2.6's legacy etcd backend once
// formed a round of 1 on a scale-down 4 -> 2 and closed the rendezvous (RendezvousClosedError), failing the job. Not TestNetworkPolicyEnforced: run beside others, node2's kube-router had not yet
// enforced the job's policy on a pod created a minute before (it syncs on events, slower on a busy machine), and
// the test probes at once.
func TestMain(m *testing.M) { framework.Main(m) }

const trainer = "trainer" // the chart's training container

var webhookOnce sync.Once

// installWebhook installs the webhook chart once per test binary (framework.InstallWebhook: the images just
// built, noWebhookNamespace excluded) and runs the chart's own `helm test`. It stays installed after the test
// that happened to install it: every later test needs it.
func installWebhook(t testing.TB, c *framework.Cluster) {
	t.Helper()
	webhookOnce.Do(func() {
		c.InstallWebhook(t, "default", []string{noWebhookNamespace}, framework.KeepAfterTest())
		// The webhook chart's own test: `webhook check` from a pod, over TLS to the Service, with the Secret's CA.
		start := time.Now()
		c.HelmTest(t, framework.WebhookNamespace, framework.WebhookRelease, 2*time.Minute)
		t.Logf("helm test %s passed: %.1fs", framework.WebhookRelease, time.Since(start).Seconds())
	})
}

// startTest is how a workload test starts: the cluster, the webhook installed (once per test binary) and a
// namespace of the test's own.
func startTest(t *testing.T) (*framework.Cluster, string) {
	t.Helper()
	c := framework.Get(t)
	installWebhook(t, c)
	return c, c.Namespace(t)
}

// installJob is `helm install <job> charts/elastic-training` in ns with the values v.
func installJob(t testing.TB, c *framework.Cluster, ns, job string, v map[string]any) {
	t.Helper()
	c.HelmInstall(t, ns, job, c.RepoPath(jobChart), v)
}

// installTraining installs the job and waits until its n workers (the worker group) train at world size n. It
// returns their selector.
func installTraining(t testing.TB, c *framework.Cluster, ns, job string, v map[string]any, n int) string {
	t.Helper()
	installJob(t, c, ns, job, v)
	sel := groupSelector(job, constants.GroupWorker)
	waitWorld(t, c, ns, sel, n, 1, 3*time.Minute)
	return sel
}

// scaleWorkers is `helm upgrade <job> charts/elastic-training --reuse-values --set workers.replicas=<n>`.
func scaleWorkers(t testing.TB, c *framework.Cluster, ns, job string, n int) {
	t.Helper()
	c.HelmUpgrade(t, ns, job, c.RepoPath(jobChart), map[string]any{"workers": map[string]any{"replicas": n}}, framework.ReuseValues())
}

// uninstallJob is `helm uninstall <job>`, then a wait until nothing the chart created is left in ns.
func uninstallJob(t testing.TB, c *framework.Cluster, ns, job string) {
	t.Helper()
	c.HelmUninstall(t, ns, job, 2*time.Minute)
	waitEmpty(t, c, ns)
}

// jobValues reads a values file of the repository (as `-f`), with the training script as `--set-file script=`.
func jobValues(t testing.TB, c *framework.Cluster, valuesFile, script string) map[string]any {
	t.Helper()
	v := c.Values(t, valuesFile)
	if script != "" {
		s, err := os.ReadFile(c.RepoPath(script))
		if err != nil {
			t.Fatal(err)
		}
		v["script"] = string(s)
	}
	return v
}

// set sets a dotted key in nested values, as --set does.
func set(v map[string]any, key string, val any) {
	parts := strings.Split(key, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := v[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			v[p] = next
		}
		v = next
	}
	v[parts[len(parts)-1]] = val
}

// groupSelector selects the pods of one group of a job.
func groupSelector(job, group string) string {
	return constants.LabelJob + "=" + job + "," + constants.LabelGroup + "=" + group
}

// workersSelector selects the training members of a job, whatever their group.
func workersSelector(job string) string {
	return constants.LabelJob + "=" + job + "," + constants.LabelRole + "=" + constants.RoleWorker
}

// sharedDir mounts a host directory at /data in every pod of the job, as a PVC would on a real cluster, and
// returns its path on this machine (the test runs on the node). It is removed when the test ends.
func sharedDir(t testing.TB, v map[string]any, ns string) string {
	t.Helper()
	dir := filepath.Join(os.TempDir(), "et-e2e-"+ns)
	t.Cleanup(func() { os.RemoveAll(dir) })
	vols, _ := v["volumes"].([]any)
	mounts, _ := v["volumeMounts"].([]any)
	set(v, "volumes", append(vols, map[string]any{"name": "shared", "hostPath": map[string]any{"path": dir, "type": "DirectoryOrCreate"}}))
	set(v, "volumeMounts", append(mounts, map[string]any{"name": "shared", "mountPath": "/data"}))
	return dir
}

// livePods are the selected pods that run and are not being deleted (a Pending replacement of a preempted pod
// does not train), by group and completion index.
func livePods(ctx context.Context, c *framework.Cluster, ns, selector string) ([]corev1.Pod, error) {
	l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		gi, gj := out[i].Labels[constants.LabelGroup], out[j].Labels[constants.LabelGroup]
		return gi < gj || gi == gj && podIndex(out[i]) < podIndex(out[j])
	})
	return out, nil
}

func podIndex(p corev1.Pod) int {
	i, _ := strconv.Atoi(p.Annotations["batch.kubernetes.io/job-completion-index"])
	return i
}

// tailLogs reads the last lines of a container's log. A pod on a lost node is still listed, and the API server's
// call to that node's kubelet can hang for minutes: a read gets 15 s.
func tailLogs(ctx context.Context, c *framework.Cluster, ns, pod, container string, lines int64) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	b, err := c.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container, TailLines: &lines}).DoRaw(ctx)
	return string(b), err
}

var stepLine = regexp.MustCompile(`step=(\d+) world_size=(\d+)`)

// lastStep returns the last training step a pod logged and the world size it ran at (-1 when none yet).
func lastStep(logs string) (step, world int) {
	m := stepLine.FindAllStringSubmatch(logs, -1)
	if len(m) == 0 {
		return -1, -1
	}
	step, _ = strconv.Atoi(m[len(m)-1][1])
	world, _ = strconv.Atoi(m[len(m)-1][2])
	return step, world
}

// waitWorld waits until exactly n selected pods are live and every one of them last trained at world size
// n*slots, and returns how long that took.
func waitWorld(t testing.TB, c *framework.Cluster, ns, selector string, n, slots int, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var last string
	c.WaitFor(t, timeout, fmt.Sprintf("%d pods (%s) training at world size %d", n, selector, n*slots), func(ctx context.Context) (bool, error) {
		pods, err := livePods(ctx, c, ns, selector)
		if err != nil {
			return false, err
		}
		var states []string
		ok := len(pods) == n
		for _, p := range pods {
			if p.Annotations[constants.AnnotationMutated] == "" {
				// Without the webhook torchrun runs standalone and trains alone: say so now, not at the timeout.
				t.Fatalf("pod %s was created without the webhook's mutation (is the MutatingWebhookConfiguration installed?)", p.Name)
			}
			logs, err := tailLogs(ctx, c, ns, p.Name, trainer, 30)
			if err != nil {
				ok = false
				states = append(states, p.Name+": "+err.Error())
				continue
			}
			step, world := lastStep(logs)
			states = append(states, fmt.Sprintf("%s: step %d world %d", p.Name, step, world))
			ok = ok && world == n*slots
		}
		last = strings.Join(states, "; ")
		if ok {
			return true, nil
		}
		return false, fmt.Errorf("%d live pods: %s", len(pods), last)
	})
	t.Logf("%d pods at world size %d after %.1fs (%s)", n, n*slots, time.Since(start).Seconds(), last)
	return time.Since(start)
}

// waitEmpty waits until nothing the chart created is left in ns (`helm uninstall` leaves nothing behind).
func waitEmpty(t testing.TB, c *framework.Cluster, ns string) {
	t.Helper()
	c.WaitFor(t, 2*time.Minute, "an empty namespace after helm uninstall", func(ctx context.Context) (bool, error) {
		out, err := c.Kubectl(ctx, "-n", ns, "get", "pods,services,configmaps,secrets,jobs,statefulsets,networkpolicies,poddisruptionbudgets,persistentvolumeclaims,endpointslices,leases,deployments,roles,rolebindings", "-o", "name")
		if err != nil {
			return false, err
		}
		var left []string
		for _, l := range strings.Fields(out) {
			if l != "configmap/kube-root-ca.crt" {
				left = append(left, l)
			}
		}
		if len(left) > 0 {
			return false, fmt.Errorf("left: %s", strings.Join(left, " "))
		}
		return true, nil
	})
}

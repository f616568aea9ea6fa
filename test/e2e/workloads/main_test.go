// Package workloads runs the seed workloads for real on the local cluster, as a user would: the webhook
// installed from its chart, a job installed with `helm install`, scaled with `helm upgrade`, watched through
// pod logs, removed with `helm uninstall`.
package workloads

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// Tests that measure something (scaling, faults, node loss, preemption, MPI's hostfile latency) run one at a time:
// the cluster and the machine's 2 cores are theirs alone, so their figures stay honest. Those whose outcome does not
// depend on timing (the scheduling gate, Events, Pod Security, a crash-looping job's helm test, the script and MXNet
// jobs, Kueue's admissions, c10d outliving worker 0's pod) call t.Parallel: Go runs them together once the others are done, up to -parallel at a time (make e2e: 4),
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
	c.WaitWorld(t, ns, sel, trainer, n, 1, 3*time.Minute)
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
	if t.Failed() {
		return // the namespace's dump shows the pods' logs; deleting the namespace removes the job
	}
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

// waitEmpty waits until nothing the chart created is left in ns (`helm uninstall` leaves nothing behind).
func waitEmpty(t testing.TB, c *framework.Cluster, ns string) {
	t.Helper()
	c.WaitFor(t, 2*time.Minute, "an empty namespace after helm uninstall", func(ctx context.Context) (bool, error) {
		out, err := c.Kubectl(ctx, "-n", ns, "get", "pods,services,configmaps,secrets,jobs,statefulsets,networkpolicies,poddisruptionbudgets,persistentvolumeclaims,endpointslices,leases,deployments,roles,rolebindings", "-l", "!"+framework.LabelTestUser, "-o", "name")
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

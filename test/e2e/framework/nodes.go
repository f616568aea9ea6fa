package framework

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// The node-loss faults, as users meet them, on the nodes of test/e2e/cluster/node.sh (every node but NodeName,
// which is the host itself and holds the control plane). node.sh says exactly what each does.

// ExtraNodes are the nodes beside NodeName (EXTRA_NODES): each can be crashed, partitioned and healed.
var ExtraNodes = strings.Fields(settings["EXTRA_NODES"])

// CrashNode is a power loss of node: its network cut first (no FIN or RST escapes), then every process of it
// (kubelet, containerd, shims, containers) SIGKILLed at once. The node comes back only with RestartNode; the
// test's cleanup restarts it if the test did not.
func (c *Cluster) CrashNode(t testing.TB, node string) time.Time {
	t.Helper()
	c.nodeCleanup(t, node)
	at := time.Now()
	c.scriptForTest(t, "crash "+node, "node.sh", "crash", node)
	return at
}

// PartitionNode cuts node's network: every packet to or from it is dropped silently, its processes run on. The
// test's cleanup heals it if the test did not.
func (c *Cluster) PartitionNode(t testing.TB, node string) time.Time {
	t.Helper()
	c.nodeCleanup(t, node)
	at := time.Now()
	c.scriptForTest(t, "partition "+node, "node.sh", "partition", node)
	return at
}

// HealNode gives a partitioned node its network back.
func (c *Cluster) HealNode(t testing.TB, node string) {
	t.Helper()
	c.scriptForTest(t, "heal "+node, "node.sh", "heal", node)
}

// RestartNode boots a crashed node again (containerd's root and the kubelet's directory survive, as a disk does)
// and waits until it is Ready with its devices.
func (c *Cluster) RestartNode(t testing.TB, node string) {
	t.Helper()
	c.scriptForTest(t, "restart "+node, "node.sh", "up", node)
}

// nodeCleanup makes sure node is up and connected when the test ends, whatever the test did to it.
func (c *Cluster) nodeCleanup(t testing.TB, node string) {
	t.Cleanup(func() {
		if err := c.script(nil, "node.sh", "up", node); err != nil {
			t.Errorf("bringing %s back after the test: %v", node, err)
		}
	})
}

// Cordon marks node unschedulable (kubectl cordon) until the returned function (or the test's end) undoes it.
func (c *Cluster) Cordon(t testing.TB, node string) func() {
	t.Helper()
	set := func(ctx context.Context, v bool) error {
		patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, v)
		_, err := c.Client.CoreV1().Nodes().Patch(ctx, node, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{})
		return err
	}
	if err := set(t.Context(), true); err != nil {
		t.Fatalf("cordon %s: %v", node, err)
	}
	done := false
	undo := func() {
		if done {
			return
		}
		done = true
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := set(ctx, false); err != nil {
			t.Errorf("uncordon %s: %v", node, err)
		}
	}
	t.Cleanup(undo)
	return undo
}

// NodeReady reports whether node's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// CutOffLog is the log of a container of pod on node while the API server cannot reach it (a partition): read from
// the node's disk, as an administrator would on the machine. Every restart of the container, oldest first.
func (c *Cluster) CutOffLog(node, ns, pod, container string) (string, error) {
	dirs, err := filepath.Glob(filepath.Join(settings["RUN"], "nodes", node, "pod-logs", ns+"_"+pod+"_*", container))
	if err != nil || len(dirs) != 1 {
		return "", fmt.Errorf("the log directory of %s/%s on %s: %d found, %v", pod, container, node, len(dirs), err)
	}
	files, err := filepath.Glob(filepath.Join(dirs[0], "*.log"))
	if err != nil {
		return "", err
	}
	slices.SortFunc(files, func(a, b string) int { return cmp.Compare(restartOf(a), restartOf(b)) })
	var out strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		out.Write(b)
	}
	return out.String(), nil
}

// restartOf is the restart count a kubelet log file is named by (<n>.log).
func restartOf(path string) int {
	n, _ := strconv.Atoi(strings.TrimSuffix(filepath.Base(path), ".log"))
	return n
}

// ShapeAsGPUNode makes node look like a managed cluster's GPU node for the rest of the test: tainted as the GPU
// operator and the clouds' GPU node pools taint it (nvidia.com/gpu=present:NoSchedule) and labelled as the GPU
// operator labels it (nvidia.com/gpu.present=true). Its fake GPUs are the cluster's own (FAKE_DEVICES). The test's
// cleanup takes both off. Only for tests that run alone: a parallel test would find the node tainted.
func (c *Cluster) ShapeAsGPUNode(t testing.TB, node string) {
	t.Helper()
	taint := corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}
	const label = "nvidia.com/gpu.present"
	edit := func(ctx context.Context, change func(n *corev1.Node)) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			change(n)
			_, err = c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		})
	}
	t.Cleanup(func() {
		err := edit(context.Background(), func(n *corev1.Node) {
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.MatchTaint(&taint) })
			delete(n.Labels, label)
		})
		if err != nil {
			t.Errorf("cleanup: untaint %s: %v", node, err)
		}
	})
	err := edit(t.Context(), func(n *corev1.Node) {
		if !slices.ContainsFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.MatchTaint(&taint) }) {
			n.Spec.Taints = append(n.Spec.Taints, taint)
		}
		n.Labels[label] = "true"
	})
	if err != nil {
		t.Fatalf("taint %s as a GPU node: %v", node, err)
	}
}

// Package install_test installs the product as docs/install.md tells a platform engineer to, on the local cluster:
// the images pushed to a registry with `make images REGISTRY=... PUSH=1`, the webhook and a job installed with
// global.imageRegistry alone, every image pulled from that registry (nothing imported into containerd by hand), and
// the job's least privilege checked through the real API server. Its own test binary: it installs the webhook
// chart from the registry, which the other packages install from local images.
package install_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

func TestMain(m *testing.M) { framework.Main(m) }

const trainer = "trainer" // the chart's training container

// TestInstallFromRegistry follows docs/install.md against the cluster's OCI registry (go-containerregistry's, plain
// HTTP, which every node's containerd pulls from): push, the webhook with global.imageRegistry, a job with
// global.imageRegistry and what a PyTorch user writes (image, script, sizes). The job trains, scales 2 -> 3 with
// helm upgrade, and helm test passes; every container of the webhook's and the job's pods (the injected sidecar,
// the helm test pod) runs an image pulled from the registry.
func TestInstallFromRegistry(t *testing.T) {
	c := framework.Get(t)
	reg := framework.LocalRegistry
	// Nodes as fresh as the registry (emptied at each cluster start): no copy of an earlier run's images under the
	// same tags, before and after.
	c.RemoveImages(t, reg+"/")
	t.Cleanup(func() { c.RemoveImages(t, reg+"/") })
	c.PushImages(t, reg, "forky")
	global := map[string]any{"imageRegistry": reg}
	start := time.Now()
	c.InstallWebhookValues(t, "default", map[string]any{"global": global})
	t.Logf("webhook installed from %s, admitting pods: %.1fs", reg, time.Since(start).Seconds())
	fromRegistry(t, c, framework.WebhookNamespace, "app.kubernetes.io/instance="+framework.WebhookRelease, reg)

	ns := c.Namespace(t)
	const job = "llm"
	script, err := os.ReadFile(c.RepoPath("examples/scripts/elastic_train.py"))
	if err != nil {
		t.Fatal(err)
	}
	// What a PyTorch user writes (examples/pytorch-elastic.yaml's shape), with the trainer image of this cluster:
	// its repository is local/trainer, which global.imageRegistry moves to the registry like every other.
	values := map[string]any{
		"global": global,
		"image":  map[string]any{"repository": "local/trainer", "tag": "forky"},
		"script": string(script),
		"args":   []any{"--steps=400", "--step-seconds=0.5"},
		// Debian's torch has no libuv (examples/local/pytorch-elastic.yaml says why this is the image's quirk).
		"env":     []any{map[string]any{"name": "USE_LIBUV", "value": "0"}, map[string]any{"name": "PYTHONUNBUFFERED", "value": "1"}},
		"workers": map[string]any{"replicas": 2, "minReplicas": 1, "maxReplicas": 4},
		"tests":   map[string]any{"stableFor": "10s", "minMembers": 2},
	}
	start = time.Now()
	c.HelmInstall(t, ns, job, c.RepoPath("charts/elastic-training"), values)
	sel := constants.LabelJob + "=" + job + "," + constants.LabelGroup + "=" + constants.GroupWorker
	c.WaitWorld(t, ns, sel, trainer, 2, 1, 8*time.Minute)
	t.Logf("helm install -> training at world 2, images pulled from %s: %.1fs", reg, time.Since(start).Seconds())

	leastPrivilege(t, c, ns, job)

	c.HelmUpgrade(t, ns, job, c.RepoPath("charts/elastic-training"), map[string]any{"workers": map[string]any{"replicas": 3}}, framework.ReuseValues())
	c.WaitWorld(t, ns, sel, trainer, 3, 1, 5*time.Minute)
	c.HelmTest(t, ns, job, 3*time.Minute)
	fromRegistry(t, c, ns, constants.LabelJob+"="+job, reg)
	c.HelmUninstall(t, ns, job, 2*time.Minute)
}

// fromRegistry checks that every container of the selected pods runs an image of the registry, and that the node
// pulled it from there (the image ID the kubelet reports is the registry's digest).
func fromRegistry(t *testing.T, c *framework.Cluster, ns, selector, reg string) {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) == 0 {
		t.Fatalf("no pods of %s in %s", selector, ns)
	}
	n := 0
	for _, p := range pods.Items {
		for _, s := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
			n++
			if !strings.HasPrefix(s.Image, reg+"/") || !strings.HasPrefix(s.ImageID, reg+"/") {
				t.Errorf("%s/%s container %s: image %q (ID %q), want one pulled from %s", ns, p.Name, s.Name, s.Image, s.ImageID, reg)
			}
		}
	}
	t.Logf("%d containers of %d pods (%s) run images pulled from %s", n, len(pods.Items), selector, reg)
}

// leastPrivilege: the namespace's default account, which every other pod of the namespace runs as, may not move the
// job's rendezvous (patch its Lease or EndpointSlice); the job's own account may. And a real pod running as default,
// with its token mounted, is refused by the API server when it tries.
func leastPrivilege(t *testing.T, c *framework.Cluster, ns, job string) {
	t.Helper()
	rdzv := naming.RendezvousService(job)
	for _, who := range []struct {
		account, want string
	}{{"default", "no"}, {job, "yes"}} {
		for _, what := range []string{"leases/" + rdzv, "endpointslices.discovery.k8s.io/" + rdzv} {
			out, _ := c.Kubectl(t.Context(), "-n", ns, "auth", "can-i", "patch", what, "--as", fmt.Sprintf("system:serviceaccount:%s:%s", ns, who.account))
			if strings.TrimSpace(out) != who.want {
				t.Errorf("kubectl auth can-i patch %s --as %s: %q, want %q", what, who.account, strings.TrimSpace(out), who.want)
			}
		}
	}
	// patcher (./patcher), built static here and run in-cluster with the pod's own token (the pod runs on node1,
	// where the binary is).
	bin := filepath.Join(t.TempDir(), "patcher")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "./patcher")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./patcher: %v\n%s", err, out)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "not-the-job"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			NodeSelector:  map[string]string{"kubernetes.io/hostname": framework.NodeName},
			Containers: []corev1.Container{{
				Name: "patch", Image: framework.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:      []string{"/patcher", ns, rdzv, "10.244.0.250"},
				VolumeMounts: []corev1.VolumeMount{{Name: "patcher", MountPath: "/patcher", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: "patcher", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: bin}}}},
		},
	}
	if _, err := c.Client.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var done *corev1.Pod
	c.WaitFor(t, 2*time.Minute, "pod "+pod.Name+" (as default) to finish its patch", func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		done = p
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
	})
	logs, _ := c.Client.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(t.Context())
	if done.Status.Phase != corev1.PodFailed || !strings.Contains(string(logs), "forbidden") {
		t.Errorf("a pod running as %s:default patched EndpointSlice %s (phase %s): %s", ns, rdzv, done.Status.Phase, logs)
	} else {
		t.Logf("a pod running as default, patching EndpointSlice %s: %s", rdzv, strings.TrimSpace(string(logs)))
	}
	slice, err := c.Client.DiscoveryV1().EndpointSlices(ns).Get(t.Context(), rdzv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range slice.Endpoints {
		for _, a := range e.Addresses {
			if a == "10.244.0.250" {
				t.Errorf("EndpointSlice %s points at the address the pod running as default wrote", rdzv)
			}
		}
	}
	if err := c.Client.CoreV1().Pods(ns).Delete(t.Context(), pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
}

// TestWebhookOnHostNetwork: a control plane that cannot reach the pod network, as on a GKE private cluster or EKS
// with an overlay CNI, here the API server's connections to pod addresses on the webhook's port cut by a firewall
// rule of the test's own (nftables, before iptables' rules). Installed as by default, the webhook cannot be called:
// the Job's FailedCreate Event says so, naming the webhook. Upgraded to hostNetwork with a port of the node
// (docs/install.md), it admits the job's pods again and the job trains.
func TestWebhookOnHostNetwork(t *testing.T) {
	c := framework.Get(t)
	c.InstallWebhookValues(t, "default", map[string]any{
		"image":   framework.ImageValues(framework.WebhookImage),
		"sidecar": map[string]any{"image": framework.ImageValues(framework.SidecarImage)},
	})
	cutPodNetwork(t, 9443)
	ns := c.Namespace(t)
	const job = "private"
	script, err := os.ReadFile(c.RepoPath("examples/scripts/elastic_train.py"))
	if err != nil {
		t.Fatal(err)
	}
	v := c.Values(t, "examples/local/pytorch-elastic.yaml")
	v["script"] = string(script)
	v["args"] = []any{"--steps=400", "--step-seconds=0.5"}
	c.HelmInstall(t, ns, job, c.RepoPath("charts/elastic-training"), v)
	worker := naming.Workload(job, constants.GroupWorker)
	var event string
	c.WaitFor(t, 2*time.Minute, "a FailedCreate Event on Job "+worker+" that names the webhook", func(ctx context.Context) (bool, error) {
		evs, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + worker + ",reason=FailedCreate"})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, `failed calling webhook "pods.elastic-training.io"`) {
				event = e.Message
				return true, nil
			}
		}
		return false, fmt.Errorf("%d FailedCreate Events, none names the webhook", len(evs.Items))
	})
	t.Logf("with the pod network cut off, Job %s says: %s", worker, event)

	c.HelmUpgrade(t, framework.WebhookNamespace, framework.WebhookRelease, c.RepoPath("charts/elastic-training-webhook"),
		map[string]any{"hostNetwork": true, "webhook": map[string]any{"port": 19443}, "healthPort": 19444, "metrics": map[string]any{"port": 19445}},
		framework.ReuseValues(), framework.Wait(3*time.Minute))
	c.WaitFor(t, 2*time.Minute, "the webhook on host networking to mutate a dry-run training pod", func(ctx context.Context) (bool, error) {
		return c.DryRunMutated(ctx, "default")
	})
	sel := constants.LabelJob + "=" + job + "," + constants.LabelGroup + "=" + constants.GroupWorker
	c.WaitWorld(t, ns, sel, trainer, 2, 1, 5*time.Minute)
	c.HelmUninstall(t, ns, job, 2*time.Minute)
}

// cutPodNetwork rejects this host's connections to pod addresses on port (what the API server does to call a
// webhook) until the test ends: an nftables table of the test's own, at the output hook after NAT (a Service's
// address is already a pod's there) and before iptables' filter, whose accepts (kube-router's) would end a rule of
// ours in iptables first.
func cutPodNetwork(t *testing.T, port int) {
	t.Helper()
	const table = "et-e2e-cut"
	rules := fmt.Sprintf("table ip %s {\n chain output {\n  type filter hook output priority -10; policy accept;\n  ip daddr %s tcp dport %d reject with tcp reset\n }\n}\n", table, framework.PodCIDR, port)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("nft", "delete", "table", "ip", table).CombinedOutput(); err != nil {
			t.Errorf("nft delete table %s: %v\n%s", table, err, out)
		}
	})
}

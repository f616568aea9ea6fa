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
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/jobstatus"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// TestSharedMemory: the trainer's /dev/shm is the chart's memory-backed emptyDir (shm), sized as asked, not the
// container runtime's 64 MiB on which DataLoader workers and NCCL fail with a bus error. `df` in the running trainer
// (one worker of a job with shm.sizeLimit=256Mi) says so; a DataLoader-sized write (100 MiB) fits.
// The same job carries the escape hatches a GPU cluster asks for on its first day, so that they run and not only
// render: its own ServiceAccount (serviceAccount.create), with which the serving sidecar holds the rendezvous Lease
// (the Role's binding follows the account); an init container that runs after the rendezvous sidecar; an extra
// container beside the trainer; an extraObjects manifest whose name goes through tpl.
func TestSharedMemory(t *testing.T) {
	t.Parallel() // no figure to keep honest: see main_test.go
	c, ns := startTest(t)
	const job = "shm"
	v := jobValues(t, c, pytorchValues, trainScript)
	set(v, "workers.replicas", 1)
	set(v, "shm.sizeLimit", "256Mi")
	set(v, "args", []any{"--steps=100000", "--step-seconds=0.5"})
	image := v["image"].(map[string]any)
	ref := fmt.Sprintf("%s:%s", image["repository"], image["tag"])
	set(v, "serviceAccount.create", true)
	set(v, "initContainers", []any{map[string]any{"name": "prepare", "image": ref, "imagePullPolicy": "Never",
		"command": []any{"sh", "-c", "echo prepared"}}})
	set(v, "extraContainers", []any{map[string]any{"name": "exporter", "image": ref, "imagePullPolicy": "Never",
		"command": []any{"sleep", "infinity"}}})
	set(v, "extraObjects", []any{"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: '{{ .Release.Name }}-extra'\ndata:\n  from: extraObjects\n"})
	sel := installTraining(t, c, ns, job, v, 1)
	pods, err := c.LivePods(t.Context(), ns, sel)
	if err != nil || len(pods) != 1 {
		t.Fatalf("want 1 live worker: %d, %v", len(pods), err)
	}
	checkEscapeHatches(t, c, ns, job, pods[0])
	out, err := c.Kubectl(t.Context(), "-n", ns, "exec", pods[0].Name, "-c", trainer, "--", "sh", "-c",
		"df -k /dev/shm | tail -1; dd if=/dev/zero of=/dev/shm/fill bs=1M count=100 2>&1 | tail -1; rm -f /dev/shm/fill")
	if err != nil {
		t.Fatalf("df /dev/shm: %v: %s", err, out)
	}
	t.Logf("df -k /dev/shm in %s:\n%s", pods[0].Name, out)
	// Filesystem 1K-blocks Used Available Use% Mounted on
	f := strings.Fields(strings.SplitN(out, "\n", 2)[0])
	if len(f) < 6 || f[0] != "tmpfs" || f[5] != "/dev/shm" || f[1] != "262144" {
		t.Errorf("/dev/shm is not a 256 MiB tmpfs (262144 1K-blocks): %q", out)
	}
	if !regexp.MustCompile(`104857600 bytes`).MatchString(out) {
		t.Errorf("a 100 MiB write to /dev/shm failed: %q", out)
	}
	uninstallJob(t, c, ns, job)
}

// checkEscapeHatches: pod, of job, runs as the job's own account, which holds the rendezvous Lease; its init
// container ran after the rendezvous sidecar and ended well; the extra container runs; the extra ConfigMap exists.
func checkEscapeHatches(t *testing.T, c *framework.Cluster, ns, job string, pod corev1.Pod) {
	t.Helper()
	if pod.Spec.ServiceAccountName != job {
		t.Errorf("%s runs as %q: want the job's own account %q (serviceAccount.create)", pod.Name, pod.Spec.ServiceAccountName, job)
	}
	if s, err := c.RdzvServer(t.Context(), ns, job); err != nil || s.Name != pod.Name {
		t.Errorf("the rendezvous Lease: %v, %v: want it held by %s with the job's account", s, err, pod.Name)
	}
	var inits []string
	for _, ic := range pod.Spec.InitContainers {
		inits = append(inits, ic.Name)
	}
	if len(inits) < 2 || inits[0] != constants.SidecarContainerName || !slices.Contains(inits[1:], "prepare") {
		t.Errorf("init containers %v: want the rendezvous sidecar, then prepare", inits)
	}
	for _, st := range pod.Status.InitContainerStatuses {
		if st.Name == "prepare" && (st.State.Terminated == nil || st.State.Terminated.ExitCode != 0) {
			t.Errorf("init container prepare: %+v: want it ended with 0", st.State)
		}
	}
	running := false
	for _, st := range pod.Status.ContainerStatuses {
		running = running || st.Name == "exporter" && st.State.Running != nil
	}
	if !running {
		t.Errorf("extra container exporter does not run: %+v", pod.Status.ContainerStatuses)
	}
	if cm, err := c.Client.CoreV1().ConfigMaps(ns).Get(t.Context(), job+"-extra", metav1.GetOptions{}); err != nil || cm.Data["from"] != "extraObjects" {
		t.Errorf("ConfigMap %s-extra from extraObjects: %v, %v", job, cm, err)
	}
}

// TestHostNetworkJobsShareANode: two PyTorch jobs on host networking (hostNetwork) train side by side on one node
// (node2, whose network is its own namespace). Each pod's rendezvous sidecar listens on five ports of its job's own,
// the first from annotation rdzv-ports (the chart's pick for one job, a given hostNetworkPortBase for the other), so
// nothing collides on the node's ports; both trainers train, each through its own rendezvous reached through its
// Service, and each sidecar serves /readyz on its job's health port at the node's address. Both jobs keep in-memory
// checkpoints and report progress, which on host networking go over Unix sockets in each pod's own volume (the
// node's loopback is both pods'): each trainer loads (asks its sidecar for the newest save) and saves through its
// socket, its sidecar serves the peers on the job's fifth port, and each job's status shows its ranks' step, which
// only the progress datagrams on the pod's socket carry.
func TestHostNetworkJobsShareANode(t *testing.T) {
	t.Parallel() // no figure to keep honest: see main_test.go
	c, ns := startTest(t)
	node := framework.ExtraNodes[0]
	values := func(base int) map[string]any {
		v := jobValues(t, c, pytorchValues, trainScript)
		set(v, "workers.replicas", 1)
		set(v, "hostNetwork", true)
		set(v, "hostNetworkPortBase", base)
		set(v, "nodeSelector", map[string]any{"kubernetes.io/hostname": node})
		set(v, "args", []any{"--steps=100000", "--step-seconds=0.5"})
		set(v, "checkpoint.memory", "256Mi")
		return v
	}
	first := installTraining(t, c, ns, "hosta", values(0), 1)
	a, err := c.LivePods(t.Context(), ns, first)
	if err != nil || len(a) != 1 {
		t.Fatalf("want 1 live worker of hosta: %d, %v", len(a), err)
	}
	baseA, _ := strconv.Atoi(a[0].Annotations[constants.AnnotationRdzvPorts])
	baseB := 20000 + (baseA-20000+5000)%10000 // another block of ports, whatever the chart picked for hosta
	second := installTraining(t, c, ns, "hostb", values(baseB), 1)
	b, err := c.LivePods(t.Context(), ns, second)
	if err != nil || len(b) != 1 {
		t.Fatalf("want 1 live worker of hostb: %d, %v", len(b), err)
	}
	for _, p := range []corev1.Pod{a[0], b[0]} {
		if !p.Spec.HostNetwork || p.Spec.NodeName != node || p.Status.PodIP != p.Status.HostIP {
			t.Errorf("%s: hostNetwork %v on %s, pod IP %s, node IP %s: want host networking on %s", p.Name, p.Spec.HostNetwork, p.Spec.NodeName, p.Status.PodIP, p.Status.HostIP, node)
		}
	}
	t.Logf("hosta's sidecar ports from %d, hostb's from %d, both on %s (%s)", baseA, baseB, node, a[0].Status.HostIP)
	// Both jobs train again after a while: neither's rendezvous took the other's ports.
	c.WaitWorld(t, ns, first, trainer, 1, 1, time.Minute)
	c.WaitWorld(t, ns, second, trainer, 1, 1, time.Minute)
	// Each sidecar answers on its job's health port at the node's address (what the kubelet probes).
	for _, x := range []struct {
		pod  corev1.Pod
		base int
	}{{a[0], baseA}, {b[0], baseB}} {
		health := constants.PortsFrom(int32(x.base)).Health
		out, err := c.Kubectl(t.Context(), "-n", ns, "exec", x.pod.Name, "-c", trainer, "--", "python3", "-c",
			fmt.Sprintf("import urllib.request; print(urllib.request.urlopen('http://%s:%d/readyz', timeout=5).read().decode())", x.pod.Status.HostIP, health))
		if err != nil || !strings.HasPrefix(out, "ok") {
			t.Errorf("%s: /readyz on %s:%d: %v %q", x.pod.Name, x.pod.Status.HostIP, health, err, out)
		}
	}
	for _, x := range []struct {
		job  string
		pod  corev1.Pod
		base int
	}{{"hosta", a[0], baseA}, {"hostb", b[0], baseB}} {
		workerJob := naming.Workload(x.job, "worker")
		c.WaitFor(t, time.Minute, x.job+"'s status has a step and its sidecar a save", func(ctx context.Context) (bool, error) {
			j, err := c.Client.BatchV1().Jobs(ns).Get(ctx, workerJob, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			step := j.Annotations[jobstatus.Step]
			if step == "" || strings.HasPrefix(step, "-") {
				return false, fmt.Errorf("Job %s: %s=%q", workerJob, jobstatus.Step, step)
			}
			if logs := c.PodLogs(t, ns, x.pod.Name, constants.SidecarContainerName); !strings.Contains(logs, "checkpoint saved") {
				return false, fmt.Errorf("%s: no save announced by its sidecar yet", x.pod.Name)
			}
			t.Logf("%s: status step %s, a save announced, over the pod's sockets", x.job, step)
			return true, nil
		})
		sidecarLogs, trainerLogs := c.PodLogs(t, ns, x.pod.Name, constants.SidecarContainerName), c.PodLogs(t, ns, x.pod.Name, trainer)
		want := fmt.Sprintf(`msg="in-memory checkpoints" .*addr=\S*:%d trainer=%s `, constants.PortsFrom(int32(x.base)).Checkpoint, regexp.QuoteMeta(constants.CheckpointSocket))
		if !regexp.MustCompile(want).MatchString(sidecarLogs) {
			t.Errorf("%s: the sidecar's checkpoints are not on the job's fifth port and the pod's socket (want %s)", x.pod.Name, want)
		}
		if !strings.Contains(trainerLogs, "checkpoints=memory") || strings.Contains(trainerLogs, "telling the sidecar") {
			t.Errorf("%s: the trainer did not load and save through its sidecar's socket:\n%s", x.pod.Name, trainerLogs[max(0, len(trainerLogs)-2000):])
		}
	}
	c.HelmUninstall(t, ns, "hostb", 2*time.Minute)
	uninstallJob(t, c, ns, "hosta")
}

// TestTaintedGPUNodes runs on the local cluster shaped like a managed GPU cluster: node2 tainted
// nvidia.com/gpu=present:NoSchedule and labelled nvidia.com/gpu.present=true (framework.ShapeAsGPUNode), and a default
// StorageClass whose provisioner makes disks that attach to one node (EBS's name; no provisioner runs: the chart
// refuses before any claim is made). `helm install` refuses a shared volume that class cannot give, with the fix,
// reading the class from the cluster. The ElasticDL-style job (examples/local/elasticdl-gpu.yaml: a top-level GPU
// toleration, a burst group with a spot toleration of its own) trains with both groups on the tainted node: the
// group's toleration is added to the top level's, not put in its place.
func TestTaintedGPUNodes(t *testing.T) {
	c, ns := startTest(t)
	if len(framework.ExtraNodes) == 0 {
		t.Fatal("needs a second node (EXTRA_NODES)")
	}
	gpuNode := framework.ExtraNodes[0]
	c.ShapeAsGPUNode(t, gpuNode)

	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "e2e-gp3",
		Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}}, Provisioner: "ebs.csi.aws.com"}
	if _, err := c.Client.StorageV1().StorageClasses().Create(t.Context(), sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.StorageV1().StorageClasses().Delete(context.Background(), sc.Name, metav1.DeleteOptions{})
	})
	const job = "edl"
	for mode, want := range map[string]string{
		"ReadWriteMany": "persistence.accessModes: ReadWriteMany from StorageClass e2e-gp3 (the cluster's default, provisioner ebs.csi.aws.com) stays Pending",
		"ReadWriteOnce": "persistence.accessModes: ReadWriteOnce from StorageClass e2e-gp3 (the cluster's default, provisioner ebs.csi.aws.com) attaches the data volume to one node",
	} {
		v := jobValues(t, c, "examples/local/elasticdl-gpu.yaml", trainScript)
		set(v, "persistence", map[string]any{"enabled": true, "accessModes": []any{mode}})
		err := c.HelmInstallError(t, ns, job, c.RepoPath(jobChart), v)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("helm install with a %s volume from the default class: %v, want an error saying %q", mode, err, want)
		}
	}

	v := jobValues(t, c, "examples/local/elasticdl-gpu.yaml", trainScript)
	installJob(t, c, ns, job, v)
	d := c.WaitWorld(t, ns, workersSelector(job), trainer, 2, 1, 3*time.Minute)
	t.Logf("core and burst training at world 2 on the tainted node %s: %.1fs", gpuNode, d.Seconds())
	pods, err := c.LivePods(t.Context(), ns, workersSelector(job))
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]bool{}
	for _, p := range pods {
		groups[p.Labels[constants.LabelGroup]] = true
		if p.Spec.NodeName != gpuNode {
			t.Errorf("pod %s (group %s) runs on %s, want the GPU node %s", p.Name, p.Labels[constants.LabelGroup], p.Spec.NodeName, gpuNode)
		}
		if p.Labels[constants.LabelGroup] == "burst" {
			var keys []string
			for _, tol := range p.Spec.Tolerations {
				keys = append(keys, tol.Key)
			}
			if !slices.Contains(keys, "nvidia.com/gpu") || !slices.Contains(keys, "example.com/spot") {
				t.Errorf("burst pod %s tolerates %v: want the top level's nvidia.com/gpu and the group's example.com/spot", p.Name, keys)
			}
		}
	}
	if !groups[constants.GroupWorker] || !groups["burst"] {
		t.Errorf("training pods of groups %v: want both the core (workers) and burst groups", groups)
	}
	uninstallJob(t, c, ns, job)
}

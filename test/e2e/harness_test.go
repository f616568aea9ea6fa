package e2e

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

func TestClusterIsUp(t *testing.T) {
	c := framework.Get(t)
	v, err := c.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	if !strings.HasPrefix(v.GitVersion, "v1.") || strings.Contains(v.GitVersion, "master") {
		t.Errorf("server version %q: want a release version (Helm checks kubeVersion against it)", v.GitVersion)
	}
	node, err := c.Client.CoreV1().Nodes().Get(t.Context(), framework.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	ready := false
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			ready = cond.Status == corev1.ConditionTrue
		}
	}
	if !ready {
		t.Errorf("node %s is not Ready: %+v", node.Name, node.Status.Conditions)
	}
	t.Logf("server %s, kubelet %s, container runtime %s", v.GitVersion, node.Status.NodeInfo.KubeletVersion, node.Status.NodeInfo.ContainerRuntimeVersion)
}

func busyboxPod(name, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](1), // busybox as PID 1 ignores SIGTERM
			Containers: []corev1.Container{{
				Name: "main", Image: framework.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"/bin/sh", "-c", script},
			}},
		},
	}
}

func create(t *testing.T, c *framework.Cluster, ns string, pod *corev1.Pod) {
	t.Helper()
	if _, err := c.Client.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
}

// Every pod of a StatefulSet behind a headless Service resolves every peer's stable DNS name to that
// peer's pod IP and reaches it over the pod network: what torchrun's master address and MPI hostfiles
// need.
func TestStatefulSetPeersResolveThroughHeadlessService(t *testing.T) {
	c := framework.Get(t)
	ns := c.Namespace(t)
	const replicas = 3
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "peers"},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone, PublishNotReadyAddresses: true,
			Selector: map[string]string{"app": "peers"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 8080}},
		},
	}
	if _, err := c.Client.CoreV1().Services(ns).Create(t.Context(), svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service: %v", err)
	}
	script := fmt.Sprintf(`mkdir -p /www && echo "i am $(hostname)" > /www/index.html && httpd -p 8080 -h /www
for i in $(seq 0 %d); do
  n=peers-$i.peers.$NS.svc.%s
  until ip=$(nslookup $n 2>/dev/null | awk '/^Address/ && !/[:#]53$/{print $NF}' | tail -1) && [ -n "$ip" ] &&
        body=$(timeout 3 wget -qO- http://$n:8080/); do sleep 0.2; done
  echo "peer $i $ip $body"
done
echo PEERS-DONE
exec sleep 1000000`, replicas-1, framework.ClusterDomain)
	pod := busyboxPod("peers", script).Spec
	pod.RestartPolicy = corev1.RestartPolicyAlways
	pod.Containers[0].Env = []corev1.EnvVar{{Name: "NS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "peers"},
		Spec: appsv1.StatefulSetSpec{
			ServiceName: "peers", Replicas: ptr.To[int32](replicas), PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "peers"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "peers"}}, Spec: pod},
		},
	}
	start := time.Now()
	if _, err := c.Client.AppsV1().StatefulSets(ns).Create(t.Context(), sts, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create statefulset: %v", err)
	}
	pods := c.WaitPodsReady(t, ns, "app=peers", replicas, 2*time.Minute)
	t.Logf("%d pods Ready in %.1fs", replicas, time.Since(start).Seconds())
	ips := map[string]string{}
	for _, p := range pods {
		ips[p.Name] = p.Status.PodIP
	}
	line := regexp.MustCompile(`(?m)^peer (\d+) (\S+) i am (\S+)$`)
	for _, p := range pods {
		log := c.WaitForLog(t, ns, p.Name, "", "PEERS-DONE", time.Minute)
		got := line.FindAllStringSubmatch(log, -1)
		if len(got) != replicas {
			t.Fatalf("pod %s: want %d peer lines, log:\n%s", p.Name, replicas, log)
		}
		for _, m := range got {
			peer := "peers-" + m[1]
			if m[2] != ips[peer] || m[3] != peer {
				t.Errorf("pod %s: %s resolved to %s and answered %q; want %s and %q", p.Name, peer, m[2], m[3], ips[peer], peer)
			}
		}
	}
	t.Logf("every pod resolved and reached every peer in %.1fs", time.Since(start).Seconds())
}

// `kubectl logs` goes apiserver -> kubelet (x509 client cert) -> containerd log files.
func TestKubectlLogs(t *testing.T) {
	c := framework.Get(t)
	ns := c.Namespace(t)
	create(t, c, ns, busyboxPod("talker", `echo "first line"; echo "marker-$(hostname)"`))
	c.WaitPodPhase(t, ns, "talker", corev1.PodSucceeded, time.Minute)
	out, err := c.Kubectl(t.Context(), "-n", ns, "logs", "talker")
	if err != nil {
		t.Fatal(err)
	}
	if want := "first line\nmarker-talker\n"; out != want {
		t.Errorf("kubectl logs = %q, want %q", out, want)
	}
}

// The node advertises fake accelerators through a device plugin: GPU pods schedule, get their devices
// allocated (an env var names the fake IDs), and a pod asking for more than the node has stays Pending.
func TestFakeGPUsSchedule(t *testing.T) {
	c := framework.Get(t)
	ns := c.Namespace(t)
	node, err := c.Client.CoreV1().Nodes().Get(t.Context(), framework.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	for _, r := range []corev1.ResourceName{framework.FakeGPUResource, framework.AMDGPUResource} {
		if q := node.Status.Allocatable[r]; q.Value() != framework.FakeGPUCount {
			t.Errorf("node allocatable %s = %s, want %d", r, q.String(), framework.FakeGPUCount)
		}
	}
	gpu := func(name string, n int64) *corev1.Pod {
		p := busyboxPod(name, `echo "devices=$ET_FAKE_DEVICES_NVIDIA_COM_GPU"`)
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{framework.FakeGPUResource: *resource.NewQuantity(n, resource.DecimalSI)}
		return p
	}
	create(t, c, ns, gpu("two-gpus", 2))
	create(t, c, ns, gpu("too-many", framework.FakeGPUCount+1))
	c.WaitPodPhase(t, ns, "two-gpus", corev1.PodSucceeded, time.Minute)
	log := c.PodLogs(t, ns, "two-gpus", "")
	if !regexp.MustCompile(`^devices=fake-\d+,fake-\d+\n$`).MatchString(log) {
		t.Errorf("two-gpus log = %q, want two fake device IDs", log)
	}
	c.WaitFor(t, time.Minute, "too-many to be unschedulable", func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "too-many", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
				if !strings.Contains(cond.Message, "Insufficient "+framework.FakeGPUResource) {
					return false, fmt.Errorf("unschedulable for another reason: %s", cond.Message)
				}
				return true, nil
			}
		}
		return false, fmt.Errorf("phase %s, conditions %+v", p.Status.Phase, p.Status.Conditions)
	})
}

// A test binary that was killed leaves its namespaces, and their pods keep the node's GPUs: the next run's
// MPI job then waits for GPUs forever (it happened in CI). SweepOrphans, which Main runs first, deletes
// every e2e namespace no running test owns, and only those.
func TestSweepOrphans(t *testing.T) {
	c := framework.Get(t)
	owned := c.Namespace(t)
	orphan := "e2e-orphan-" + strings.ToLower(rand.Text()[:6])
	if _, err := c.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: orphan, Labels: map[string]string{framework.LabelE2E: "true"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", orphan, err)
	}
	t.Cleanup(func() {
		_ = c.Client.CoreV1().Namespaces().Delete(context.Background(), orphan, metav1.DeleteOptions{})
	})
	c.WaitFor(t, time.Minute, "default ServiceAccount in "+orphan, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().ServiceAccounts(orphan).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
	hog := busyboxPod("gpu-hog", "sleep 3600")
	hog.Spec.Containers[0].Resources.Limits = corev1.ResourceList{framework.FakeGPUResource: *resource.NewQuantity(framework.FakeGPUCount, resource.DecimalSI)}
	create(t, c, orphan, hog)
	c.WaitPodPhase(t, orphan, hog.Name, corev1.PodRunning, time.Minute)

	swept, err := c.SweepOrphans(t.Context(), 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// An earlier test's namespace that is still terminating is swept (waited for) too; ours never is.
	if !slices.Contains(swept, orphan) || slices.Contains(swept, owned) {
		t.Errorf("swept %v, want %s in it and not %s", swept, orphan, owned)
	}
	if _, err := c.Client.CoreV1().Namespaces().Get(t.Context(), orphan, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("namespace %s after the sweep: err %v, want NotFound", orphan, err)
	}
	ns, err := c.Client.CoreV1().Namespaces().Get(t.Context(), owned, metav1.GetOptions{})
	if err != nil || ns.DeletionTimestamp != nil {
		t.Errorf("this test's own namespace %s was swept: err %v, deleting %v", owned, err, ns.DeletionTimestamp)
	}
	// The GPUs are free again: a pod that needs all of them runs.
	all := busyboxPod("all-gpus", "true")
	all.Spec.Containers[0].Resources.Limits = hog.Spec.Containers[0].Resources.Limits
	create(t, c, owned, all)
	c.WaitPodPhase(t, owned, all.Name, corev1.PodSucceeded, time.Minute)
}

// The reason for a device plugin rather than a patched Node status: a restarted kubelet drops extended
// resources it does not manage, while a plugin registers again and the node keeps advertising the GPUs.
func TestFakeGPUsSurviveKubeletRestart(t *testing.T) {
	c := framework.Get(t)
	pid, err := c.PID("kubelet")
	if err != nil {
		t.Fatalf("kubelet pid: %v", err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("stop kubelet %d: %v", pid, err)
	}
	c.WaitFor(t, 30*time.Second, "the old kubelet to exit", func(context.Context) (bool, error) {
		return syscall.Kill(pid, 0) != nil, nil
	})
	c.Up(t) // starts only the kubelet again, and waits for the node and its fake devices
	c.WaitFor(t, time.Minute, "allocatable GPUs after the kubelet restart", func(ctx context.Context) (bool, error) {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, framework.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if q := node.Status.Allocatable[framework.FakeGPUResource]; q.Value() != framework.FakeGPUCount {
			return false, fmt.Errorf("allocatable %s = %s", framework.FakeGPUResource, q.String())
		}
		return true, nil
	})
}

// ClusterIPs work from pods and from the host (kube-proxy DNAT), while a packet to a Service address that
// nothing rewrote fails on this machine at once ("host unreachable"), from the host and from a pod, and
// a pod's packet to an address off the machine is rejected too.
func TestClusterIPAndServiceCIDRGuard(t *testing.T) {
	c := framework.Get(t)
	ns := c.Namespace(t)
	web := busyboxPod("web", `mkdir -p /www && echo hello-from-web > /www/index.html && exec httpd -f -p 8080 -h /www`)
	web.Spec.Containers[0].ReadinessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
		PeriodSeconds: 1,
	}
	create(t, c, ns, web)
	svc, err := c.Client.CoreV1().Services(ns).Create(t.Context(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service: %v", err)
	}
	c.WaitPodsReady(t, ns, "app=web", 1, time.Minute)

	// From the host: kube-proxy programs the ClusterIP a moment after the pod is Ready.
	url := fmt.Sprintf("http://%s/", net.JoinHostPort(svc.Spec.ClusterIP, "80"))
	client := &http.Client{Timeout: 2 * time.Second}
	c.WaitFor(t, 30*time.Second, "ClusterIP "+svc.Spec.ClusterIP+" from the host", func(ctx context.Context) (bool, error) {
		resp, err := client.Get(url)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return err == nil && string(body) == "hello-from-web\n", err
	})

	// An address of the Service CIDR that no Service has: not rewritten by anyone.
	unused := "10.96.255.254"
	svcs, err := c.Client.CoreV1().Services("").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list services: %v", err)
	}
	for _, s := range svcs.Items {
		if s.Spec.ClusterIP == unused {
			t.Fatalf("service %s/%s has %s, the address this test needs unused", s.Namespace, s.Name, unused)
		}
	}
	start := time.Now()
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(unused, "80"), 5*time.Second)
	if err == nil {
		conn.Close()
		t.Fatalf("host connected to %s, which no Service has", unused)
	}
	// A packet that left would time out or, through an egress proxy, even connect; the guard refuses at once.
	if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
		t.Errorf("host dial %s: %v after %s; want ECONNREFUSED at once (the guard's reset)", unused, err, time.Since(start))
	}

	// From a pod: by name through CoreDNS and kube-proxy, then the unused address.
	create(t, c, ns, busyboxPod("client", fmt.Sprintf(`until out=$(timeout 3 wget -qO- http://web.$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace).svc.%s/); do sleep 0.2; done
echo "service: $out"
timeout 5 wget -qO- http://%s/ 2>&1; echo "unused: rc=$?"
timeout 5 wget -qO- http://203.0.113.1/ 2>&1; echo "outside: rc=$?"`, framework.ClusterDomain, unused)))
	c.WaitPodPhase(t, ns, "client", corev1.PodSucceeded, time.Minute)
	log := c.PodLogs(t, ns, "client", "")
	if !strings.Contains(log, "service: hello-from-web") {
		t.Errorf("pod could not reach the Service by name; log:\n%s", log)
	}
	// busybox wget prints the errno text; timeout(1) would give rc=143 instead.
	if !regexp.MustCompile(`(?i)(unreachable|no route).*\nunused: rc=1`).MatchString(log) {
		t.Errorf("pod -> %s: want a local 'host unreachable' failure; log:\n%s", unused, log)
	}
	// 203.0.113.1 (TEST-NET-3) stands for any address off the machine: the guard rejects pod egress.
	if !regexp.MustCompile(`(?i)(unreachable|no route).*\noutside: rc=1`).MatchString(log) {
		t.Errorf("pod -> 203.0.113.1: want a local 'unreachable' failure; log:\n%s", log)
	}

	out, err := exec.Command("ip", "route", "show", "type", "unreachable").CombinedOutput()
	if err != nil || !strings.Contains(string(out), framework.ServiceCIDR) {
		t.Errorf("ip route show type unreachable = %q (%v); want %s", out, err, framework.ServiceCIDR)
	}
}

// Each trainer image runs its own torch (no host mounts): the version the framework names, a tensor op, python-etcd
// and mpi4py importable, Open MPI and MPICH launchers and sshd present.
func TestTrainerImages(t *testing.T) {
	c := framework.Get(t)
	ns := c.Namespace(t)
	for i, img := range framework.TrainerImages {
		name := fmt.Sprintf("trainer-%d", i)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "main", Image: img.Image, ImagePullPolicy: corev1.PullNever,
					Command: []string{"/bin/sh", "-c", `set -e; command -v torchrun mpirun.openmpi mpiexec.hydra /usr/sbin/sshd ssh-keygen >/dev/null
python3 -c "import torch, etcd, mpi4py, socket; print('torch', torch.__version__.split('+')[0], torch.arange(4.).sum().item(), socket.gethostname())"`},
				}},
			},
		}
		create(t, c, ns, pod)
		c.WaitPodPhase(t, ns, name, corev1.PodSucceeded, 3*time.Minute)
		log := c.PodLogs(t, ns, name, "")
		if want := fmt.Sprintf("torch %s 6.0 %s\n", img.Torch, name); log != want {
			t.Errorf("%s: log = %q, want %q", img.Image, log, want)
		}
		t.Logf("%s: %s", img.Image, strings.TrimSpace(log))
	}
	// The image without python-etcd: torch and torchrun, and no etcd module.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer-no-etcd"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "main", Image: framework.StockTrainer.Image, ImagePullPolicy: corev1.PullNever,
				Command: []string{"/bin/sh", "-c", `set -e; command -v torchrun >/dev/null
python3 -c "import torch; print('torch', torch.__version__.split('+')[0])"
if python3 -c "import etcd" 2>/dev/null; then echo "python-etcd present"; else echo "no python-etcd"; fi`},
			}},
		},
	}
	create(t, c, ns, pod)
	c.WaitPodPhase(t, ns, pod.Name, corev1.PodSucceeded, 3*time.Minute)
	if log, want := c.PodLogs(t, ns, pod.Name, ""), fmt.Sprintf("torch %s\nno python-etcd\n", framework.StockTrainer.Torch); log != want {
		t.Errorf("%s: log = %q, want %q", framework.StockTrainer.Image, log, want)
	}
}

// The framework's Helm path: a real install with --wait, an upgrade that scales, helm test, uninstall.
func TestHelmInstallUpgradeTestUninstall(t *testing.T) {
	c := framework.Get(t)
	ns := c.Namespace(t)
	chart := filepath.Join("testdata", "sample-chart")
	start := time.Now()
	rel := c.HelmInstall(t, ns, "web", chart, map[string]any{"replicas": 2}, framework.Wait(2*time.Minute))
	t.Logf("helm install --wait: %s in %.1fs", rel.Info.Status, time.Since(start).Seconds())
	c.WaitPodsReady(t, ns, "app.kubernetes.io/instance=web", 2, time.Minute)

	rel = c.HelmUpgrade(t, ns, "web", chart, map[string]any{"replicas": 3}, framework.ReuseValues(), framework.Wait(2*time.Minute))
	if rel.Version != 2 {
		t.Errorf("release version after upgrade = %d, want 2", rel.Version)
	}
	c.WaitPodsReady(t, ns, "app.kubernetes.io/instance=web", 3, time.Minute)
	if got := c.HelmValues(t, ns, "web")["replicas"]; fmt.Sprint(got) != "3" {
		t.Errorf("values after upgrade: replicas = %v, want 3", got)
	}
	c.HelmTest(t, ns, "web", time.Minute)
	c.HelmUninstall(t, ns, "web", time.Minute)
	if _, err := c.Client.AppsV1().StatefulSets(ns).Get(t.Context(), "web", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("statefulset web after uninstall: err = %v, want NotFound", err)
	}

	t.Run("a release left installed is uninstalled at cleanup", func(t *testing.T) {
		c.HelmInstall(t, ns, "left", chart, map[string]any{"replicas": 1})
		if _, err := c.Client.AppsV1().StatefulSets(ns).Get(t.Context(), "left", metav1.GetOptions{}); err != nil {
			t.Fatalf("statefulset left after install: %v", err)
		}
	})
	if _, err := c.Client.AppsV1().StatefulSets(ns).Get(t.Context(), "left", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("statefulset left after the subtest's cleanup: err = %v, want NotFound", err)
	}
}

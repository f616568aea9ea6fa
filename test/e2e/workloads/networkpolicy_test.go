package workloads

import (
	"context"
	"fmt"
	"regexp"
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

// TestNetworkPolicyEnforced: the job chart's NetworkPolicy (networkPolicy.enabled, the default) is enforced on the
// local cluster (kube-router's policy controller, test/e2e/cluster/up.sh) as docs/sidecar.md's "Who may reach
// what" says. A 1-worker c10d job whose rendezvous is in a pod of its own, so that the worker reaches it from
// another pod: torch's agent forms its round through the policy, and the worker connects to the c10d store and
// etcd. A busybox pod of the same namespace outside the job cannot connect to either, while the same probe reaches
// the health port, where GET /healthz, /readyz and /rendezvous answer and a POST gets 405; the API server's service
// proxy reads /rendezvous too. Once the NetworkPolicy is deleted the outside pod connects to the store: the refusal
// was the policy's.
func TestNetworkPolicyEnforced(t *testing.T) {
	c, ns := startTest(t)
	const job = "fenced"
	v := jobValues(t, c, pytorchValues, trainScript)
	set(v, "workers.replicas", 1)
	set(v, "rendezvous.placement", "dedicated") // chart defaults otherwise: c10d, networkPolicy.enabled
	set(v, "args", []any{"--steps=100000", "--step-seconds=0.5"})
	start := time.Now()
	sel := installTraining(t, c, ns, job, v, 1)
	t.Logf("helm install -> the worker trains at world size 1 (its agent reached the rendezvous pod's store through the policy): %.1fs", time.Since(start).Seconds())

	rdzv := c.WaitPodsReady(t, ns, constants.LabelJob+"="+job+","+constants.LabelRdzvServer+"=true", 1, time.Minute)[0]
	workers, err := livePods(t.Context(), c, ns, sel)
	if err != nil || len(workers) != 1 {
		t.Fatalf("want 1 live worker: %d, %v", len(workers), err)
	}
	worker := workers[0]
	ip := rdzv.Status.PodIP
	policies, err := c.Client.NetworkingV1().NetworkPolicies(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil || len(policies.Items) != 1 {
		t.Fatalf("want the chart's one NetworkPolicy: %d, %v", len(policies.Items), err)
	}
	policy := policies.Items[0].Name
	t.Logf("rendezvous pod %s at %s, worker %s at %s, NetworkPolicy %s", rdzv.Name, ip, worker.Name, worker.Status.PodIP, policy)

	// Inside the job: the worker's trainer container connects to every port of the rendezvous pod.
	out, err := c.Kubectl(t.Context(), "-n", ns, "exec", worker.Name, "-c", trainer, "--", "python3", "-c", `import socket, sys, time
for port in sys.argv[2:]:
    t = time.monotonic()
    try:
        socket.create_connection((sys.argv[1], int(port)), 3).close()
        print(port, "connected in %.1f ms" % ((time.monotonic() - t) * 1000))
    except OSError as e:
        print(port, "failed after %.1f ms: %s" % ((time.monotonic() - t) * 1000, e))`,
		ip, strconv.Itoa(constants.C10dPort), strconv.Itoa(constants.RdzvClientPort), strconv.Itoa(constants.SidecarHealthPort))
	if err != nil {
		t.Fatalf("probe from the worker: %v", err)
	}
	t.Logf("from the job's worker %s to %s:\n%s", worker.Name, ip, strings.TrimSpace(out))
	for _, port := range []int{constants.C10dPort, constants.RdzvClientPort, constants.SidecarHealthPort} {
		if !regexp.MustCompile(`(?m)^` + strconv.Itoa(port) + ` connected`).MatchString(out) {
			t.Errorf("the job's own worker cannot connect to %s:%d", ip, port)
		}
	}

	// Outside the job: a busybox pod of the same namespace without the job's labels.
	outsider := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "outsider", Labels: map[string]string{"app": "outsider"}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "c", Image: framework.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sleep", "3600"}}},
		},
	}
	if _, err := c.Client.CoreV1().Pods(ns).Create(t.Context(), outsider, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.WaitPodsReady(t, ns, "app=outsider", 1, time.Minute)
	sh := func(ctx context.Context, script string) (string, error) {
		return c.Kubectl(ctx, "-n", ns, "exec", outsider.Name, "-c", "c", "--", "sh", "-c", script)
	}
	// connect is busybox nc, timed in the pod: it exits 0 once connected (-e true), 1 with the reason when refused
	// or after 3 s. It returns whether it connected, nc's words and how long it took.
	connect := func(ctx context.Context, port int) (bool, string, string, error) {
		out, err := sh(ctx, fmt.Sprintf("time nc -w 3 %s %d -e true 2>&1; echo rc=$?", ip, port))
		if err != nil {
			return false, out, "", err
		}
		took := "?"
		if m := realTime.FindStringSubmatch(out); m != nil {
			took = m[1] + "m" + m[2] + "s"
		}
		var words []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if strings.HasPrefix(l, "nc:") || strings.HasPrefix(l, "rc=") {
				words = append(words, l)
			}
		}
		return strings.HasSuffix(strings.TrimSpace(out), "rc=0"), strings.Join(words, "; "), took, nil
	}
	// The probe works: it reaches the health port, which the policy opens to anyone.
	ok, msg, took, err := connect(t.Context(), constants.SidecarHealthPort)
	if err != nil || !ok {
		t.Fatalf("outside pod -> %s:%d (the health port, open to anyone): %q %v", ip, constants.SidecarHealthPort, msg, err)
	}
	t.Logf("outside pod -> %s:%d: connected (%s, in %s)", ip, constants.SidecarHealthPort, msg, took)
	for _, port := range []int{constants.C10dPort, constants.RdzvClientPort} {
		ok, msg, took, err := connect(t.Context(), port)
		if err != nil {
			t.Fatal(err)
		}
		if ok || !regexp.MustCompile(`refused|timed out`).MatchString(msg) {
			t.Errorf("outside pod -> %s:%d: %q, want refused or timed out (the NetworkPolicy admits only the job's pods)", ip, port, msg)
			continue
		}
		t.Logf("outside pod -> %s:%d: denied (%s, in %s)", ip, port, msg, took)
	}

	// The health port from outside: read-only. busybox wget -S prints the status line (its -T crashes: timeout(1)).
	status := regexp.MustCompile(`HTTP/1\.[01] (\d{3})`)
	for _, r := range []struct {
		method, path string
		want         int
	}{{"GET", "/healthz", 200}, {"GET", "/readyz", 200}, {"GET", "/rendezvous", 200}, {"POST", "/healthz", 405}, {"POST", "/rendezvous", 405}} {
		post := ""
		if r.method == "POST" {
			post = "--post-data=x "
		}
		out, err := sh(t.Context(), fmt.Sprintf("timeout 8 wget -S -q -O- %shttp://%s:%d%s 2>&1; echo rc=$?", post, ip, constants.SidecarHealthPort, r.path))
		if err != nil {
			t.Fatal(err)
		}
		m := status.FindStringSubmatch(out)
		if m == nil || m[1] != strconv.Itoa(r.want) {
			t.Errorf("outside pod: %s %s on the health port: %q, want HTTP %d", r.method, r.path, out, r.want)
			continue
		}
		body := ""
		if r.path == "/rendezvous" && r.want == 200 {
			body = ": " + clip(jsonBody.FindString(out), 300)
		}
		t.Logf("outside pod: %s %s on %s:%d -> HTTP %s%s", r.method, r.path, ip, constants.SidecarHealthPort, m[1], body)
	}
	// The API server's service proxy (from the host, as `kubectl get --raw .../<job>-rdzv:health/proxy/rendezvous`).
	raw, err := c.Client.CoreV1().Services(ns).ProxyGet("http", naming.RendezvousService(job), "health", "/rendezvous", nil).DoRaw(t.Context())
	if err != nil {
		t.Fatalf("GET /rendezvous through the API server's service proxy: %v", err)
	}
	t.Logf("through the API server's service proxy: GET /rendezvous -> %s", clip(strings.TrimSpace(string(raw)), 300))

	// Without the policy, the same probe from the same pod connects: the refusal above was the policy engine's.
	if err := c.Client.NetworkingV1().NetworkPolicies(ns).Delete(t.Context(), policy, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	var last string
	c.WaitFor(t, 30*time.Second, fmt.Sprintf("the outside pod connecting to %s:%d once the NetworkPolicy is gone", ip, constants.C10dPort), func(ctx context.Context) (bool, error) {
		ok, msg, took, err := connect(ctx, constants.C10dPort)
		last = msg + ", in " + took
		if err != nil || !ok {
			return false, fmt.Errorf("%q %v", msg, err)
		}
		return true, nil
	})
	t.Logf("NetworkPolicy %s deleted: outside pod -> %s:%d connected after %.1fs (%s)", policy, ip, constants.C10dPort, time.Since(deleted).Seconds(), last)
	ok, msg, took, err = connect(t.Context(), constants.RdzvClientPort)
	if err != nil || !ok {
		t.Errorf("without the NetworkPolicy, outside pod -> %s:%d: %q %v, want connected", ip, constants.RdzvClientPort, msg, err)
	} else {
		t.Logf("NetworkPolicy %s deleted: outside pod -> %s:%d connected (%s, in %s)", policy, ip, constants.RdzvClientPort, msg, took)
	}
}

var (
	jsonBody = regexp.MustCompile(`(?s)\{.*\}`)
	realTime = regexp.MustCompile(`real\s+(\d+)m\s*([\d.]+)s`) // busybox time
)

// clip shortens s to n bytes for a log line.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

package workloads

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// startGates are the ways a native sidecar can hold the containers after it, as the webhook could render them
// (internal/mutate startHook): the startup probe every 1 s (the gate before), the postStart hook that waits for the
// same answer (the elastic-training backend's gate now), and none (the kubelet's floor: the next container starts once the
// sidecar runs, before it answers).
var startGates = []string{"startup probe", "postStart hook", "none"}

// BenchmarkSidecarStartGate measures, on the real kubelet, how long after a native sidecar starts the pod's next
// container starts, for each of startGates, in one run: busybox pods whose sidecar serves HTTP 0.1 s after it starts
// (as rdzv-sidecar answers /startz) and whose main container prints the time it started; both read the same clock
// (/proc/uptime). BENCH_START_GATE_PODS pods of each (default 8), the gates alternating so that the machine's noise
// hits them alike. Run it with `make bench-e2e`.
func BenchmarkSidecarStartGate(b *testing.B) {
	pods := 8
	if s := os.Getenv("BENCH_START_GATE_PODS"); s != "" {
		fmt.Sscan(s, &pods)
	}
	c := framework.Get(b)
	ns := c.Namespace(b)
	got := make([][]time.Duration, len(startGates))
	for i := 0; i < b.N*pods; i++ {
		for g, gate := range startGates {
			name := fmt.Sprintf("gate-%d-%d", g, i)
			if _, err := c.Client.CoreV1().Pods(ns).Create(b.Context(), startGatePod(name, gate), metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			c.WaitPodPhase(b, ns, name, corev1.PodSucceeded, time.Minute)
			side, main := uptime(b, c.PodLogs(b, ns, name, "sidecar")), uptime(b, c.PodLogs(b, ns, name, "main"))
			got[g] = append(got[g], main-side)
			if err := c.Client.CoreV1().Pods(ns).Delete(b.Context(), name, metav1.DeleteOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	fmt.Printf("\nthe next container's start after its native sidecar's (seconds, median of %d pods each; kubelet of the local cluster)\n", len(got[0]))
	for g, gate := range startGates {
		fmt.Printf("%-16s %6.2f  (%s)\n", gate, testenv.Median(got[g]).Seconds(), durations(got[g]))
	}
	ratio := testenv.Median(got[1]).Seconds() / testenv.Median(got[0]).Seconds()
	fmt.Printf("postStart hook / startup probe: %.2f\n", ratio)
	b.ReportMetric(ratio, "hook/probe")
}

// startGatePod is one pod of BenchmarkSidecarStartGate.
func startGatePod(name, gate string) *corev1.Pod {
	const port = 8080
	get := fmt.Sprintf("wget -q -O /dev/null http://127.0.0.1:%d/", port)
	side := corev1.Container{Name: "sidecar", Image: framework.BusyboxImage, ImagePullPolicy: corev1.PullNever,
		RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		Command: []string{"sh", "-c", fmt.Sprintf("cut -d' ' -f1 /proc/uptime; mkdir -p /tmp/www; echo ok > /tmp/www/index.html; "+
			"sleep 0.1; exec httpd -f -p %d -h /tmp/www", port)}}
	switch gate {
	case "startup probe":
		side.StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(port)}},
			PeriodSeconds: 1, FailureThreshold: 600}
	case "postStart hook":
		side.Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{
			Command: []string{"sh", "-c", "until " + get + "; do sleep 0.02; done"}}}}
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr.To(int64(1)),
		InitContainers: []corev1.Container{side},
		Containers: []corev1.Container{{Name: "main", Image: framework.BusyboxImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"sh", "-c", "cut -d' ' -f1 /proc/uptime"}}},
	}}
}

// uptime reads the first line of a log as the seconds of /proc/uptime.
func uptime(b *testing.B, log string) time.Duration {
	b.Helper()
	line, _, _ := strings.Cut(log, "\n")
	s, err := strconv.ParseFloat(strings.TrimSpace(line), 64)
	if err != nil {
		b.Fatalf("not /proc/uptime: %q", log)
	}
	return time.Duration(s * float64(time.Second))
}

// durations lists each in seconds.
func durations(d []time.Duration) string {
	s := make([]string, len(d))
	for i, x := range d {
		s[i] = fmt.Sprintf("%.2f", x.Seconds())
	}
	return strings.Join(s, " ")
}

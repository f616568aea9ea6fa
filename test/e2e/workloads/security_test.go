package workloads

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// TestRendezvousRedirectedOutsideTheJob: someone who may write the rendezvous Service's EndpointSlice (here the
// cluster admin; with the chart's defaults no pod but the job's own may: TestInstallFromRegistry) points it, again
// and again, at a store of their own in the job's namespace: a real rdzv-sidecar serve, outside the job. A worker
// that joins meanwhile registers with that store, but its sidecar refuses to carry its agent's connections there
// (the store names no pod of the job): the store never sees a byte of c10d, the sidecar says so, and the job trains
// on at its size. Once the redirection stops, the new worker joins the elastic-training backend and the job trains at
// the new size.
func TestRendezvousRedirectedOutsideTheJob(t *testing.T) {
	c, ns := startTest(t)
	const job = "redirected"
	v := jobValues(t, c, pytorchValues, trainScript)
	set(v, "args", []any{"--steps=100000", "--step-seconds=0.5"})
	sel := installTraining(t, c, ns, job, v, 2)

	// The store of someone else: no job label, so no NetworkPolicy of the job applies to it.
	fake := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "someone-elses-store", Labels: map[string]string{"app": "someone-elses-store"}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "serve", Image: framework.SidecarImage, ImagePullPolicy: corev1.PullNever,
				Args: []string{"serve", "--data-dir=/tmp/data", "--listen-client-urls=http://0.0.0.0:2379",
					"--advertise-client-urls=http://someone-elses-store:2379", "--health-addr=:2381", "--c10d-addr=:29400",
					"--member-host=someone-elses-store." + ns + ".svc." + framework.ClusterDomain, "--register=false"},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromInt32(2381)}}, PeriodSeconds: 1},
			}},
		},
	}
	if _, err := c.Client.CoreV1().Pods(ns).Create(t.Context(), fake, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var fakeIP string
	c.WaitFor(t, 2*time.Minute, "the other store to serve", func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, fake.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		fakeIP = p.Status.PodIP
		for _, s := range p.Status.ContainerStatuses {
			if s.Ready {
				return true, nil
			}
		}
		return false, fmt.Errorf("not ready: %s", p.Status.Phase)
	})

	// Point the rendezvous Service there every 300 ms (the holder points it back every few seconds).
	rdzv := naming.RendezvousService(job)
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			s, err := c.Client.DiscoveryV1().EndpointSlices(ns).Get(ctx, rdzv, metav1.GetOptions{})
			if err == nil && (len(s.Endpoints) != 1 || len(s.Endpoints[0].Addresses) != 1 || s.Endpoints[0].Addresses[0] != fakeIP) {
				s.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{fakeIP}}}
				c.Client.DiscoveryV1().EndpointSlices(ns).Update(ctx, s, metav1.UpdateOptions{}) //nolint:errcheck // again in 300 ms
			}
			select {
			case <-ctx.Done():
			case <-time.After(300 * time.Millisecond):
			}
		}
	})
	defer func() { stop(); wg.Wait() }()
	time.Sleep(2 * time.Second) // kube-proxy follows the slice within about a second

	scaleWorkers(t, c, ns, job, 3)
	var newPod string
	c.WaitFor(t, 3*time.Minute, "the new worker's sidecar to refuse the other store", func(ctx context.Context) (bool, error) {
		pods, err := c.LivePods(ctx, ns, sel)
		if err != nil {
			return false, err
		}
		for _, p := range pods {
			if framework.PodIndex(p) != 2 {
				continue
			}
			newPod = p.Name
			logs, err := c.TailLogs(ctx, ns, p.Name, constants.SidecarContainerName, 200)
			if err != nil {
				return false, err
			}
			if strings.Contains(logs, "the job's store is a pod of this job") {
				// The Service pointed at the job's own store when this sidecar looked (the holder points it back
				// every few seconds): the redirection missed this worker. Its replacement, same index, looks again.
				t.Logf("%s's sidecar reached the job's own store: the redirection missed it; deleting the pod for another try", p.Name)
				if err := c.Client.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
					return false, err
				}
				return false, fmt.Errorf("%s missed the redirection", p.Name)
			}
			if strings.Contains(logs, "refusing to carry the trainer's store connections") {
				line, _, _ := strings.Cut(logs[strings.Index(logs, "refusing"):], "\n")
				t.Logf("%s's sidecar: ...%s", p.Name, line)
				return true, nil
			}
			return false, fmt.Errorf("%s's sidecar has not refused yet:\n%s", p.Name, logs)
		}
		return false, fmt.Errorf("no worker 2 running yet")
	})
	// Meanwhile the job trains on at its size, on its own store.
	c.WaitWorld(t, ns, sel+",batch.kubernetes.io/job-completion-index in (0,1)", trainer, 2, 1, time.Minute)
	received, err := c.Kubectl(t.Context(), "get", "--raw", fmt.Sprintf("/api/v1/namespaces/%s/pods/%s:2381/proxy/metrics", ns, fake.Name))
	if err != nil {
		t.Fatal(err)
	}
	const sample = "\nelastic_training_sidecar_tcpstore_received_bytes_total "
	if got := lineWith(received, sample[1:]); !strings.Contains(received, sample+"0\n") {
		t.Errorf("the other store received c10d bytes from the job's agents: %q", got)
	}

	// The redirection stops, the other store goes: the new worker finds the job's own store and trains with it.
	stop()
	wg.Wait()
	if err := c.Client.CoreV1().Pods(ns).Delete(t.Context(), fake.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	c.WaitWorld(t, ns, sel, trainer, 3, 1, 4*time.Minute)
	t.Logf("after the redirection ended, %s joined the elastic-training backend", newPod)
	uninstallJob(t, c, ns, job)
}

// lineWith is the first line of text that starts with s ("" when none).
func lineWith(text, s string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, s) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

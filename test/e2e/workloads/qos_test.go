package workloads

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// TestGuaranteedPods: an elastic PyTorch job whose trainers' CPU and memory limits equal their requests trains,
// and Kubernetes gives every one of its pods the Guaranteed QoS class (status.qosClass), the webhook's sidecar
// included (static CPU manager and single-numa-node topology manager nodes pin only those).
func TestGuaranteedPods(t *testing.T) {
	c, ns := startTest(t)
	const job = "guaranteed"
	v := jobValues(t, c, pytorchValues, trainScript)
	set(v, "workers.replicas", 2)
	set(v, "resources", map[string]any{"requests": map[string]any{"cpu": "250m", "memory": "1536Mi"}, "limits": map[string]any{"cpu": "250m", "memory": "1536Mi"}})
	// The join sidecar carries the agent's store connections: a Guaranteed job gives it more than the default 10m.
	set(v, "rendezvous.sidecarResources", map[string]any{"join": map[string]any{"requests": map[string]any{"cpu": "50m", "memory": "64Mi"}, "limits": map[string]any{"cpu": "50m", "memory": "64Mi"}}})
	installTraining(t, c, ns, job, v, 2)
	pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: constants.LabelJob + "=" + job})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) < 2 {
		t.Fatalf("%d pods", len(pods.Items))
	}
	for _, p := range pods.Items {
		if p.Status.QOSClass != corev1.PodQOSGuaranteed {
			t.Errorf("pod %s is %s, want Guaranteed: %+v", p.Name, p.Status.QOSClass, containerResources(p))
		}
	}
	t.Logf("%d pods, every one Guaranteed, training at world size 2", len(pods.Items))
}

func containerResources(p corev1.Pod) map[string]corev1.ResourceRequirements {
	out := map[string]corev1.ResourceRequirements{}
	for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		out[c.Name] = c.Resources
	}
	return out
}

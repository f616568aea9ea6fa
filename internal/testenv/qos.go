package testenv

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// QOSClass is the QoS class Kubernetes gives pod (https://kubernetes.io/docs/concepts/workloads/pods/pod-qos/):
// Guaranteed when every container, init and sidecar containers included, has CPU and memory limits equal to its
// requests (a request missing defaults to its limit); BestEffort when none has a CPU or memory request or limit;
// Burstable otherwise. k8s.io/api has no helper, and the kubelet's is in k8s.io/kubernetes.
func QOSClass(pod *corev1.Pod) corev1.PodQOSClass {
	guaranteed, some := true, false
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			lim, hasLim := c.Resources.Limits[name]
			req, hasReq := c.Resources.Requests[name]
			if !hasReq && hasLim {
				req, hasReq = lim, true // the API server's default
			}
			some = some || hasReq || hasLim
			if !hasLim || req.Cmp(lim) != 0 {
				guaranteed = false
			}
		}
	}
	switch {
	case !some:
		return corev1.PodQOSBestEffort
	case guaranteed:
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

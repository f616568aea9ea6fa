package mutate

import (
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
)

// TestPatchRefusesOtherChanges: Patch describes only what Mutate does (it
// adds); any other change to the pod is an error naming where, not a patch
// that would leave the API server's pod different from the mutated one.
func TestPatchRefusesOtherChanges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(p *corev1.Pod)
		err    string
	}{
		{"a container removed", func(p *corev1.Pod) { p.Spec.Containers = p.Spec.Containers[:0] }, "spec.containers: 0 containers, there were 1"},
		{"a container renamed", func(p *corev1.Pod) { p.Spec.Containers[0].Name = "other" }, `spec.containers[0] is "other", it was "trainer"`},
		{"an env var removed", func(p *corev1.Pod) { p.Spec.Containers[0].Env = p.Spec.Containers[0].Env[:0] }, "/spec/containers/0/env: 0 elements, there were 1"},
		{"a volume removed", func(p *corev1.Pod) { p.Spec.Volumes = nil }, "/spec/volumes: 0 elements, there were 1"},
		{"the hostname cleared", func(p *corev1.Pod) { p.Spec.Hostname = "" }, "/spec/hostname was removed"},
		{"the preStop hook removed", func(p *corev1.Pod) { p.Spec.Containers[0].Lifecycle.PreStop = nil }, "/spec/containers/0: the lifecycle hook was removed"},
		{"an init container dropped", func(p *corev1.Pod) { p.Spec.InitContainers = nil }, "/spec/initContainers: [] is not the sidecar in front of [fetch]"},
		{"the sidecar behind", func(p *corev1.Pod) {
			p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: "rdzv-sidecar"})
		}, "/spec/initContainers: [fetch rdzv-sidecar] is not the sidecar in front of [fetch]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{
				Hostname:       "w-0",
				Volumes:        []corev1.Volume{{Name: "data"}},
				InitContainers: []corev1.Container{{Name: "fetch"}},
				Containers: []corev1.Container{{Name: "trainer", Env: []corev1.EnvVar{{Name: "A", Value: "1"}},
					Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{}}}},
			}}
			before := Record(pod)
			tc.change(pod)
			patch, err := before.Patch(pod)
			require.ErrorContains(t, err, tc.err)
			require.Nil(t, patch)
		})
	}
}

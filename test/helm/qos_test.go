package helm_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/mutate"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// A job whose trainers' CPU and memory limits equal their requests is Guaranteed in every pod the chart renders,
// once the webhook has injected its sidecar (static CPU manager and single-numa-node topology manager nodes give
// exclusive CPUs and aligned GPUs to Guaranteed pods only): the sidecar, MPI's ssh-setup and the helm test pod are
// shaped to match; the dedicated rendezvous pod by rendezvous.resources. A Burstable trainer leaves the pods
// Burstable, as before.
func TestGuaranteedJob(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	guaranteed := map[string]any{"requests": map[string]any{"cpu": "8", "memory": "32Gi"}, "limits": map[string]any{"cpu": "8", "memory": "32Gi"}}
	rdzv := map[string]any{"requests": map[string]any{"cpu": "200m", "memory": "256Mi"}, "limits": map[string]any{"cpu": "200m", "memory": "256Mi"}}
	jobs := map[string]map[string]any{
		"pytorch, core and burst, dedicated rendezvous pod": {"command": []any{"torchrun", "train.py"},
			"workers":      map[string]any{"replicas": 2, "gpus": 8},
			"workerGroups": map[string]any{"burst": map[string]any{"replicas": 1, "minReplicas": 0, "preemptible": true, "gpus": 8}},
			"rendezvous": map[string]any{"resources": rdzv,
				"sidecarResources": map[string]any{"join": map[string]any{"requests": map[string]any{"cpu": "250m", "memory": "128Mi"}}}}},
		"pytorch, worker 0 serves": {"command": []any{"torchrun", "train.py"}, "workers": map[string]any{"replicas": 3, "gpus": 8}},
		"mpi": {"framework": "mpi", "mpi": map[string]any{"launcher": map[string]any{"command": []any{"mpirun", "python3", "train.py"}}},
			"workers": map[string]any{"replicas": 2, "gpus": 8}},
		"mxnet": {"framework": "mxnet", "command": []any{"python3", "train.py"}, "workers": map[string]any{"replicas": 2}},
	}
	for name, vals := range jobs {
		for _, want := range []corev1.PodQOSClass{corev1.PodQOSGuaranteed, corev1.PodQOSBurstable} {
			t.Run(name+"/"+string(want), func(t *testing.T) {
				res := guaranteed
				if want == corev1.PodQOSBurstable {
					res = map[string]any{"requests": map[string]any{"cpu": "8", "memory": "32Gi"}}
				}
				r, err := render(ch, merge(merge(pinned(t), vals), map[string]any{"resources": res}), chartrender.Options{})
				require.NoError(t, err)
				seen := 0
				for _, o := range r.Objects {
					if o.Kind == "Pod" { // the helm test pod, which the webhook does not touch
						require.Equal(t, corev1.PodQOSGuaranteed, testenv.QOSClass(decode[corev1.Pod](t, o)), o.Key())
						continue
					}
					if o.Kind != "Job" && o.Kind != "StatefulSet" && o.Kind != "Deployment" {
						continue
					}
					for _, serve := range []bool{true, false} {
						pod := servingPod(t, o)
						if !serve {
							delete(pod.Annotations, constants.AnnotationRdzvHost)
						}
						cfg := mutate.DefaultConfig()
						cfg.SidecarImage = "example.com/rdzv-sidecar:qos"
						out, err := mutate.Mutate(mutate.Input{Pod: pod, Namespace: namespace, Config: cfg})
						require.NoError(t, err, o.Key())
						got := testenv.QOSClass(out.Pod)
						if roleOf(o) == constants.RoleRdzv {
							require.Equal(t, corev1.PodQOSGuaranteed, got, "%s: rendezvous.resources decide", o.Key())
							continue
						}
						require.Equal(t, want, got, "%s (serving %v)", o.Key(), serve)
						seen++
					}
				}
				require.NotZero(t, seen)
			})
		}
	}
}

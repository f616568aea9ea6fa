package helm_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// A group's pod settings merge with the top level's (README "Pod settings"): lists appended (a variable, volume or
// mount of the same name or path replaced, equal entries kept once), maps merged with the group winning key by key
// all the way down, a key set to null dropped; notInherited starts a setting from the group's value alone. The
// ElasticDL render that found it: the burst group's spot toleration dropped the top-level GPU toleration, and on a
// GPU-tainted node the burst pods stayed Pending.
func TestGroupMerge(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	gpu := map[string]any{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
	spot := map[string]any{"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
	top := map[string]any{
		"command":            []any{"python3", "train.py"},
		"tolerations":        []any{gpu},
		"imagePullSecrets":   []any{map[string]any{"name": "registry"}},
		"nodeSelector":       map[string]any{"cloud.google.com/gke-accelerator": "nvidia-h100-80gb", "pool": "training"},
		"env":                []any{map[string]any{"name": "NCCL_DEBUG", "value": "WARN"}, map[string]any{"name": "TEAM", "value": "ml"}},
		"volumes":            []any{map[string]any{"name": "cache", "emptyDir": map[string]any{}}},
		"volumeMounts":       []any{map[string]any{"name": "cache", "mountPath": "/cache"}},
		"podSecurityContext": map[string]any{"runAsNonRoot": true, "runAsUser": 1000, "fsGroup": 1000},
		"affinity": map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
			"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{"key": "zone", "operator": "In", "values": []any{"a"}}}}}}}},
	}
	burst := map[string]any{"replicas": 1, "minReplicas": 0, "maxReplicas": 4, "preemptible": true,
		"tolerations":        []any{spot, gpu},
		"imagePullSecrets":   []any{map[string]any{"name": "registry"}, map[string]any{"name": "spot-mirror"}},
		"nodeSelector":       map[string]any{"cloud.google.com/gke-spot": "true", "pool": nil},
		"env":                []any{map[string]any{"name": "NCCL_DEBUG", "value": "INFO"}},
		"volumes":            []any{map[string]any{"name": "cache", "hostPath": map[string]any{"path": "/mnt/cache"}}},
		"podSecurityContext": map[string]any{"runAsNonRoot": false, "runAsUser": 0},
		"affinity": map[string]any{"podAntiAffinity": map[string]any{"preferredDuringSchedulingIgnoredDuringExecution": []any{map[string]any{
			"weight": 1, "podAffinityTerm": map[string]any{"topologyKey": "kubernetes.io/hostname"}}}}},
	}
	spec := func(t *testing.T, vals map[string]any, group string) corev1.PodSpec {
		t.Helper()
		r, err := render(ch, merge(pinned(t), vals), chartrender.Options{})
		require.NoError(t, err)
		for key, s := range podSpecs(t, r) {
			if s.Labels["elastic-training.io/group"] == group {
				return s.Spec
			}
			_ = key
		}
		t.Fatalf("no pod of group %s", group)
		return corev1.PodSpec{}
	}
	vals := merge(top, map[string]any{"workerGroups": map[string]any{"burst": burst}})
	sec := func(n int64) *int64 { return &n }
	yes, no := true, false

	t.Run("a group that sets nothing takes the top level", func(t *testing.T) {
		s := spec(t, vals, "worker")
		require.Equal(t, []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: "Exists", Effect: "NoSchedule"}}, s.Tolerations[:1])
		require.Equal(t, map[string]string{"cloud.google.com/gke-accelerator": "nvidia-h100-80gb", "pool": "training"}, s.NodeSelector)
		require.Equal(t, &corev1.PodSecurityContext{RunAsNonRoot: &yes, RunAsUser: sec(1000), FSGroup: sec(1000)}, s.SecurityContext)
	})
	t.Run("lists appended, maps merged", func(t *testing.T) {
		s := spec(t, vals, "burst")
		require.Equal(t, []corev1.Toleration{
			{Key: "nvidia.com/gpu", Operator: "Exists", Effect: "NoSchedule"}, // the top level's, kept once
			{Key: "cloud.google.com/gke-spot", Operator: "Equal", Value: "true", Effect: "NoSchedule"},
		}, s.Tolerations[:2])
		require.Len(t, s.Tolerations, 4, "and the two node-loss tolerations")
		require.Equal(t, []corev1.LocalObjectReference{{Name: "registry"}, {Name: "spot-mirror"}}, s.ImagePullSecrets)
		require.Equal(t, map[string]string{"cloud.google.com/gke-accelerator": "nvidia-h100-80gb", "cloud.google.com/gke-spot": "true"},
			s.NodeSelector, "pool set to null by the group: dropped")
		require.Equal(t, &corev1.PodSecurityContext{RunAsNonRoot: &no, RunAsUser: sec(0), FSGroup: sec(1000)}, s.SecurityContext,
			"false and 0 win over the top level's too")
		require.NotNil(t, s.Affinity.NodeAffinity, "the top level's node affinity")
		require.NotNil(t, s.Affinity.PodAntiAffinity, "and the group's anti-affinity")
		trainer := s.Containers[0]
		var env []corev1.EnvVar
		for _, e := range trainer.Env {
			if e.Name == "NCCL_DEBUG" || e.Name == "TEAM" {
				env = append(env, e)
			}
		}
		require.Equal(t, []corev1.EnvVar{{Name: "TEAM", Value: "ml"}, {Name: "NCCL_DEBUG", Value: "INFO"}}, env, "the group's NCCL_DEBUG replaces the top level's")
		var cache []corev1.Volume
		for _, v := range s.Volumes {
			if v.Name == "cache" {
				cache = append(cache, v)
			}
		}
		require.Len(t, cache, 1)
		require.NotNil(t, cache[0].HostPath, "the group's volume of the same name replaces the top level's")
		require.Contains(t, trainer.VolumeMounts, corev1.VolumeMount{Name: "cache", MountPath: "/cache"})
	})
	t.Run("notInherited", func(t *testing.T) {
		v := merge(vals, map[string]any{"workerGroups": map[string]any{"burst": merge(burst, map[string]any{
			"notInherited": []any{"tolerations", "nodeSelector"}, "tolerations": []any{spot}})}})
		s := spec(t, v, "burst")
		require.Equal(t, []corev1.Toleration{{Key: "cloud.google.com/gke-spot", Operator: "Equal", Value: "true", Effect: "NoSchedule"}}, s.Tolerations[:1])
		require.Len(t, s.Tolerations, 3, "the group's own and the two node-loss tolerations")
		require.Equal(t, map[string]string{"cloud.google.com/gke-spot": "true"}, s.NodeSelector)
	})
	t.Run("notInherited names a pod setting", func(t *testing.T) {
		v := merge(vals, map[string]any{"workerGroups": map[string]any{"burst": merge(burst, map[string]any{"notInherited": []any{"image"}})}})
		_, err := render(ch, merge(pinned(t), v), chartrender.Options{})
		require.ErrorContains(t, err, "notInherited")
	})
}

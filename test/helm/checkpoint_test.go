package helm_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chart"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/mutate"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// checkpoint.memory as a user sets it, through the chart and the webhook: each PyTorch worker pod gets the
// memory-backed volume of that size, mounted in the trainer and the sidecar, the trainer the two variables
// elastic_training.checkpoint reads, the sidecar its flags and a memory limit larger by the volume (its copies are
// charged to it), and a Guaranteed trainer's pod stays Guaranteed. Without the value nothing of it is there.
func TestCheckpointMemory(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	guaranteed := map[string]any{"requests": map[string]any{"cpu": "8", "memory": "32Gi"}, "limits": map[string]any{"cpu": "8", "memory": "32Gi"}}
	for _, on := range []bool{true, false} {
		vals := map[string]any{"command": []any{"torchrun", "train.py"}, "workers": map[string]any{"replicas": 2}, "resources": guaranteed}
		if on {
			vals["checkpoint"] = map[string]any{"memory": "2Gi"}
		}
		pod := renderedServingPod(t, ch, vals)
		cfg := mutate.DefaultConfig()
		cfg.SidecarImage = "example.com/rdzv-sidecar:ckpt"
		out, err := mutate.Mutate(mutate.Input{Pod: pod, Namespace: namespace, Config: cfg})
		require.NoError(t, err)
		p := out.Pod
		var trainer, sidecar corev1.Container
		for _, c := range p.Spec.Containers {
			if c.Name != constants.SidecarContainerName {
				trainer = c
			}
		}
		for _, c := range p.Spec.InitContainers {
			if c.Name == constants.SidecarContainerName {
				sidecar = c
			}
		}
		env := map[string]string{}
		for _, e := range trainer.Env {
			env[e.Name] = e.Value
		}
		if !on {
			assert.NotContains(t, env, constants.EnvCheckpointDir)
			assert.NotContains(t, sidecar.Args, "--checkpoint-dir="+constants.CheckpointSavesDir)
			continue
		}
		var vol *corev1.Volume
		for i := range p.Spec.Volumes {
			if p.Spec.Volumes[i].Name == constants.CheckpointVolumeName {
				vol = &p.Spec.Volumes[i]
			}
		}
		require.NotNil(t, vol, "the chart renders the checkpoint volume")
		require.NotNil(t, vol.EmptyDir)
		assert.Equal(t, corev1.StorageMediumMemory, vol.EmptyDir.Medium)
		assert.Equal(t, "2Gi", vol.EmptyDir.SizeLimit.String())
		assert.Equal(t, constants.CheckpointSavesDir, env[constants.EnvCheckpointDir])
		assert.Equal(t, "http://127.0.0.1:2382", env[constants.EnvCheckpointURL])
		assert.Contains(t, sidecar.Args, "--checkpoint-dir="+constants.CheckpointSavesDir)
		assert.Contains(t, sidecar.Args, "--checkpoint-memory=2147483648")
		for _, c := range []corev1.Container{trainer, sidecar} {
			assert.Contains(t, c.VolumeMounts, corev1.VolumeMount{Name: constants.CheckpointVolumeName, MountPath: constants.CheckpointDir}, c.Name)
		}
		def := mutate.DefaultConfig().Defaults.SidecarResources.Serve.Limits[corev1.ResourceMemory]
		want := def.DeepCopy()
		want.Add(resource.MustParse("2Gi"))
		got := sidecar.Resources.Limits[corev1.ResourceMemory]
		assert.Zero(t, want.Cmp(got), "the sidecar's memory limit: %s, want %s (the default %s and the volume)", got.String(), want.String(), def.String())
		assert.Equal(t, corev1.PodQOSGuaranteed, testenv.QOSClass(p), "a Guaranteed trainer's pod stays Guaranteed")
	}
}

// renderedServingPod is the serving pod of the workers' Job (or StatefulSet) that the chart renders with vals over
// the pinned values, as its controller creates it.
func renderedServingPod(t *testing.T, ch *chart.Chart, vals map[string]any) *corev1.Pod {
	t.Helper()
	r, err := render(ch, merge(pinned(t), vals), chartrender.Options{})
	require.NoError(t, err)
	var o *chartrender.Object
	for i := range r.Objects {
		if r.Objects[i].Kind == "Job" || r.Objects[i].Kind == "StatefulSet" {
			o = &r.Objects[i]
		}
	}
	require.NotNil(t, o, "no workers' Job")
	return servingPod(t, *o)
}

// checkpoint.persistEvery with persistence.enabled, through the chart and the webhook: the trainer of each worker pod
// gets the job's directory on the volume and how often to copy there; without the volume, or at 0, nothing.
func TestCheckpointPersistEvery(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	for _, tc := range []struct {
		name             string
		persistence      bool
		every            any
		dir              string // checkpoint.persistDir, on a volume of the user's mounted at /mnt/nfs
		wantDir, wantEvy string
	}{
		{"the default with a volume", true, nil, "", "/data/elastic-training/" + release, "100"},
		{"every 7 steps", true, 7, "", "/data/elastic-training/" + release, "7"},
		{"never", true, 0, "", "", ""},
		{"no volume", false, nil, "", "", ""},
		{"a volume of the user's", false, 20, "/mnt/nfs/ckpt", "/mnt/nfs/ckpt", "20"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ckpt := map[string]any{"memory": "1Gi"}
			if tc.every != nil {
				ckpt["persistEvery"] = tc.every
			}
			vals := map[string]any{"command": []any{"torchrun", "train.py"}, "checkpoint": ckpt}
			if tc.dir != "" {
				ckpt["persistDir"] = tc.dir
				vals["volumes"] = []any{map[string]any{"name": "nfs", "nfs": map[string]any{"server": "nfs.example.com", "path": "/export"}}}
				vals["volumeMounts"] = []any{map[string]any{"name": "nfs", "mountPath": "/mnt/nfs"}}
			}
			if tc.persistence {
				vals["persistence"] = map[string]any{"enabled": true, "checkStorageClass": false}
			}
			pod := renderedServingPod(t, ch, vals)
			require.Equal(t, tc.wantDir, pod.Annotations[constants.AnnotationCheckpointPersist])
			cfg := mutate.DefaultConfig()
			cfg.SidecarImage = "example.com/rdzv-sidecar:ckpt"
			out, err := mutate.Mutate(mutate.Input{Pod: pod, Namespace: namespace, Config: cfg})
			require.NoError(t, err, "the webhook admits what the chart renders")
			env := map[string]string{}
			for _, c := range out.Pod.Spec.Containers {
				for _, e := range c.Env {
					env[e.Name] = e.Value
				}
			}
			require.Equal(t, tc.wantDir, env[constants.EnvCheckpointPersistDir])
			require.Equal(t, tc.wantEvy, env[constants.EnvCheckpointPersistEvery])
		})
	}
}

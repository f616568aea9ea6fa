package mutate

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// chartPodOf is a pod the job chart renders complete (role rdzv or test) with one container of image.
func chartPodOf(role, image string, gated bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "llm-rdzv-abc", Labels: map[string]string{constants.LabelJob: "llm", constants.LabelRole: role},
			Annotations: map[string]string{constants.AnnotationContract: strconv.Itoa(constants.ContractVersion)}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "rdzv-sidecar", Image: image}}},
	}
	if gated {
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: constants.SchedulingGate}}
	}
	return p
}

// The chart's own pods (the dedicated rendezvous pod, the helm test pod) get the sidecar image this webhook injects
// in place of the chart's placeholder, and their gate opened: the image is set in one place, the webhook chart. An
// image the user named stays, and so does every pod of an older chart (nothing to change, no patch).
func TestChartPodGetsTheWebhooksSidecarImage(t *testing.T) {
	cfg := testConfig()
	cfg.SidecarImagePullPolicy = corev1.PullIfNotPresent
	for _, c := range []struct {
		name, role, image string
		gated             bool
		want              string
		mutated           bool
	}{
		{"dedicated rendezvous pod", constants.RoleRdzv, constants.SidecarImagePlaceholder, true, cfg.SidecarImage, true},
		{"helm test pod", constants.RoleTest, constants.SidecarImagePlaceholder, true, cfg.SidecarImage, true},
		{"an image of the user's", constants.RoleRdzv, "registry.example.com/rdzv-sidecar:1.2", true, "registry.example.com/rdzv-sidecar:1.2", true},
		{"an older chart's pod", constants.RoleRdzv, "ghcr.io/elastic-training/rdzv-sidecar:0.1.0", false, "ghcr.io/elastic-training/rdzv-sidecar:0.1.0", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			pod := chartPodOf(c.role, c.image, c.gated)
			ok, why := ShouldMutate(pod, "team-a", cfg)
			require.True(t, ok, why)
			patch := checkPatch(t, mustJSON(t, pod), "team-a", cfg, nil)
			res, err := Mutate(Input{Pod: pod, Namespace: "team-a", Config: cfg})
			require.NoError(t, err)
			got := res.Pod.Spec.Containers[0]
			assert.Equal(t, c.want, got.Image)
			if c.image == constants.SidecarImagePlaceholder {
				assert.Equal(t, corev1.PullIfNotPresent, got.ImagePullPolicy)
			}
			assert.Empty(t, res.Pod.Spec.SchedulingGates)
			if c.mutated {
				assert.Equal(t, constants.AnnotationMutatedImage, res.Pod.Annotations[constants.AnnotationMutated])
			} else {
				assert.Nil(t, patch, "nothing to change")
			}
			again, err := Mutate(Input{Pod: res.Pod, Namespace: "team-a", Config: cfg})
			require.NoError(t, err)
			assert.Empty(t, again.Patch, "idempotent")
		})
	}
	pod := chartPodOf(constants.RoleRdzv, constants.SidecarImagePlaceholder, true)
	pod.Annotations[constants.AnnotationContract] = strconv.Itoa(constants.ContractVersion + 1)
	_, err := Mutate(Input{Pod: pod, Namespace: "team-a", Config: cfg})
	require.ErrorContains(t, err, "upgrade the elastic-training-webhook chart first")
}

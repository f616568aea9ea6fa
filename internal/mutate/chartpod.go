package mutate

import (
	corev1 "k8s.io/api/core/v1"

	"strconv"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// isChartPod says whether the pod is one the job chart renders complete (the dedicated rendezvous pod, the helm
// test pod): the webhook only gives it the sidecar image.
func isChartPod(role string) bool { return role == constants.RoleRdzv || role == constants.RoleTest }

// chartPod gives the chart's own pods the sidecar image this webhook injects, in place of
// constants.SidecarImagePlaceholder, so that the image is named in one place, the webhook chart, and opens the
// chart's scheduling gate. A container with an image of the user's (rendezvous.image) keeps it. A pod of a newer
// chart than this webhook is denied, as a training pod is.
func chartPod(e *editor, cfg Config) error {
	pod := e.pod
	if err := checkContract(pod.Annotations[constants.AnnotationContract], cfg.Version); err != nil {
		return err
	}
	set := false
	for i := range pod.Spec.InitContainers {
		set = setSidecarImage(e, "/spec/initContainers/"+strconv.Itoa(i), &pod.Spec.InitContainers[i].Image, &pod.Spec.InitContainers[i].ImagePullPolicy, cfg) || set
	}
	for i := range pod.Spec.Containers {
		set = setSidecarImage(e, "/spec/containers/"+strconv.Itoa(i), &pod.Spec.Containers[i].Image, &pod.Spec.Containers[i].ImagePullPolicy, cfg) || set
	}
	openGate(e)
	if set || len(e.ops) > 0 {
		setKey(e, "/metadata/annotations", &pod.Annotations, constants.AnnotationMutated, constants.AnnotationMutatedImage)
	}
	return nil
}

// setSidecarImage replaces the placeholder image of one container (at path) with the webhook's, and its pull policy
// with the webhook's when that is set.
func setSidecarImage(e *editor, path string, image *string, policy *corev1.PullPolicy, cfg Config) bool {
	if *image != constants.SidecarImagePlaceholder {
		return false
	}
	*image = cfg.SidecarImage
	e.add(path+"/image", cfg.SidecarImage)
	if cfg.SidecarImagePullPolicy != "" {
		*policy = cfg.SidecarImagePullPolicy
		e.add(path+"/imagePullPolicy", cfg.SidecarImagePullPolicy)
	}
	return true
}

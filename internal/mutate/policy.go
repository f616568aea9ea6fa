package mutate

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// ShouldMutate decides whether the webhook touches a pod at all, and says why
// not when it does not. It is the webhook's second line of defence: the
// MutatingWebhookConfiguration's objectSelector and namespaceSelector already
// keep other pods away, but a misconfigured selector must not make us touch
// system pods.
func ShouldMutate(pod *corev1.Pod, namespace string, cfg Config) (bool, string) {
	switch {
	case pod == nil:
		return false, "no pod"
	case namespace == metav1.NamespaceSystem:
		return false, "namespace kube-system is never mutated"
	case cfg.WebhookNamespace != "" && namespace == cfg.WebhookNamespace:
		return false, "the webhook's own namespace " + namespace + " is never mutated"
	}
	if _, ok := pod.Labels[constants.LabelJob]; !ok {
		return false, "pod has no " + constants.LabelJob + " label"
	}
	return true, ""
}

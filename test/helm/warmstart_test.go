package helm_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/mutate"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// warmStart, from the chart through the webhook to the trainer's env: the default (the chart's own torchrun command
// of a script) starts warm with no annotation, so that a default job needs no newer chart contract; false renders
// the annotation that keeps torchrun's default; a module keeps it too.
func TestWarmStartValue(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	for _, tc := range []struct {
		name       string
		vals       map[string]any
		annotation string
		warm       bool
	}{
		{"the chart's script", map[string]any{"script": "print('hi')\n"}, "", true},
		{"the user's torchrun command", map[string]any{"command": []any{"torchrun", "/app/train.py"}}, "", true},
		{"off", map[string]any{"script": "print('hi')\n", "warmStart": false}, "false", false},
		{"a module", map[string]any{"command": []any{"torchrun", "-m", "app.train"}}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := renderedServingPod(t, ch, tc.vals)
			require.Equal(t, tc.annotation, pod.Annotations[constants.AnnotationWarmStart])
			res := webhookMutated(t, pod, naming.DefaultClusterDomain)
			i := slices.IndexFunc(res.Pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == "trainer" })
			require.GreaterOrEqual(t, i, 0)
			for _, v := range mutate.WarmStartEnv() {
				require.Equal(t, tc.warm, slices.Contains(res.Pod.Spec.Containers[i].Env, v), "%s=%s", v.Name, v.Value)
			}
		})
	}
}

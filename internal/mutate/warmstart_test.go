package mutate

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// TestWarmStart: a PyTorch pod of the elastic-training backend whose trainer runs torchrun on a script starts its
// workers warm unless its annotation says not; a module, a program, the user's own start method (flag or env) or
// another backend keep torchrun's default, and say why only where the annotation asked for it.
func TestWarmStart(t *testing.T) {
	for _, tc := range []struct {
		desc string
		edit func(p *corev1.Pod)
		warm bool
		warn string // a warning's substring; "" none
	}{
		{"a script", func(p *corev1.Pod) {}, true, ""},
		{"a script, asked for", func(p *corev1.Pod) { p.Annotations[constants.AnnotationWarmStart] = "true" }, true, ""},
		{"in sh -c", func(p *corev1.Pod) {
			p.Spec.Containers[0].Command = []string{"sh", "-c"}
			p.Spec.Containers[0].Args = []string{"pip install -q . && exec torchrun --nproc-per-node=8 train.py --lr 1"}
		}, true, ""},
		{"turned off", func(p *corev1.Pod) { p.Annotations[constants.AnnotationWarmStart] = "false" }, false, ""},
		{"a module", func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{"torchrun", "-m", "pkg.train"} }, false, ""},
		{"a module, asked for", func(p *corev1.Pod) {
			p.Spec.Containers[0].Command = []string{"torchrun", "-m", "pkg.train"}
			p.Annotations[constants.AnnotationWarmStart] = "true"
		}, false, `container "trainer" starts its workers cold, as torchrun does by default: torchrun's --module is given`},
		{"a program", func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{"torchrun", "--no-python", "./run.sh"} }, false, ""},
		{"the user's start method", func(p *corev1.Pod) {
			p.Spec.Containers[0].Command, p.Spec.Containers[0].Args = []string{"torchrun"}, []string{"--start-method=spawn", "train.py"}
		}, false, ""},
		{"the user's start method in env", func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "PET_START_METHOD", Value: "spawn"})
			p.Annotations[constants.AnnotationWarmStart] = "true"
		}, false, "env PET_START_METHOD is set"},
		{"no torchrun", func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{"python3", "train.py"} }, false, ""},
		{"torch's c10d backend", func(p *corev1.Pod) {
			p.Annotations[constants.AnnotationRdzvBackend] = constants.BackendC10d
			p.Annotations[constants.AnnotationWarmStart] = "true"
		}, false, "rendezvous backend c10d (the warm start needs elastic-training's)"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			p := readPod(t, "testdata/pytorch-own-member.yaml")
			tc.edit(p)
			res, err := Mutate(Input{Pod: p, Namespace: "team-a", Config: testConfig()})
			require.NoError(t, err)
			env := res.Pod.Spec.Containers[0].Env
			for _, want := range WarmStartEnv() {
				assert.Equal(t, tc.warm, slices.Contains(env, want), "%s=%s", want.Name, want.Value)
			}
			if tc.warn == "" {
				for _, w := range res.Warnings {
					assert.NotContains(t, w, constants.AnnotationWarmStart)
				}
			} else {
				require.Len(t, res.Warnings, 1)
				assert.Contains(t, res.Warnings[0], tc.warn)
			}
		})
	}
}

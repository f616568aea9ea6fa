package mutate

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/torchrunargv"
)

// WarmStartEnv is what starts a PyTorch pod's workers warm (docs/warm-start.md): torchrun runs the script in a
// process of a fork server (--run-path, --start-method forkserver) that imports torch once per pod, and the
// elastic-training backend preloads elastic_training._warm there, which runs the script as a fresh `python -u`
// would (sys.path, no start method set, unbuffered output).
func WarmStartEnv() []corev1.EnvVar {
	return []corev1.EnvVar{
		{Name: "PET_RUN_PATH", Value: "1"},
		{Name: "PET_START_METHOD", Value: "forkserver"},
		{Name: constants.EnvWarmStart, Value: "1"},
	}
}

// warmStart says whether container c's workers start warm, and when not, why. Only torchrun running a script on
// the elastic-training backend can (its agent preloads the fork server); a module (-m), a program (--no-python)
// or the user's own start method keep torchrun's default.
func warmStart(s *settings, c *corev1.Container) (bool, string) {
	switch {
	case s.framework != constants.FrameworkPyTorch:
		return false, "not a PyTorch pod"
	case s.warmStart == "false":
		return false, "annotation " + constants.AnnotationWarmStart + "=false"
	case s.backend != constants.BackendElasticTraining:
		return false, "rendezvous backend " + s.backend + " (the warm start needs elastic-training's)"
	}
	l, ok := torchrunargv.Find(slices.Concat(c.Command, c.Args))
	switch {
	case !ok:
		return false, "the trainer's command runs no torchrun"
	case l.Entry == "":
		return false, "torchrun's command line names no script"
	}
	for _, flag := range []string{"module", "no-python", "run-path", "start-method"} {
		if l.Has(flag) {
			return false, "torchrun's --" + flag + " is given"
		}
	}
	for _, v := range c.Env {
		if slices.Contains(torchrunChoices, v.Name) {
			return false, "env " + v.Name + " is set"
		}
	}
	return true, ""
}

// torchrunChoices are the settings of torchrun's through which a trainer's env chooses how its workers start; one
// set keeps the trainer cold.
var torchrunChoices = []string{"PET_MODULE", "PET_NO_PYTHON", "PET_RUN_PATH", "PET_START_METHOD"}

// EnvFromProbes is what a warm-started container with envFrom gets before WarmStartEnv. The webhook cannot read
// the ConfigMaps and Secrets of envFrom, where a user may set one of torchrunChoices, and WarmStartEnv's entries
// would override it unseen (env wins over envFrom). So it asks the kubelet: each probe, ET_ENV_FROM_<name>, is
// "$(<name>)", which the kubelet expands to envFrom's value, and leaves as it is where envFrom sets none (env
// refers to envFrom and the env before it). The elastic-training backend, in the agent, reads the answers and
// starts the agent again cold, with the user's settings, when one was expanded (docs/warm-start.md).
func EnvFromProbes() []corev1.EnvVar {
	var probes []corev1.EnvVar
	for _, name := range torchrunChoices {
		probes = append(probes, corev1.EnvVar{Name: constants.EnvFromProbePrefix + name, Value: fmt.Sprintf("$(%s)", name)})
	}
	return probes
}

package mutate

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// trainerEnv is the training container's environment: ours (commonEnv), then
// its framework's own.
func trainerEnv(s *settings, fqdn, rdzvHost, rdzvURL, namespace, domain string) []corev1.EnvVar {
	env := commonEnv(s, fqdn, rdzvURL)
	switch s.framework {
	case constants.FrameworkPyTorch:
		env = append(env, pytorchEnv(s, rdzvHost, fqdn)...)
	case constants.FrameworkMPI:
		if s.role == constants.RoleLauncher {
			env = append(env, mpiLauncherEnv()...)
		}
	case constants.FrameworkMXNet:
		env = append(env, mxnetEnv(s, namespace, domain)...)
	}
	if s.progressOn() {
		// Where the ranks say their steps (docs/hangs.md); an MPI job's ranks, which mpirun starts over ssh, get it
		// from the chart's sshd, which hands them the container's environment.
		env = append(env, corev1.EnvVar{Name: constants.EnvProgressAddr, Value: s.progressAddr()})
	}
	return env
}

// commonEnv is what every framework's trainer gets (the ET_* variables of docs/contract.md).
func commonEnv(s *settings, fqdn, rdzvURL string) []corev1.EnvVar {
	return []corev1.EnvVar{
		{Name: constants.EnvJob, Value: s.job},
		{Name: constants.EnvSlots, Value: strconv.Itoa(s.slots)},
		{Name: constants.EnvMemberHost, Value: fqdn},
		{Name: constants.EnvRdzvEndpoint, Value: rdzvURL},
		{Name: constants.EnvHostfile, Value: hostfilePath},
		{Name: constants.EnvDiscoverHosts, Value: discoverHostsPath},
	}
}

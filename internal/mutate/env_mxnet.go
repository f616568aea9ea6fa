package mutate

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
)

// mxnetEnv is the DMLC_* contract of ps-lite.
func mxnetEnv(s *settings, namespace, domain string) []corev1.EnvVar {
	scheduler := naming.Workload(s.job, constants.RoleScheduler) + "-0"
	env := []corev1.EnvVar{
		{Name: "DMLC_ROLE", Value: s.role},
		{Name: "DMLC_PS_ROOT_URI", Value: naming.PodFQDN(scheduler, naming.HeadlessService(s.job), namespace, domain)},
		{Name: "DMLC_PS_ROOT_PORT", Value: strconv.Itoa(s.psPort)},
		{Name: "DMLC_NUM_SERVER", Value: strconv.Itoa(s.numServers)},
		{Name: "DMLC_NUM_WORKER", Value: strconv.Itoa(s.numWorkers)},
	}
	if s.role == constants.RoleWorker {
		env = append(env, corev1.EnvVar{Name: "DMLC_WORKER_ID", Value: strconv.Itoa(s.index)})
	}
	return env
}

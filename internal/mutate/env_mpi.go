package mutate

import corev1 "k8s.io/api/core/v1"

// mpiLauncherEnv points every MPI flavour's launcher at the live hostfile.
// Open MPI 5 and 6 launch through PRRTE, which ignores Open MPI 4's ORTE
// names; both sets coexist without warnings. Without keep_fqdn_hostnames,
// Open MPI 4 hands the short names to ssh, and 6 merges pods whose short
// names agree.
func mpiLauncherEnv() []corev1.EnvVar {
	return []corev1.EnvVar{
		{Name: "OMPI_MCA_orte_default_hostfile", Value: hostfilePath},
		{Name: "OMPI_MCA_orte_keep_fqdn_hostnames", Value: "true"},
		{Name: "PRTE_MCA_prte_default_hostfile", Value: hostfilePath},
		{Name: "PRTE_MCA_prte_keep_fqdn_hostnames", Value: "true"},
		{Name: "HYDRA_HOST_FILE", Value: hostfilePath},
		{Name: "I_MPI_HYDRA_HOST_FILE", Value: hostfilePath},
	}
}

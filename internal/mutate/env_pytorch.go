package mutate

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// pytorchEnv is torchrun's configuration through its PET_* variables. The
// rank-0 address other agents connect to is this pod's FQDN (PET_LOCAL_ADDR
// on torch >= 2.2, getfqdn() before, which the hostname + subdomain make
// resolvable through the job's headless Service).
func pytorchEnv(s *settings, rdzvHost, fqdn string) []corev1.EnvVar {
	endpoint := rdzvHost + ":" + svcClientPort
	conf := map[string]string{}
	switch s.backend {
	case constants.BackendEtcd:
		conf["timeout"] = strconv.Itoa(s.joinTimeout)
		conf["last_call_timeout"] = strconv.Itoa(s.lastCall)
	case constants.BackendElasticTraining: // internal/trainerpy reads these; membership replaces keep-alives
		conf["join_timeout"] = strconv.Itoa(s.joinTimeout)
		conf["last_call_timeout"] = strconv.Itoa(s.lastCall)
		conf["close_timeout"] = strconv.Itoa(s.closeTimeout)
	default: // etcd-v2 and c10d: torch's dynamic rendezvous
		conf["join_timeout"] = strconv.Itoa(s.joinTimeout)
		conf["last_call_timeout"] = strconv.Itoa(s.lastCall)
		conf["close_timeout"] = strconv.Itoa(s.closeTimeout)
		conf["keep_alive_interval"] = strconv.Itoa(KeepAliveInterval(s.keepAlive, s.maxNodes))
		conf["keep_alive_max_attempt"] = strconv.Itoa(s.keepAliveAttempts)
	}
	if constants.OnSidecarStore(s.backend) {
		// The TCPStore is the serving sidecar's (rdzv-sidecar serve
		// --c10d-addr): no agent hosts one, so the rendezvous outlives every
		// worker. Every trainer reaches it through its own pod's sidecar
		// (c10dLocal), so that the store's connections end with the pod's
		// membership: torch's client would wait for a lost store's answer
		// until the kernel gives the connection up (internal/storeproxy).
		endpoint = s.c10dLocal()
		if s.backend == constants.BackendC10d {
			conf["is_host"] = "false"
		}
	}
	if s.tlsSecret != "" {
		// Both etcd backends talk to the store through python-etcd, but each
		// names the TLS settings differently (torch's etcd_rendezvous.py vs
		// etcd_rendezvous_backend.py); c10d + TLS is denied in parseSettings.
		// The Secret's one certificate is also the client certificate.
		conf["protocol"] = "https"
		switch s.backend {
		case constants.BackendEtcd:
			conf["cacert"], conf["cert"], conf["key"] = tlsCAFile, tlsCertFile, tlsKeyFile
		case constants.BackendEtcdV2:
			conf["ca_cert"], conf["ssl_cert"], conf["ssl_cert_key"] = tlsCAFile, tlsCertFile, tlsKeyFile
		}
	}
	env := []corev1.EnvVar{
		{Name: "PET_RDZV_BACKEND", Value: s.backend},
		{Name: "PET_RDZV_ENDPOINT", Value: endpoint},
		{Name: "PET_RDZV_ID", Value: s.runID},
		{Name: "PET_NNODES", Value: strconv.Itoa(s.minNodes) + ":" + strconv.Itoa(s.maxNodes)},
		{Name: "PET_NPROC_PER_NODE", Value: strconv.Itoa(s.slots)},
		{Name: "PET_MAX_RESTARTS", Value: strconv.Itoa(s.maxRestarts)},
		{Name: "PET_MONITOR_INTERVAL", Value: strconv.FormatFloat(s.monitorInterval(), 'f', -1, 64)},
		{Name: "PET_RDZV_CONF", Value: rdzvConf(conf)},
		{Name: "PET_LOCAL_ADDR", Value: fqdn},
		// torch >= 2.5 shares the rank-0 agent's TCPStore with the workers by
		// default (pytorch#128096), and then a node that joins a running job
		// waits forever: rank 0 keeps its store and never writes MASTER_ADDR
		// under the new round's prefix, which the newcomer reads
		// (RendezvousStoreInfo.build in torch/distributed/elastic/rendezvous/api.py;
		// pytorch#135712). Without sharing, rank 0 of every round publishes a
		// fresh store. Older torch does not read the variable.
		{Name: constants.EnvDisableSharedStore, Value: "1"},
	}
	if s.backend == constants.BackendElasticTraining {
		// The own backend's rank 0 names its workers' store by this pod's IP (torch's handlers by
		// PET_LOCAL_ADDR, the FQDN, which internal/torchbackends/survivors and the view read as the pod's name).
		env = append(env, corev1.EnvVar{Name: constants.EnvMemberIP, ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"}}})
	}
	return env
}

// rdzvConf renders torchrun's --rdzv-conf: key=value pairs, sorted so the output is stable.
func rdzvConf(conf map[string]string) string {
	pairs := make([]string, 0, len(conf))
	for _, k := range slices.Sorted(maps.Keys(conf)) {
		pairs = append(pairs, k+"="+conf[k])
	}
	return strings.Join(pairs, ",")
}

// monitorInterval is torchrun's --monitor-interval: the job's own, else the webhook's for a job of its size.
func (s *settings) monitorInterval() float64 {
	if s.monitorSet {
		return s.monitor
	}
	return MonitorInterval(s.monitor, s.maxNodes)
}

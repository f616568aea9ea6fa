package mutate

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
)

// Input is everything Mutate depends on.
type Input struct {
	// Pod is the pod being created; Mutate does not modify it.
	Pod *corev1.Pod
	// Namespace is the admission request's namespace (pod.Namespace may be empty at CREATE).
	Namespace string
	Config    Config
}

// Sidecar modes (the first argument of rdzv-sidecar).
const (
	ModeServe = "serve"
	ModeJoin  = "join"
)

// Mutate returns a mutated copy of in.Pod, admission warnings for values the
// user set that contradict the computed ones, or an error whose message names
// the offending label or annotation and what would be valid (the webhook
// denies the pod with it).
//
// Mutate is idempotent: a pod already carrying the mutated annotation is
// returned unchanged, and mutating an output again with that annotation
// removed gives the same output (every step sets, never appends twice).
func Mutate(in Input) (*corev1.Pod, []string, error) {
	if in.Pod == nil {
		return nil, nil, errors.New("mutate: no pod")
	}
	pod := in.Pod.DeepCopy()
	if _, done := pod.Annotations[constants.AnnotationMutated]; done {
		return pod, nil, nil
	}
	if in.Config.SidecarImage == "" {
		return nil, nil, errors.New("mutate: webhook misconfigured: no sidecar image")
	}
	if in.Namespace == "" {
		return nil, nil, errors.New("mutate: no namespace")
	}
	s, err := parseSettings(pod, in.Config)
	if err != nil {
		return nil, nil, err
	}
	w := &warner{warnings: s.warnings}
	cfg := in.Config
	domain := cfg.ClusterDomain
	if domain == "" {
		domain = naming.DefaultClusterDomain
	}

	// A stable DNS name: hostname + subdomain (Indexed Jobs and StatefulSets set the hostname).
	if pod.Spec.Hostname == "" {
		if pod.Name == "" {
			return nil, nil, fmt.Errorf("pod has neither spec.hostname nor a name: create training pods through an Indexed Job or a StatefulSet, or set spec.hostname")
		}
		pod.Spec.Hostname = pod.Name
	}
	headless := naming.HeadlessService(s.job)
	if pod.Spec.Subdomain == "" {
		pod.Spec.Subdomain = headless
	} else if pod.Spec.Subdomain != headless {
		w.add("spec.subdomain %q is kept; the job's headless Service is %q, so this pod's name resolves only if Service %q exists",
			pod.Spec.Subdomain, headless, pod.Spec.Subdomain)
	}
	fqdn := naming.PodFQDN(pod.Spec.Hostname, pod.Spec.Subdomain, in.Namespace, domain)
	rdzvHost := naming.ServiceFQDN(s.rdzvService, in.Namespace, domain)
	rdzvURL := fmt.Sprintf("%s://%s:%d", scheme(s), rdzvHost, constants.RdzvClientPort)

	serving := s.rdzvHost && s.index == 0
	register := s.role == constants.RoleWorker

	// Labels and annotations.
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	if serving {
		pod.Labels[constants.LabelRdzvServer] = "true"
	} else if v, set := pod.Labels[constants.LabelRdzvServer]; set {
		w.add("label %s=%q removed: only the index-0 pod of the group annotated %s=true serves the rendezvous",
			constants.LabelRdzvServer, v, constants.AnnotationRdzvHost)
		delete(pod.Labels, constants.LabelRdzvServer)
	}
	mode := ModeJoin
	if serving {
		mode = ModeServe
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[constants.AnnotationMutated] = fmt.Sprintf("sidecar=%s,slots=%d", mode, s.slots)

	// Volumes.
	if err := setVolume(pod, constants.FilesVolumeName); err != nil {
		return nil, nil, err
	}
	if serving {
		if err := setVolume(pod, constants.DataVolumeName); err != nil {
			return nil, nil, err
		}
	}
	if s.tlsSecret != "" {
		if err := setSecretVolume(pod, constants.TLSVolumeName, s.tlsSecret); err != nil {
			return nil, nil, err
		}
	}
	if err := checkPorts(pod, serving); err != nil {
		return nil, nil, err
	}

	// The training container: env and the read-only files mount.
	c := &pod.Spec.Containers[s.container]
	env := commonEnv(s, fqdn, rdzvURL)
	switch s.framework {
	case constants.FrameworkPyTorch:
		env = append(env, pytorchEnv(s, rdzvHost, fqdn, serving)...)
	case constants.FrameworkMPI:
		if s.role == constants.RoleLauncher {
			env = append(env, mpiLauncherEnv()...)
		}
	case constants.FrameworkMXNet:
		env = append(env, mxnetEnv(s, in.Namespace, domain)...)
	}
	for _, e := range env {
		setEnv(c, e, w)
	}
	if err := setMount(c, constants.FilesVolumeName, constants.FilesDir, true); err != nil {
		return nil, nil, err
	}
	if s.framework == constants.FrameworkPyTorch && s.backend != constants.BackendC10d {
		setLeaveHook(c, w)
	}
	if s.tlsSecret != "" {
		// The trainer's own rendezvous client (torchrun, or a launcher's
		// `rdzv-sidecar wait`) needs the CA and the client certificate too.
		if err := setMount(c, constants.TLSVolumeName, constants.TLSDir, true); err != nil {
			return nil, nil, err
		}
	}

	// The native sidecar, first among the init containers so that everything
	// after it (user init containers, then the trainer) starts once it is ready.
	sc := sidecar(cfg, s, mode, register, fqdn, rdzvURL)
	inits := []corev1.Container{sc}
	for _, ic := range pod.Spec.InitContainers {
		if ic.Name != constants.SidecarContainerName {
			inits = append(inits, ic)
		}
	}
	pod.Spec.InitContainers = inits
	return pod, w.warnings, nil
}

type warner struct{ warnings []string }

func (w *warner) add(format string, args ...any) {
	w.warnings = append(w.warnings, fmt.Sprintf(format, args...))
}

func scheme(s *settings) string {
	if s.tlsSecret != "" {
		return "https"
	}
	return "http"
}

// tlsFile is the path of one file of the mounted TLS Secret.
func tlsFile(name string) string { return path.Join(constants.TLSDir, name) }

func commonEnv(s *settings, fqdn, rdzvURL string) []corev1.EnvVar {
	return []corev1.EnvVar{
		{Name: constants.EnvJob, Value: s.job},
		{Name: constants.EnvSlots, Value: strconv.Itoa(s.slots)},
		{Name: constants.EnvMemberHost, Value: fqdn},
		{Name: constants.EnvRdzvEndpoint, Value: rdzvURL},
		{Name: constants.EnvHostfile, Value: path.Join(constants.FilesDir, constants.HostfileName)},
		{Name: constants.EnvDiscoverHosts, Value: path.Join(constants.FilesDir, constants.DiscoverHostsName)},
	}
}

// pytorchEnv is torchrun's configuration through its PET_* variables. The
// rank-0 address other agents connect to is this pod's FQDN (PET_LOCAL_ADDR on
// torch >= 2.2, getfqdn() before, which the hostname + subdomain make
// resolvable through the job's headless Service).
func pytorchEnv(s *settings, rdzvHost, fqdn string, serving bool) []corev1.EnvVar {
	port := constants.RdzvClientPort
	conf := map[string]string{}
	switch s.backend {
	case constants.BackendEtcd:
		conf["timeout"] = strconv.Itoa(s.joinTimeout)
		conf["last_call_timeout"] = strconv.Itoa(s.lastCall)
	default: // etcd-v2 and c10d: torch's dynamic rendezvous
		conf["join_timeout"] = strconv.Itoa(s.joinTimeout)
		conf["last_call_timeout"] = strconv.Itoa(s.lastCall)
		conf["close_timeout"] = strconv.Itoa(s.closeTimeout)
		conf["keep_alive_interval"] = strconv.Itoa(s.keepAlive)
		conf["keep_alive_max_attempt"] = strconv.Itoa(s.keepAliveAttempts)
	}
	if s.backend == constants.BackendC10d {
		// The TCPStore lives in the serving pod's torchrun agent, reached through
		// the rendezvous Service; is_host says who binds it (the Service name
		// never matches a pod's own hostname).
		port = constants.C10dPort
		conf["is_host"] = strconv.FormatBool(serving)
	}
	if s.tlsSecret != "" {
		// Both etcd backends talk to the store through python-etcd, but each
		// names the TLS settings differently (torch's etcd_rendezvous.py vs
		// etcd_rendezvous_backend.py); c10d + TLS is denied in parseSettings.
		// The Secret's one certificate is also the client certificate.
		conf["protocol"] = "https"
		switch s.backend {
		case constants.BackendEtcd:
			conf["cacert"] = tlsFile(constants.TLSCAName)
			conf["cert"] = tlsFile(constants.TLSCertName)
			conf["key"] = tlsFile(constants.TLSKeyName)
		case constants.BackendEtcdV2:
			conf["ca_cert"] = tlsFile(constants.TLSCAName)
			conf["ssl_cert"] = tlsFile(constants.TLSCertName)
			conf["ssl_cert_key"] = tlsFile(constants.TLSKeyName)
		}
	}
	return []corev1.EnvVar{
		{Name: "PET_RDZV_BACKEND", Value: s.backend},
		{Name: "PET_RDZV_ENDPOINT", Value: fmt.Sprintf("%s:%d", rdzvHost, port)},
		{Name: "PET_RDZV_ID", Value: s.runID},
		{Name: "PET_NNODES", Value: fmt.Sprintf("%d:%d", s.minNodes, s.maxNodes)},
		{Name: "PET_NPROC_PER_NODE", Value: strconv.Itoa(s.slots)},
		{Name: "PET_MAX_RESTARTS", Value: strconv.Itoa(s.maxRestarts)},
		{Name: "PET_MONITOR_INTERVAL", Value: strconv.Itoa(s.monitor)},
		{Name: "PET_RDZV_CONF", Value: rdzvConf(conf)},
		{Name: "PET_LOCAL_ADDR", Value: fqdn},
	}
}

// rdzvConf renders torchrun's --rdzv-conf: key=value pairs, sorted so the output is stable.
func rdzvConf(conf map[string]string) string {
	keys := make([]string, 0, len(conf))
	for k := range conf {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + conf[k]
	}
	return strings.Join(parts, ",")
}

// mpiLauncherEnv points every MPI flavour's launcher at the live hostfile.
func mpiLauncherEnv() []corev1.EnvVar {
	hostfile := path.Join(constants.FilesDir, constants.HostfileName)
	return []corev1.EnvVar{
		{Name: "OMPI_MCA_orte_default_hostfile", Value: hostfile},
		{Name: "OMPI_MCA_orte_keep_fqdn_hostnames", Value: "true"},
		{Name: "HYDRA_HOST_FILE", Value: hostfile},
		{Name: "I_MPI_HYDRA_HOST_FILE", Value: hostfile},
	}
}

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

// leaveCommand is the PyTorch trainer's preStop hook: torchrun's agent does
// not leave the rendezvous on SIGTERM, so without it the survivors of a
// scale-down wait for torch's dead-node timeout (15 s in torch 1.13) before
// they re-form. The script is best effort and always exits 0.
var leaveCommand = []string{"python3", path.Join(constants.FilesDir, constants.LeaveScriptName)}

// setLeaveHook makes leaveCommand c's preStop hook unless the user set one:
// theirs wins, with a warning, since a pod runs one preStop hook per container.
func setLeaveHook(c *corev1.Container, w *warner) {
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		if h := c.Lifecycle.PreStop.Exec; h == nil || !slices.Equal(h.Command, leaveCommand) {
			w.add("container %q keeps its own preStop hook; without %q a scale-down waits for torch's dead-node timeout",
				c.Name, strings.Join(leaveCommand, " "))
		}
		return
	}
	if c.Lifecycle == nil {
		c.Lifecycle = &corev1.Lifecycle{}
	}
	c.Lifecycle.PreStop = &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: slices.Clone(leaveCommand)}}
}

// setEnv adds e to c unless the user already set that variable: the user's
// value wins, with a warning when it differs from the computed one.
func setEnv(c *corev1.Container, e corev1.EnvVar, w *warner) {
	for _, have := range c.Env {
		if have.Name != e.Name {
			continue
		}
		if have.ValueFrom == nil && have.Value != e.Value {
			w.add("env %s=%q set in container %q is kept; the webhook computed %q", e.Name, have.Value, c.Name, e.Value)
		}
		return
	}
	c.Env = append(c.Env, e)
}

// setVolume adds the emptyDir name; a volume of that name that is not an
// emptyDir is a conflict (the sidecar must be able to write to it).
func setVolume(pod *corev1.Pod, name string) error {
	for _, v := range pod.Spec.Volumes {
		if v.Name == name {
			if v.EmptyDir == nil {
				return fmt.Errorf("volume name %q is reserved for the emptyDir the webhook shares with the sidecar: rename the pod's volume", name)
			}
			return nil
		}
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
		Name:         name,
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
	})
	return nil
}

// setSecretVolume adds a volume name from Secret secret. A pod volume of that
// name from the same Secret is kept (a re-mutation, or the API server's
// defaults on it); anything else is a conflict: the sidecar and the trainer
// must read the Secret the annotation names, not whatever the pod put there.
func setSecretVolume(pod *corev1.Pod, name, secret string) error {
	for _, v := range pod.Spec.Volumes {
		if v.Name == name {
			if v.Secret == nil || v.Secret.SecretName != secret {
				return fmt.Errorf("volume name %q is reserved for the rendezvous TLS Secret %q (annotation %s): rename the pod's volume",
					name, secret, constants.AnnotationRdzvTLSSecret)
			}
			return nil
		}
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
		Name:         name,
		VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret}},
	})
	return nil
}

// checkPorts denies pods whose containers already use the sidecar's ports
// (all containers of a pod share one network namespace).
func checkPorts(pod *corev1.Pod, serving bool) error {
	taken := map[int32]string{constants.SidecarHealthPort: "the sidecar's health port"}
	if serving {
		taken[constants.RdzvClientPort] = "the rendezvous client port"
	}
	for _, list := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for _, c := range list {
			if c.Name == constants.SidecarContainerName {
				continue
			}
			for _, p := range c.Ports {
				if what, ok := taken[p.ContainerPort]; ok {
					return fmt.Errorf("container %q declares port %d, which is %s: use another port", c.Name, p.ContainerPort, what)
				}
			}
		}
	}
	return nil
}

func setMount(c *corev1.Container, volume, mountPath string, readOnly bool) error {
	for _, m := range c.VolumeMounts {
		if m.MountPath == mountPath && m.Name != volume {
			return fmt.Errorf("container %q mounts volume %q at %s, which the webhook needs for volume %q: mount it elsewhere", c.Name, m.Name, mountPath, volume)
		}
		if m.Name == volume && m.MountPath == mountPath {
			return nil
		}
	}
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: volume, MountPath: mountPath, ReadOnly: readOnly})
	return nil
}

// sidecar builds the rdzv-sidecar native sidecar with the command line of docs/contract.md.
func sidecar(cfg Config, s *settings, mode string, register bool, fqdn, rdzvURL string) corev1.Container {
	health := fmt.Sprintf(":%d", constants.SidecarHealthPort)
	var args []string
	res := cfg.Defaults.SidecarResources.Join
	mounts := []corev1.VolumeMount{{Name: constants.FilesVolumeName, MountPath: constants.FilesDir}}
	ports := []corev1.ContainerPort{}
	if mode == ModeServe {
		res = cfg.Defaults.SidecarResources.Serve
		args = []string{ModeServe,
			"--data-dir=" + constants.DataDir,
			fmt.Sprintf("--listen-client-urls=%s://0.0.0.0:%d", scheme(s), constants.RdzvClientPort),
			"--advertise-client-urls=" + rdzvURL,
			"--health-addr=" + health,
		}
		mounts = append(mounts, corev1.VolumeMount{Name: constants.DataVolumeName, MountPath: constants.DataDir})
		ports = append(ports, corev1.ContainerPort{Name: "rdzv", ContainerPort: constants.RdzvClientPort, Protocol: corev1.ProtocolTCP})
		if s.tlsSecret != "" {
			// etcd's flag names; every client must present a certificate from the CA.
			args = append(args,
				"--cert-file="+tlsFile(constants.TLSCertName),
				"--key-file="+tlsFile(constants.TLSKeyName),
				"--trusted-ca-file="+tlsFile(constants.TLSCAName),
				"--client-cert-auth",
			)
		}
	} else {
		args = []string{ModeJoin, "--endpoints=" + rdzvURL, "--health-addr=" + health}
		if s.tlsSecret != "" {
			// etcdctl's flag names: verify the server, authenticate with the same certificate.
			args = append(args,
				"--cacert="+tlsFile(constants.TLSCAName),
				"--cert="+tlsFile(constants.TLSCertName),
				"--key="+tlsFile(constants.TLSKeyName),
			)
		}
	}
	if s.tlsSecret != "" {
		mounts = append(mounts, corev1.VolumeMount{Name: constants.TLSVolumeName, MountPath: constants.TLSDir, ReadOnly: true})
	}
	args = append(args,
		"--files-dir="+constants.FilesDir,
		"--hostfile-flavour="+s.flavour,
		"--register="+strconv.FormatBool(register),
		"--member-host="+fqdn,
		"--member-slots="+strconv.Itoa(s.slots),
		"--member-group="+s.group,
		"--member-index="+strconv.Itoa(s.index),
	)
	if s.role == constants.RoleLauncher {
		args = append(args, "--install-helper")
	}
	// The health port stays plain HTTP with or without TLS (the sidecar serves
	// it apart from the client URLs), so the kubelet's HTTP probes keep working.
	ports = append(ports, corev1.ContainerPort{Name: "rdzv-health", ContainerPort: constants.SidecarHealthPort, Protocol: corev1.ProtocolTCP})
	probe := func(period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: "/readyz", Port: intstr.FromInt32(constants.SidecarHealthPort),
			}},
			PeriodSeconds:    period,
			FailureThreshold: failures,
		}
	}
	return corev1.Container{
		Name:            constants.SidecarContainerName,
		Image:           cfg.SidecarImage,
		ImagePullPolicy: cfg.SidecarImagePullPolicy,
		Args:            args,
		Ports:           ports,
		RestartPolicy:   ptr.To(corev1.ContainerRestartPolicyAlways),
		// The trainer starts only once the sidecar answers /readyz (up to 10 minutes).
		StartupProbe:   probe(1, 600),
		ReadinessProbe: probe(5, 3),
		Resources:      *res.DeepCopy(),
		VolumeMounts:   mounts,
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			RunAsUser:                ptr.To[int64](65532),
			RunAsGroup:               ptr.To[int64](65532),
			AllowPrivilegeEscalation: ptr.To(false),
			Privileged:               ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
}

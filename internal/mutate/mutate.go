package mutate

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
)

// Input is everything Mutate depends on.
type Input struct {
	// Pod is the pod being created; Mutate does not modify it unless PodOwned.
	Pod *corev1.Pod
	// PodOwned hands Pod over to Mutate, which then changes it in place and
	// returns it (or, on error, leaves it changed in part) instead of copying
	// it first. The webhook decodes a pod per request and needs it no more:
	// copying it was a good part of Mutate's time.
	PodOwned bool
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
	pod := in.Pod
	if !in.PodOwned {
		pod = pod.DeepCopy()
	}
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
	rdzvURL := scheme(s) + "://" + rdzvHost + ":" + rdzvClientPort

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
	pod.Annotations[constants.AnnotationMutated] = "sidecar=" + mode + ",slots=" + strconv.Itoa(s.slots)

	// Volumes.
	added := 1
	if serving {
		added++
	}
	if s.tlsSecret != "" {
		added++
	}
	pod.Spec.Volumes = slices.Grow(pod.Spec.Volumes, added)
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
	env := appendCommonEnv(make([]corev1.EnvVar, 0, 16), s, fqdn, rdzvURL)
	switch s.framework {
	case constants.FrameworkPyTorch:
		env = appendPytorchEnv(env, s, rdzvHost, fqdn, serving)
	case constants.FrameworkMPI:
		if s.role == constants.RoleLauncher {
			env = appendMPILauncherEnv(env)
		}
	case constants.FrameworkMXNet:
		env = appendMXNetEnv(env, s, in.Namespace, domain)
	}
	c.Env = slices.Grow(c.Env, len(env))
	for _, e := range env {
		setEnv(c, e, w)
	}
	if err := setMount(c, constants.FilesVolumeName, constants.FilesDir, true); err != nil {
		return nil, nil, err
	}
	if s.framework == constants.FrameworkPyTorch {
		setLeaveHook(c, w)
		shareProcesses(pod, w)
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
	inits := append(make([]corev1.Container, 0, 1+len(pod.Spec.InitContainers)), sc)
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

// Paths and ports as the sidecar's and the trainer's settings spell them,
// worked out once rather than for every pod.
var (
	tlsCertFile       = path.Join(constants.TLSDir, constants.TLSCertName)
	tlsKeyFile        = path.Join(constants.TLSDir, constants.TLSKeyName)
	tlsCAFile         = path.Join(constants.TLSDir, constants.TLSCAName)
	hostfilePath      = path.Join(constants.FilesDir, constants.HostfileName)
	discoverHostsPath = path.Join(constants.FilesDir, constants.DiscoverHostsName)
	rdzvClientPort    = strconv.Itoa(constants.RdzvClientPort)
	c10dPort          = strconv.Itoa(constants.C10dPort)
	sidecarHealthAddr = ":" + strconv.Itoa(constants.SidecarHealthPort)
)

func appendCommonEnv(env []corev1.EnvVar, s *settings, fqdn, rdzvURL string) []corev1.EnvVar {
	return append(env,
		corev1.EnvVar{Name: constants.EnvJob, Value: s.job},
		corev1.EnvVar{Name: constants.EnvSlots, Value: strconv.Itoa(s.slots)},
		corev1.EnvVar{Name: constants.EnvMemberHost, Value: fqdn},
		corev1.EnvVar{Name: constants.EnvRdzvEndpoint, Value: rdzvURL},
		corev1.EnvVar{Name: constants.EnvHostfile, Value: hostfilePath},
		corev1.EnvVar{Name: constants.EnvDiscoverHosts, Value: discoverHostsPath},
	)
}

// appendPytorchEnv appends torchrun's configuration through its PET_*
// variables. The rank-0 address other agents connect to is this pod's FQDN
// (PET_LOCAL_ADDR on torch >= 2.2, getfqdn() before, which the hostname +
// subdomain make resolvable through the job's headless Service).
func appendPytorchEnv(env []corev1.EnvVar, s *settings, rdzvHost, fqdn string, serving bool) []corev1.EnvVar {
	port := rdzvClientPort
	var confBuf [12]confEntry // the most any backend sets
	conf := confBuf[:0]
	switch s.backend {
	case constants.BackendEtcd:
		conf = append(conf,
			confEntry{"timeout", strconv.Itoa(s.joinTimeout)},
			confEntry{"last_call_timeout", strconv.Itoa(s.lastCall)})
	default: // etcd-v2 and c10d: torch's dynamic rendezvous
		conf = append(conf,
			confEntry{"join_timeout", strconv.Itoa(s.joinTimeout)},
			confEntry{"last_call_timeout", strconv.Itoa(s.lastCall)},
			confEntry{"close_timeout", strconv.Itoa(s.closeTimeout)},
			confEntry{"keep_alive_interval", strconv.Itoa(s.keepAlive)},
			confEntry{"keep_alive_max_attempt", strconv.Itoa(s.keepAliveAttempts)})
	}
	if s.backend == constants.BackendC10d {
		// The TCPStore lives in the serving pod's torchrun agent, reached through
		// the rendezvous Service; is_host says who binds it (the Service name
		// never matches a pod's own hostname).
		port = c10dPort
		conf = append(conf, confEntry{"is_host", strconv.FormatBool(serving)})
	}
	if s.tlsSecret != "" {
		// Both etcd backends talk to the store through python-etcd, but each
		// names the TLS settings differently (torch's etcd_rendezvous.py vs
		// etcd_rendezvous_backend.py); c10d + TLS is denied in parseSettings.
		// The Secret's one certificate is also the client certificate.
		conf = append(conf, confEntry{"protocol", "https"})
		switch s.backend {
		case constants.BackendEtcd:
			conf = append(conf,
				confEntry{"cacert", tlsCAFile},
				confEntry{"cert", tlsCertFile},
				confEntry{"key", tlsKeyFile})
		case constants.BackendEtcdV2:
			conf = append(conf,
				confEntry{"ca_cert", tlsCAFile},
				confEntry{"ssl_cert", tlsCertFile},
				confEntry{"ssl_cert_key", tlsKeyFile})
		}
	}
	return append(env,
		corev1.EnvVar{Name: "PET_RDZV_BACKEND", Value: s.backend},
		corev1.EnvVar{Name: "PET_RDZV_ENDPOINT", Value: rdzvHost + ":" + port},
		corev1.EnvVar{Name: "PET_RDZV_ID", Value: s.runID},
		corev1.EnvVar{Name: "PET_NNODES", Value: strconv.Itoa(s.minNodes) + ":" + strconv.Itoa(s.maxNodes)},
		corev1.EnvVar{Name: "PET_NPROC_PER_NODE", Value: strconv.Itoa(s.slots)},
		corev1.EnvVar{Name: "PET_MAX_RESTARTS", Value: strconv.Itoa(s.maxRestarts)},
		corev1.EnvVar{Name: "PET_MONITOR_INTERVAL", Value: strconv.Itoa(s.monitor)},
		corev1.EnvVar{Name: "PET_RDZV_CONF", Value: rdzvConf(conf)},
		corev1.EnvVar{Name: "PET_LOCAL_ADDR", Value: fqdn},
		// torch >= 2.5 shares the rank-0 agent's TCPStore with the workers by
		// default (pytorch#128096), and then a node that joins a running job
		// waits forever: rank 0 keeps its store and never writes MASTER_ADDR
		// under the new round's prefix, which the newcomer reads
		// (RendezvousStoreInfo.build in torch/distributed/elastic/rendezvous/api.py;
		// pytorch#135712). Without sharing, rank 0 of every round publishes a
		// fresh store. Older torch does not read the variable.
		corev1.EnvVar{Name: constants.EnvDisableSharedStore, Value: "1"},
	)
}

// confEntry is one key=value of torchrun's --rdzv-conf; each key is set once.
type confEntry struct{ key, value string }

// rdzvConf renders torchrun's --rdzv-conf: key=value pairs, sorted so the output is stable.
func rdzvConf(conf []confEntry) string {
	slices.SortFunc(conf, func(x, y confEntry) int { return strings.Compare(x.key, y.key) })
	n := 0
	for _, e := range conf {
		n += len(e.key) + 1 + len(e.value) + 1
	}
	var b strings.Builder
	b.Grow(n)
	for i, e := range conf {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.key)
		b.WriteByte('=')
		b.WriteString(e.value)
	}
	return b.String()
}

// appendMPILauncherEnv points every MPI flavour's launcher at the live hostfile.
// Open MPI 5 and 6 launch through PRRTE, which ignores Open MPI 4's ORTE
// names; both sets coexist without warnings. Without keep_fqdn_hostnames,
// Open MPI 4 hands the short names to ssh, and 6 merges pods whose short
// names agree.
func appendMPILauncherEnv(env []corev1.EnvVar) []corev1.EnvVar {
	return append(env,
		corev1.EnvVar{Name: "OMPI_MCA_orte_default_hostfile", Value: hostfilePath},
		corev1.EnvVar{Name: "OMPI_MCA_orte_keep_fqdn_hostnames", Value: "true"},
		corev1.EnvVar{Name: "PRTE_MCA_prte_default_hostfile", Value: hostfilePath},
		corev1.EnvVar{Name: "PRTE_MCA_prte_keep_fqdn_hostnames", Value: "true"},
		corev1.EnvVar{Name: "HYDRA_HOST_FILE", Value: hostfilePath},
		corev1.EnvVar{Name: "I_MPI_HYDRA_HOST_FILE", Value: hostfilePath},
	)
}

// appendMXNetEnv appends the DMLC_* contract of ps-lite.
func appendMXNetEnv(env []corev1.EnvVar, s *settings, namespace, domain string) []corev1.EnvVar {
	scheduler := naming.Workload(s.job, constants.RoleScheduler) + "-0"
	env = append(env,
		corev1.EnvVar{Name: "DMLC_ROLE", Value: s.role},
		corev1.EnvVar{Name: "DMLC_PS_ROOT_URI", Value: naming.PodFQDN(scheduler, naming.HeadlessService(s.job), namespace, domain)},
		corev1.EnvVar{Name: "DMLC_PS_ROOT_PORT", Value: strconv.Itoa(s.psPort)},
		corev1.EnvVar{Name: "DMLC_NUM_SERVER", Value: strconv.Itoa(s.numServers)},
		corev1.EnvVar{Name: "DMLC_NUM_WORKER", Value: strconv.Itoa(s.numWorkers)},
	)
	if s.role == constants.RoleWorker {
		env = append(env, corev1.EnvVar{Name: "DMLC_WORKER_ID", Value: strconv.Itoa(s.index)})
	}
	return env
}

// leaveCommand is the PyTorch trainer's preStop hook: torchrun's agent does
// not leave the rendezvous on SIGTERM, so without it the survivors of a
// scale-down wait for torch's dead-node timeout (15 s in torch 1.13) before
// they re-form. The script is best effort and always exits 0.
var leaveCommand = [...]string{"python3", path.Join(constants.FilesDir, constants.LeaveScriptName)}

// setLeaveHook makes leaveCommand c's preStop hook unless the user set one:
// theirs wins, with a warning, since a pod runs one preStop hook per container.
func setLeaveHook(c *corev1.Container, w *warner) {
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		if h := c.Lifecycle.PreStop.Exec; h == nil || !slices.Equal(h.Command, leaveCommand[:]) {
			w.add("container %q keeps its own preStop hook; without %q a scale-down waits for torch's dead-node timeout",
				c.Name, strings.Join(leaveCommand[:], " "))
		}
		return
	}
	// One allocation for the hook and its parts, the pod's own.
	hook := &struct {
		lifecycle corev1.Lifecycle
		handler   corev1.LifecycleHandler
		exec      corev1.ExecAction
		command   [len(leaveCommand)]string
	}{}
	hook.command = leaveCommand
	hook.exec.Command = hook.command[:]
	hook.handler.Exec = &hook.exec
	if c.Lifecycle == nil {
		c.Lifecycle = &hook.lifecycle
	}
	c.Lifecycle.PreStop = &hook.handler
}

// shareProcesses puts the pod's containers in one PID namespace, so that the
// leave hook can stop the torchrun agent with SIGKILL: torch 2.3 to 2.7 close
// the whole rendezvous when an agent gets SIGTERM (LocalElasticAgent._shutdown
// calls the handler's shutdown()), which ends every survivor of a scale-down
// with RendezvousClosedError. The agent is usually the container's PID 1,
// which ignores SIGKILL from inside its own namespace; in the pod's shared
// namespace PID 1 is the pause process. A user's explicit false is kept.
func shareProcesses(pod *corev1.Pod, w *warner) {
	if pod.Spec.ShareProcessNamespace == nil {
		pod.Spec.ShareProcessNamespace = new(true)
		return
	}
	if !*pod.Spec.ShareProcessNamespace {
		w.add("spec.shareProcessNamespace=false is kept; on torch 2.3 to 2.7 a scale-down then closes the rendezvous for every worker (the leave hook cannot stop the agent before its SIGTERM)")
	}
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

// sidecarParts is everything a sidecar container points to, allocated in
// one piece instead of a dozen: every sidecar gets its own, so no two pods
// share any of it.
type sidecarParts struct {
	restartPolicy            corev1.ContainerRestartPolicy
	startupProbe             corev1.Probe
	readinessProbe           corev1.Probe
	startupGet, readinessGet corev1.HTTPGetAction
	securityContext          corev1.SecurityContext
	runAsNonRoot             bool
	runAsUser, runAsGroup    int64
	allowPrivilegeEscalation bool
	privileged               bool
	readOnlyRootFilesystem   bool
	capabilities             corev1.Capabilities
	drop                     [1]corev1.Capability
	seccompProfile           corev1.SeccompProfile
	ports                    [2]corev1.ContainerPort
	mounts                   [3]corev1.VolumeMount
	args                     [17]string // the most arguments a mode has (a TLS-serving launcher)
}

// sidecar builds the rdzv-sidecar native sidecar with the command line of docs/contract.md.
func sidecar(cfg Config, s *settings, mode string, register bool, fqdn, rdzvURL string) corev1.Container {
	parts := &sidecarParts{}
	// Full slice expressions: an append to one of them must not write over
	// the next part.
	args := parts.args[:0:len(parts.args)]
	mounts := parts.mounts[:0:len(parts.mounts)]
	ports := parts.ports[:0:len(parts.ports)]
	res := cfg.Defaults.SidecarResources.Join
	mounts = append(mounts, corev1.VolumeMount{Name: constants.FilesVolumeName, MountPath: constants.FilesDir})
	if mode == ModeServe {
		res = cfg.Defaults.SidecarResources.Serve
		args = append(args, ModeServe,
			"--data-dir="+constants.DataDir,
			"--listen-client-urls="+scheme(s)+"://0.0.0.0:"+rdzvClientPort,
			"--advertise-client-urls="+rdzvURL,
			"--health-addr="+sidecarHealthAddr,
		)
		mounts = append(mounts, corev1.VolumeMount{Name: constants.DataVolumeName, MountPath: constants.DataDir})
		ports = append(ports, corev1.ContainerPort{Name: "rdzv", ContainerPort: constants.RdzvClientPort, Protocol: corev1.ProtocolTCP})
		if s.tlsSecret != "" {
			// etcd's flag names; every client must present a certificate from the CA.
			args = append(args,
				"--cert-file="+tlsCertFile,
				"--key-file="+tlsKeyFile,
				"--trusted-ca-file="+tlsCAFile,
				"--client-cert-auth",
			)
		}
	} else {
		args = append(args, ModeJoin, "--endpoints="+rdzvURL, "--health-addr="+sidecarHealthAddr)
		if s.tlsSecret != "" {
			// etcdctl's flag names: verify the server, authenticate with the same certificate.
			args = append(args,
				"--cacert="+tlsCAFile,
				"--cert="+tlsCertFile,
				"--key="+tlsKeyFile,
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
	probe := func(p *corev1.Probe, get *corev1.HTTPGetAction, period, failures int32) *corev1.Probe {
		*get = corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromInt32(constants.SidecarHealthPort)}
		*p = corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: get}, PeriodSeconds: period, FailureThreshold: failures}
		return p
	}
	parts.restartPolicy = corev1.ContainerRestartPolicyAlways
	parts.runAsNonRoot = true
	parts.runAsUser, parts.runAsGroup = 65532, 65532
	parts.allowPrivilegeEscalation, parts.privileged = false, false
	parts.readOnlyRootFilesystem = true
	parts.drop = [1]corev1.Capability{"ALL"}
	parts.capabilities = corev1.Capabilities{Drop: parts.drop[:]}
	parts.seccompProfile = corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	parts.securityContext = corev1.SecurityContext{
		RunAsNonRoot:             &parts.runAsNonRoot,
		RunAsUser:                &parts.runAsUser,
		RunAsGroup:               &parts.runAsGroup,
		AllowPrivilegeEscalation: &parts.allowPrivilegeEscalation,
		Privileged:               &parts.privileged,
		ReadOnlyRootFilesystem:   &parts.readOnlyRootFilesystem,
		Capabilities:             &parts.capabilities,
		SeccompProfile:           &parts.seccompProfile,
	}
	c := corev1.Container{
		Name:            constants.SidecarContainerName,
		Image:           cfg.SidecarImage,
		ImagePullPolicy: cfg.SidecarImagePullPolicy,
		Args:            args,
		Ports:           ports,
		RestartPolicy:   &parts.restartPolicy,
		// The trainer starts only once the sidecar answers /readyz (up to 10 minutes).
		StartupProbe:             probe(&parts.startupProbe, &parts.startupGet, 1, 600),
		ReadinessProbe:           probe(&parts.readinessProbe, &parts.readinessGet, 5, 3),
		VolumeMounts:             mounts,
		SecurityContext:          &parts.securityContext,
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	res.DeepCopyInto(&c.Resources)
	return c
}

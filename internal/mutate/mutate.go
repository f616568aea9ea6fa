package mutate

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
)

// Input is everything Mutate depends on.
type Input struct {
	// Pod is the pod being created, as the API server sent it; Mutate does not modify it.
	Pod *corev1.Pod
	// Namespace is the admission request's namespace (pod.Namespace may be empty at CREATE).
	Namespace string
	Config    Config
}

// Result is what Mutate makes of a pod.
type Result struct {
	// Pod is the mutated copy of Input.Pod.
	Pod *corev1.Pod
	// Patch is the JSON patch (RFC 6902) that turns the JSON the API server
	// sent into Pod; empty when nothing changed.
	Patch []jsonpatch.Operation
	// Warnings are for values the user set that contradict the computed ones.
	Warnings []string
}

// Sidecar modes (the first argument of rdzv-sidecar).
const (
	ModeServe = "serve"
	ModeJoin  = "join"
)

// Mutate returns a mutated copy of in.Pod with its patch and admission
// warnings, or an error whose message names the offending label or annotation
// and what would be valid (the webhook denies the pod with it).
//
// Mutate is idempotent: a pod already carrying the mutated annotation is
// returned unchanged, and mutating an output again with that annotation
// removed gives the same output (every step sets, never appends twice).
func Mutate(in Input) (Result, error) {
	if in.Pod == nil {
		return Result{}, errors.New("mutate: no pod")
	}
	pod := in.Pod.DeepCopy()
	if _, done := pod.Annotations[constants.AnnotationMutated]; done {
		// Set by us earlier in this admission (a reinvocation) there is no
		// gate left; with the chart's gate still there, the user set it.
		if slices.ContainsFunc(pod.Spec.SchedulingGates, isOurGate) {
			return Result{}, fmt.Errorf("annotation %s is the webhook's record of its own mutation, yet this pod was never mutated: remove it from the pod template (podAnnotations)", constants.AnnotationMutated)
		}
		return Result{Pod: pod}, nil
	}
	if in.Config.SidecarImage == "" {
		return Result{}, errors.New("mutate: webhook misconfigured: no sidecar image")
	}
	if in.Namespace == "" {
		return Result{}, errors.New("mutate: no namespace")
	}
	s, err := parseSettings(pod, in.Config)
	if err != nil {
		return Result{}, err
	}
	e := &editor{pod: pod, warnings: s.warnings}
	if err := mutate(e, s, in.Namespace, in.Config); err != nil {
		return Result{}, err
	}
	return Result{Pod: pod, Patch: e.ops, Warnings: e.warnings}, nil
}

func mutate(e *editor, s *settings, namespace string, cfg Config) error {
	pod := e.pod
	domain := cfg.ClusterDomain
	if domain == "" {
		domain = naming.DefaultClusterDomain
	}

	// A stable DNS name: hostname + subdomain (Indexed Jobs and StatefulSets set the hostname).
	if pod.Spec.Hostname == "" {
		if pod.Name == "" {
			return fmt.Errorf("pod has neither spec.hostname nor a name: create training pods through an Indexed Job or a StatefulSet, or set spec.hostname")
		}
		set(e, "/spec/hostname", &pod.Spec.Hostname, pod.Name)
	}
	headless := naming.HeadlessService(s.job)
	if pod.Spec.Subdomain == "" {
		set(e, "/spec/subdomain", &pod.Spec.Subdomain, headless)
	} else if pod.Spec.Subdomain != headless {
		e.warn("spec.subdomain %q is kept; the job's headless Service is %q, so this pod's name resolves only if Service %q exists",
			pod.Spec.Subdomain, headless, pod.Spec.Subdomain)
	}
	fqdn := naming.PodFQDN(pod.Spec.Hostname, pod.Spec.Subdomain, namespace, domain)
	rdzvHost := naming.ServiceFQDN(s.rdzvService, namespace, domain)
	rdzvURL := scheme(s) + "://" + rdzvHost + ":" + rdzvClientPort

	serving := s.rdzvHost && s.index == 0
	register := s.role == constants.RoleWorker

	// Labels and annotations.
	if serving {
		setKey(e, "/metadata/labels", &pod.Labels, constants.LabelRdzvServer, "true")
	} else if v, set := pod.Labels[constants.LabelRdzvServer]; set {
		e.warn("label %s=%q removed: only the index-0 pod of the group annotated %s=true serves the rendezvous",
			constants.LabelRdzvServer, v, constants.AnnotationRdzvHost)
		deleteKey(e, "/metadata/labels", pod.Labels, constants.LabelRdzvServer)
	}
	mode := ModeJoin
	if serving {
		mode = ModeServe
	}
	setKey(e, "/metadata/annotations", &pod.Annotations, constants.AnnotationMutated, "sidecar="+mode+",slots="+strconv.Itoa(s.slots))

	// Volumes.
	if err := setVolume(e, constants.FilesVolumeName); err != nil {
		return err
	}
	if serving {
		if err := setVolume(e, constants.DataVolumeName); err != nil {
			return err
		}
	}
	if s.tlsSecret != "" {
		if err := setSecretVolume(e, constants.TLSVolumeName, s.tlsSecret); err != nil {
			return err
		}
	}
	events := serving && s.framework == constants.FrameworkPyTorch && s.eventsJob != ""
	if events {
		if err := setTokenVolume(e); err != nil {
			return err
		}
	}
	if err := checkPorts(pod, serving); err != nil {
		return err
	}

	// The training container: env and the read-only files mount.
	c := &pod.Spec.Containers[s.container]
	path := "/spec/containers/" + strconv.Itoa(s.container)
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
	for _, v := range env {
		setEnv(e, path, c, v)
	}
	if err := setMount(e, path, c, constants.FilesVolumeName, constants.FilesDir, true); err != nil {
		return err
	}
	if s.framework == constants.FrameworkPyTorch {
		setLeaveHook(e, path, c)
		shareProcesses(e)
	}
	if s.tlsSecret != "" {
		// The trainer's own rendezvous client (torchrun, or a launcher's
		// `rdzv-sidecar wait`) needs the CA and the client certificate too.
		if err := setMount(e, path, c, constants.TLSVolumeName, constants.TLSDir, true); err != nil {
			return err
		}
	}

	// The native sidecar, first among the init containers so that everything
	// after it (user init containers, then the trainer) starts once it is ready.
	setSidecar(e, sidecar(cfg, s, mode, register, fqdn, rdzvURL))

	// Last: the pod may be scheduled only once everything above is in it.
	openGate(e)
	return nil
}

func isOurGate(g corev1.PodSchedulingGate) bool { return g.Name == constants.SchedulingGate }

// openGate removes the chart's scheduling gate (constants.SchedulingGate);
// other gates (a queue's, the user's) stay.
func openGate(e *editor) {
	gates := e.pod.Spec.SchedulingGates
	i := slices.IndexFunc(gates, isOurGate)
	switch {
	case i < 0:
	case len(gates) == 1: // the whole list, so that the result has none rather than an empty one
		e.pod.Spec.SchedulingGates = nil
		e.remove("/spec/schedulingGates")
	default:
		e.pod.Spec.SchedulingGates = slices.Delete(slices.Clone(gates), i, i+1)
		e.remove("/spec/schedulingGates/" + strconv.Itoa(i))
	}
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

// pytorchEnv is torchrun's configuration through its PET_* variables. The
// rank-0 address other agents connect to is this pod's FQDN (PET_LOCAL_ADDR
// on torch >= 2.2, getfqdn() before, which the hostname + subdomain make
// resolvable through the job's headless Service).
func pytorchEnv(s *settings, rdzvHost, fqdn string) []corev1.EnvVar {
	port := rdzvClientPort
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
		// The TCPStore is the serving sidecar's (rdzv-sidecar serve
		// --c10d-addr), reached through the rendezvous Service: no agent hosts
		// one, so the rendezvous outlives every worker.
		port = c10dPort
		conf["is_host"] = "false"
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
	return []corev1.EnvVar{
		{Name: "PET_RDZV_BACKEND", Value: s.backend},
		{Name: "PET_RDZV_ENDPOINT", Value: rdzvHost + ":" + port},
		{Name: "PET_RDZV_ID", Value: s.runID},
		{Name: "PET_NNODES", Value: strconv.Itoa(s.minNodes) + ":" + strconv.Itoa(s.maxNodes)},
		{Name: "PET_NPROC_PER_NODE", Value: strconv.Itoa(s.slots)},
		{Name: "PET_MAX_RESTARTS", Value: strconv.Itoa(s.maxRestarts)},
		{Name: "PET_MONITOR_INTERVAL", Value: strconv.Itoa(s.monitor)},
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
}

// rdzvConf renders torchrun's --rdzv-conf: key=value pairs, sorted so the output is stable.
func rdzvConf(conf map[string]string) string {
	pairs := make([]string, 0, len(conf))
	for _, k := range slices.Sorted(maps.Keys(conf)) {
		pairs = append(pairs, k+"="+conf[k])
	}
	return strings.Join(pairs, ",")
}

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
func setLeaveHook(e *editor, containerPath string, c *corev1.Container) {
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		if h := c.Lifecycle.PreStop.Exec; h == nil || !slices.Equal(h.Command, leaveCommand) {
			e.warn("container %q keeps its own preStop hook; without %q a scale-down waits for torch's dead-node timeout",
				c.Name, strings.Join(leaveCommand, " "))
		}
		return
	}
	hook := &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: slices.Clone(leaveCommand)}}
	if c.Lifecycle == nil {
		set(e, containerPath+"/lifecycle", &c.Lifecycle, &corev1.Lifecycle{PreStop: hook})
		return
	}
	set(e, containerPath+"/lifecycle/preStop", &c.Lifecycle.PreStop, hook)
}

// shareProcesses puts the pod's containers in one PID namespace, so that the
// leave hook can stop the torchrun agent with SIGKILL: torch 2.3 to 2.7 close
// the whole rendezvous when an agent gets SIGTERM (LocalElasticAgent._shutdown
// calls the handler's shutdown()), which ends every survivor of a scale-down
// with RendezvousClosedError. The agent is usually the container's PID 1,
// which ignores SIGKILL from inside its own namespace; in the pod's shared
// namespace PID 1 is the pause process. A user's explicit false is kept.
func shareProcesses(e *editor) {
	spec := &e.pod.Spec
	if spec.ShareProcessNamespace == nil {
		set(e, "/spec/shareProcessNamespace", &spec.ShareProcessNamespace, ptr.To(true))
		return
	}
	if !*spec.ShareProcessNamespace {
		e.warn("spec.shareProcessNamespace=false is kept; on torch 2.3 to 2.7 a scale-down then closes the rendezvous for every worker (the leave hook cannot stop the agent before its SIGTERM)")
	}
}

// setEnv adds v to c unless the user already set that variable: the user's
// value wins, with a warning when it differs from the computed one.
func setEnv(e *editor, containerPath string, c *corev1.Container, v corev1.EnvVar) {
	for _, have := range c.Env {
		if have.Name != v.Name {
			continue
		}
		if have.ValueFrom == nil && have.Value != v.Value {
			e.warn("env %s=%q set in container %q is kept; the webhook computed %q", v.Name, have.Value, c.Name, v.Value)
		}
		return
	}
	appendTo(e, containerPath+"/env", &c.Env, v)
}

// setVolume adds the emptyDir name; a volume of that name that is not an
// emptyDir is a conflict (the sidecar must be able to write to it).
func setVolume(e *editor, name string) error {
	for _, v := range e.pod.Spec.Volumes {
		if v.Name == name {
			if v.EmptyDir == nil {
				return fmt.Errorf("volume name %q is reserved for the emptyDir the webhook shares with the sidecar: rename the pod's volume", name)
			}
			return nil
		}
	}
	appendTo(e, "/spec/volumes", &e.pod.Spec.Volumes, corev1.Volume{
		Name:         name,
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
	})
	return nil
}

// setSecretVolume adds a volume name from Secret secret. A pod volume of that
// name from the same Secret is kept (a re-mutation, or the API server's
// defaults on it); anything else is a conflict: the sidecar and the trainer
// must read the Secret the annotation names, not whatever the pod put there.
func setSecretVolume(e *editor, name, secret string) error {
	for _, v := range e.pod.Spec.Volumes {
		if v.Name == name {
			if v.Secret == nil || v.Secret.SecretName != secret {
				return fmt.Errorf("volume name %q is reserved for the rendezvous TLS Secret %q (annotation %s): rename the pod's volume",
					name, secret, constants.AnnotationRdzvTLSSecret)
			}
			return nil
		}
	}
	appendTo(e, "/spec/volumes", &e.pod.Spec.Volumes, corev1.Volume{
		Name:         name,
		VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret}},
	})
	return nil
}

// TokenVolume is the serving sidecar's API token (constants.TokenVolumeName):
// what the kubelet mounts for automountServiceAccountToken, for one container.
func TokenVolume() corev1.Volume {
	return corev1.Volume{Name: constants.TokenVolumeName, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](constants.TokenExpirationSeconds)}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		},
		DefaultMode: ptr.To[int32](0o644),
	}}}
}

// setTokenVolume adds TokenVolume; a pod volume of that name that is not a
// projected volume is a conflict.
func setTokenVolume(e *editor) error {
	for _, v := range e.pod.Spec.Volumes {
		if v.Name == constants.TokenVolumeName {
			if v.Projected == nil {
				return fmt.Errorf("volume name %q is reserved for the rendezvous sidecar's API token: rename the pod's volume", v.Name)
			}
			return nil
		}
	}
	appendTo(e, "/spec/volumes", &e.pod.Spec.Volumes, TokenVolume())
	return nil
}

// checkPorts denies pods whose containers already use the sidecar's ports
// (all containers of a pod share one network namespace).
func checkPorts(pod *corev1.Pod, serving bool) error {
	taken := map[int32]string{constants.SidecarHealthPort: "the sidecar's health port"}
	if serving {
		taken[constants.RdzvClientPort] = "the rendezvous client port"
		taken[constants.C10dPort] = "the c10d store's port"
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

func setMount(e *editor, containerPath string, c *corev1.Container, volume, mountPath string, readOnly bool) error {
	for _, m := range c.VolumeMounts {
		if m.MountPath == mountPath && m.Name != volume {
			return fmt.Errorf("container %q mounts volume %q at %s, which the webhook needs for volume %q: mount it elsewhere", c.Name, m.Name, mountPath, volume)
		}
		if m.Name == volume && m.MountPath == mountPath {
			return nil
		}
	}
	appendTo(e, containerPath+"/volumeMounts", &c.VolumeMounts, corev1.VolumeMount{Name: volume, MountPath: mountPath, ReadOnly: readOnly})
	return nil
}

// setSidecar puts sc in front of the pod's init containers, in place of an
// older container of its name. Each change is its own operation, so the pod's
// other init containers are never rewritten: fields this binary does not know
// stay with the container that has them.
func setSidecar(e *editor, sc corev1.Container) {
	const initPath = "/spec/initContainers"
	inits := &e.pod.Spec.InitContainers
	// From the end, so that every index still means what it did.
	for i := len(*inits) - 1; i >= 0; i-- {
		if (*inits)[i].Name == constants.SidecarContainerName {
			e.remove(initPath + "/" + strconv.Itoa(i))
			*inits = slices.Delete(*inits, i, i+1)
		}
	}
	if len(*inits) == 0 {
		set(e, initPath, inits, []corev1.Container{sc})
		return
	}
	e.add(initPath+"/0", sc)
	*inits = slices.Insert(*inits, 0, sc)
}

// sidecar builds the rdzv-sidecar native sidecar with the command line of docs/contract.md.
func sidecar(cfg Config, s *settings, mode string, register bool, fqdn, rdzvURL string) corev1.Container {
	var args []string
	res := cfg.Defaults.SidecarResources.Join
	mounts := []corev1.VolumeMount{{Name: constants.FilesVolumeName, MountPath: constants.FilesDir}}
	var ports []corev1.ContainerPort
	if mode == ModeServe {
		res = cfg.Defaults.SidecarResources.Serve
		args = append(args, ModeServe,
			"--data-dir="+constants.DataDir,
			"--listen-client-urls="+scheme(s)+"://0.0.0.0:"+rdzvClientPort,
			"--advertise-client-urls="+rdzvURL,
			"--health-addr="+sidecarHealthAddr,
		)
		mounts = append(mounts, corev1.VolumeMount{Name: constants.DataVolumeName, MountPath: constants.DataDir})
		ports = append(ports,
			corev1.ContainerPort{Name: "rdzv", ContainerPort: constants.RdzvClientPort, Protocol: corev1.ProtocolTCP},
			corev1.ContainerPort{Name: "c10d", ContainerPort: constants.C10dPort, Protocol: corev1.ProtocolTCP})
		if s.framework == constants.FrameworkPyTorch && s.eventsJob != "" {
			args = append(args, "--events-job="+s.eventsJob)
			mounts = append(mounts, corev1.VolumeMount{Name: constants.TokenVolumeName, MountPath: constants.TokenDir, ReadOnly: true})
		}
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
	probe := func(period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: "/readyz", Port: intstr.FromInt32(constants.SidecarHealthPort)}},
			PeriodSeconds: period, FailureThreshold: failures,
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
		StartupProbe:             probe(1, 600),
		ReadinessProbe:           probe(5, 3),
		VolumeMounts:             mounts,
		SecurityContext:          SidecarSecurityContext(),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		Resources:                *res.DeepCopy(),
	}
}

// SidecarSecurityContext is the sidecar's: it needs no privilege at all, and
// satisfies the restricted Pod Security level.
func SidecarSecurityContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsNonRoot:             ptr.To(true),
		RunAsUser:                ptr.To[int64](65532),
		RunAsGroup:               ptr.To[int64](65532),
		AllowPrivilegeEscalation: ptr.To(false),
		Privileged:               ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

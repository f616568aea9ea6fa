package mutate

import (
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/podreplace"
)

// Sidecar modes (the first argument of rdzv-sidecar).
const (
	modeServe = "serve"
	modeJoin  = "join"
)

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
func sidecar(cfg Config, s *settings, mode string, register bool, fqdn, rdzvHost, rdzvURL string) corev1.Container {
	return corev1.Container{
		Name:            constants.SidecarContainerName,
		Image:           cfg.SidecarImage,
		ImagePullPolicy: cfg.SidecarImagePullPolicy,
		Args:            sidecarArgs(s, mode, register, fqdn, rdzvHost, rdzvURL),
		Env:             sidecarEnv(s, mode),
		Ports:           sidecarPorts(s, mode),
		RestartPolicy:   ptr.To(corev1.ContainerRestartPolicyAlways),
		// The trainer starts only once the sidecar has started: its postStart hook returned (within a minute), or it
		// answered its startup probe (within 10 minutes).
		Lifecycle:                startHook(s),
		StartupProbe:             startProbe(s),
		ReadinessProbe:           healthProbe(s, "/readyz", 5, 3),
		VolumeMounts:             sidecarMounts(s, mode),
		SecurityContext:          sidecarSecurityContext(),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		Resources:                s.sidecarResources(mode),
	}
}

// sidecarArgs is the command line: the mode's own flags, then its TLS flags, then the member's, which every mode
// registers with.
func sidecarArgs(s *settings, mode string, register bool, fqdn, rdzvHost, rdzvURL string) []string {
	var args []string
	if mode == modeServe {
		args = serveArgs(s, rdzvHost, rdzvURL)
	} else {
		args = joinArgs(s, register, rdzvHost, rdzvURL)
	}
	args = append(args, tlsArgs(s, mode)...)
	args = append(args, memberArgs(s, register, fqdn)...)
	if s.checkpointBytes > 0 {
		args = append(args, "--checkpoint-dir="+constants.CheckpointSavesDir, "--checkpoint-memory="+strconv.FormatInt(s.checkpointBytes, 10))
		if s.ports.Checkpoint != constants.CheckpointPort {
			args = append(args, "--checkpoint-addr=:"+port(s.ports.Checkpoint))
		}
		if s.hostNetwork {
			args = append(args, "--checkpoint-local="+constants.CheckpointSocket)
		}
		if s.checkpointReplicas != 1 {
			args = append(args, "--checkpoint-replicas="+strconv.Itoa(s.checkpointReplicas))
		}
	}
	if s.progressOn() {
		args = append(args, "--progress-addr="+s.progressAddr())
		if s.framework == constants.FrameworkPyTorch {
			args = append(args, "--run-id="+s.runID) // else into the job's etcd, for the MPI launcher's supervise
		}
	}
	return args
}

// progressAddr is where a PyTorch pod's ranks say their steps (elastic_training.progress): its sidecar, on loopback,
// or on host networking, whose loopback is the node's, a datagram socket in the pod's own files volume.
func (s *settings) progressAddr() string {
	if s.hostNetwork {
		return constants.UnixAddrPrefix + constants.ProgressSocket
	}
	return "127.0.0.1:" + strconv.Itoa(constants.ProgressPort)
}

// checkpointURL is where the trainer asks its sidecar what to load (elastic_training.checkpoint): as progressAddr.
func (s *settings) checkpointURL() string {
	if s.hostNetwork {
		return constants.UnixAddrPrefix + constants.CheckpointSocket
	}
	return "http://127.0.0.1:" + strconv.Itoa(constants.CheckpointPort)
}

// progressOn says whether the pod's ranks report progress to its sidecar (docs/hangs.md): PyTorch on the
// elastic-training backend, whose rounds the serving sidecar can restart, and an MPI job's workers, whose runs the
// launcher's `rdzv-sidecar launch` (supervise) can stop and run again.
func (s *settings) progressOn() bool {
	switch s.framework {
	case constants.FrameworkPyTorch:
		return s.backend == constants.BackendElasticTraining
	case constants.FrameworkMPI:
		return s.role == constants.RoleWorker
	}
	return false
}

// replaces says whether the pod's serving sidecar may have the webhook replace a pod of the job blamed for
// repeated hangs (internal/podreplace): hangs are on, the job did not set hang.replaceAfter to 0, and the webhook
// says where to ask and which CA signs its certificate.
func (s *settings) replaces() bool {
	return s.framework == constants.FrameworkPyTorch && s.progressOn() && !s.hangOff && s.hangReplaceAfter != 0 && s.replace.URL != "" && len(s.replace.CA) > 0
}

func serveArgs(s *settings, rdzvHost, rdzvURL string) []string {
	args := []string{modeServe,
		"--data-dir=" + constants.DataDir,
		"--listen-client-urls=" + scheme(s) + "://0.0.0.0:" + port(s.ports.Client),
		"--advertise-client-urls=" + rdzvURL,
		"--health-addr=" + s.healthAddr(),
	}
	if s.ports != constants.DefaultPorts {
		// Host networking: the job's own ports (the node's loopback is every host-network pod's), and the
		// Service's c10d port, which the trainer's connections go to while another pod serves.
		args = append(args, "--listen-peer-urls=http://127.0.0.1:"+port(s.ports.Peer),
			"--c10d-addr=:"+port(s.ports.C10d), "--c10d-upstream="+rdzvHost+":"+svcC10dPort)
	}
	if s.framework == constants.FrameworkPyTorch && s.eventsJob != "" {
		args = append(args, "--events-job="+s.eventsJob)
	}
	if s.forceDeleteLostOf != "" {
		args = append(args, "--force-delete-lost-pods-of="+s.forceDeleteLostOf)
	}
	// A candidate: it serves while it holds the Lease of the rendezvous Service's name (internal/servinglease).
	args = append(args, "--lease="+s.rdzvService)
	if s.index > 0 {
		args = append(args, "--standby")
	}
	if s.verifiesStore() {
		args = append(args, "--c10d-verify")
	}
	if s.framework == constants.FrameworkPyTorch {
		// Only the job's backend's handlers see the stores' writes (torch's own backends' code stays off the own
		// rendezvous' path).
		args = append(args, "--backend="+s.backend)
		if s.keepSurvivors {
			args = append(args, "--restart-survivors=false")
		}
		if s.backend == constants.BackendElasticTraining {
			switch {
			case s.hangOff:
				args = append(args, "--hang=false")
			case s.hangTimeout > 0:
				args = append(args, "--hang-timeout="+strconv.Itoa(s.hangTimeout)+"s")
			}
			if s.replaces() {
				args = append(args, "--replace-url="+s.replace.URL)
				if s.hangReplaceAfter > 0 {
					args = append(args, "--hang-replace-after="+strconv.Itoa(s.hangReplaceAfter))
				}
			}
		}
	}
	return args
}

func joinArgs(s *settings, register bool, rdzvHost, rdzvURL string) []string {
	args := []string{modeJoin, "--endpoints=" + rdzvURL, "--health-addr=" + s.healthAddr()}
	if s.framework == constants.FrameworkPyTorch && constants.OnSidecarStore(s.backend) {
		args = append(args, "--c10d-addr="+s.c10dLocal(), "--c10d-upstream="+rdzvHost+":"+svcC10dPort)
		if s.verifiesStore() && register {
			args = append(args, "--c10d-verify")
		}
	}
	return args
}

func tlsArgs(s *settings, mode string) []string {
	if s.tlsSecret == "" {
		return nil
	}
	if mode == modeServe {
		// etcd's flag names; every client must present a certificate from the CA.
		return []string{"--cert-file=" + tlsCertFile, "--key-file=" + tlsKeyFile, "--trusted-ca-file=" + tlsCAFile, "--client-cert-auth"}
	}
	// etcdctl's flag names: verify the server, authenticate with the same certificate.
	return []string{"--cacert=" + tlsCAFile, "--cert=" + tlsCertFile, "--key=" + tlsKeyFile}
}

func memberArgs(s *settings, register bool, fqdn string) []string {
	args := []string{
		"--files-dir=" + constants.FilesDir,
		"--hostfile-flavour=" + s.flavour,
		"--register=" + strconv.FormatBool(register),
		"--member-host=" + fqdn,
		"--member-slots=" + strconv.Itoa(s.slots),
		"--member-group=" + s.group,
		"--member-index=" + strconv.Itoa(s.index),
	}
	if s.leaseTTL > 0 {
		args = append(args, "--lease-ttl="+strconv.Itoa(s.leaseTTL)+"s")
	}
	if s.role == constants.RoleLauncher {
		args = append(args, "--install-helper")
	}
	return args
}

// sidecarEnv gives a serving sidecar its pod's name and IP: the Lease's holder, and the Service's endpoint while it
// holds it. A joining sidecar takes no Lease.
// With in-memory checkpoints it gets its node's name too: copies go to other nodes first.
func sidecarEnv(s *settings, mode string) []corev1.EnvVar {
	var env []corev1.EnvVar
	if mode == modeServe {
		env = append(env,
			corev1.EnvVar{Name: constants.EnvPodName, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
			corev1.EnvVar{Name: constants.EnvPodIP, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"}}})
	}
	if s.replaces() {
		if mode == modeServe {
			env = append(env, corev1.EnvVar{Name: constants.EnvWebhookCA, Value: string(s.replace.CA)})
		} else {
			// A member names its pod (membership.Member.Pod), so that the serving sidecar can name it to the webhook.
			env = append(env, corev1.EnvVar{Name: constants.EnvPodName, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}})
		}
	}
	if s.checkpointBytes > 0 {
		env = append(env, corev1.EnvVar{Name: constants.EnvNodeName, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "spec.nodeName"}}})
	}
	return env
}

func sidecarPorts(s *settings, mode string) []corev1.ContainerPort {
	var ports []corev1.ContainerPort
	if mode == modeServe {
		ports = append(ports,
			corev1.ContainerPort{Name: "rdzv", ContainerPort: s.ports.Client, Protocol: corev1.ProtocolTCP},
			corev1.ContainerPort{Name: "c10d", ContainerPort: s.ports.C10d, Protocol: corev1.ProtocolTCP})
	}
	if s.checkpointBytes > 0 {
		ports = append(ports, corev1.ContainerPort{Name: "checkpoints", ContainerPort: s.ports.Checkpoint, Protocol: corev1.ProtocolTCP})
	}
	// The health port stays plain HTTP with or without TLS (the sidecar serves
	// it apart from the client URLs), so the kubelet's HTTP probes keep working.
	return append(ports, corev1.ContainerPort{Name: "rdzv-health", ContainerPort: s.ports.Health, Protocol: corev1.ProtocolTCP})
}

// startPath is where the sidecar's start gate (startHook, startProbe), which the trainer waits for, asks. /startz
// (the sidecar's files installed, its store or its proxy listening) for a pod of a PyTorch job on the own
// rendezvous, whose agent waits
// for the store and for this pod's registration itself (docs/contract.md): torch's import then overlaps the store's
// start and the registration (the dedicated rendezvous pod's template says the same, with no trainer to start).
// /readyz (this pod registered, its files current) for every other trainer: torch's c10d and etcd backends, which
// give up on a store that does not answer within their timeout, and MPI's and MXNet's programs, which read the
// job's files as they start.
func (s *settings) startPath() string {
	if s.framework == constants.FrameworkPyTorch && s.backend == constants.BackendElasticTraining {
		return "/startz"
	}
	return "/readyz"
}

// How long the trainer waits for its sidecar to start before the kubelet restarts the sidecar. The hook's /startz
// comes within a second (the files installed, the store or the proxy listening), and while a hook runs the kubelet
// shows the sidecar as PodInitializing and `kubectl logs` refuses it, so a sidecar stuck before it should not stay
// hidden for long: after a minute the kubelet restarts it, with the hook's error in a FailedPostStartHook Event and
// its log under --previous. /readyz waits for the registration, which can take minutes while the store comes.
const (
	startHookTimeout  = time.Minute
	startProbeTimeout = 10 * time.Minute
)

// startHook holds the trainer until /startz answers, for the pods whose sidecar starts in well under a second
// (startPath: /startz). A postStart hook holds the kubelet's sync that started the sidecar, and the next sync starts
// the trainer; a startup probe's first success waits for the pod's status to show the sidecar running and then for
// the probe's next tick. Measured on the local cluster (kubelet 1.36, a busybox sidecar ready 0.1 s after it
// starts, 8 pods each): the trainer 0.22 s after its sidecar with the hook, 1.24 s with a 1 s startup probe.
// /readyz waits for this pod's registration, which can take minutes when the store is slow to come: those keep the
// probe.
func startHook(s *settings) *corev1.Lifecycle {
	if s.startPath() != "/startz" {
		return nil
	}
	return &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{
		constants.SidecarImageBinary, "started",
		"--url=http://127.0.0.1:" + port(s.ports.Health) + "/startz",
		"--timeout=" + startHookTimeout.String(),
	}}}}
}

// startProbe is the startup probe of the sidecars without a start hook.
func startProbe(s *settings) *corev1.Probe {
	if startHook(s) != nil {
		return nil
	}
	return healthProbe(s, s.startPath(), 1, int32(startProbeTimeout/time.Second))
}

func healthProbe(s *settings, path string, period, failures int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: path, Port: intstr.FromInt32(s.ports.Health)}},
		PeriodSeconds: period, FailureThreshold: failures,
	}
}

// sidecarMounts gives a serving sidecar its store's data and its API token besides what every sidecar mounts.
func sidecarMounts(s *settings, mode string) []corev1.VolumeMount {
	mounts := []corev1.VolumeMount{{Name: constants.FilesVolumeName, MountPath: constants.FilesDir}}
	if mode == modeServe {
		mounts = append(mounts,
			corev1.VolumeMount{Name: constants.DataVolumeName, MountPath: constants.DataDir},
			corev1.VolumeMount{Name: constants.TokenVolumeName, MountPath: constants.TokenDir, ReadOnly: true})
	}
	if s.tlsSecret != "" {
		mounts = append(mounts, corev1.VolumeMount{Name: constants.TLSVolumeName, MountPath: constants.TLSDir, ReadOnly: true})
	}
	if s.checkpointBytes > 0 {
		mounts = append(mounts, corev1.VolumeMount{Name: constants.CheckpointVolumeName, MountPath: constants.CheckpointDir})
	}
	return mounts
}

// verifiesStore says whether the pod's sidecar carries its trainer's c10d connections only to a store that names
// itself a pod of the job (internal/sidecar verify.go): PyTorch on c10d, from contract 2 on, whose serving sidecars
// (admitted by a webhook of contract 2 or later) name themselves; a job of an older chart keeps the Service's word.
func (s *settings) verifiesStore() bool {
	return s.framework == constants.FrameworkPyTorch && constants.OnSidecarStore(s.backend) && s.contract >= 2
}

// sidecarSecurityContext is the sidecar's: it needs no privilege at all, and
// satisfies the restricted Pod Security level.
func sidecarSecurityContext() *corev1.SecurityContext {
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

// tokenVolume is the serving sidecar's API token (constants.TokenVolumeName):
// what the kubelet mounts for automountServiceAccountToken, for one container; and, where it may ask for a pod's
// replacement, its token for the webhook (an audience of its own: the API token is never sent to the webhook).
func tokenVolume(s *settings) corev1.Volume {
	v := corev1.Volume{Name: constants.TokenVolumeName, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](constants.TokenExpirationSeconds)}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		},
		DefaultMode: ptr.To[int32](0o644),
	}}}
	if s.replaces() {
		v.Projected.Sources = append(v.Projected.Sources, corev1.VolumeProjection{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
			Audience: podreplace.Audience, Path: podreplace.TokenPath, ExpirationSeconds: ptr.To[int64](constants.TokenExpirationSeconds)}})
	}
	return v
}

// Package constants is the contract between the job chart, the admission
// webhook and the rendezvous sidecar: every label, annotation, env var name,
// path and port that more than one of them uses is defined here, once.
// docs/contract.md explains the same contract for people.
package constants

// Domain prefixes every label and annotation we own.
const Domain = "elastic-training.io"

// Labels the chart puts on every pod it renders. The webhook's objectSelector
// keys on LabelJob, so a pod without it is never sent to the webhook.
const (
	// LabelJob names the training job (the chart's fullname). Its presence is
	// what makes a pod a training pod.
	LabelJob = Domain + "/job"
	// LabelRole is the pod's role in the job: one of the Role* values.
	LabelRole = Domain + "/role"
	// LabelGroup is the worker group (a Job or StatefulSet of the chart).
	LabelGroup = Domain + "/group"
	// LabelStatus ("true") marks the one Job of a job that carries its status annotations (internal/jobstatus), so
	// that one command lists every job of a namespace: `kubectl get jobs -l elastic-training.io/status ...`.
	LabelStatus = Domain + "/status"
)

// SchedulingGate is in every pod template the chart renders for the webhook
// to mutate, and only the webhook removes it: a pod created without the
// webhook (not installed, namespace excluded) stays SchedulingGated instead of
// training alone as a one-node job with no rendezvous.
const SchedulingGate = Domain + "/webhook"

// Roles (values of LabelRole).
const (
	RoleWorker    = "worker"    // a training member (torchrun agent, MPI worker, MXNet worker)
	RoleLauncher  = "launcher"  // the MPI launcher: runs mpirun, not in the hostfile
	RoleScheduler = "scheduler" // the MXNet scheduler
	RoleServer    = "server"    // an MXNet parameter server
	RoleRdzv      = "rdzv"      // a dedicated rendezvous pod: rendered by the chart, the webhook sets only its image
	RoleTest      = "test"      // the job chart's `helm test` pod: likewise
)

// SidecarImagePlaceholder is the image the job chart gives the rdzv-sidecar containers of its own pods (roles
// RoleRdzv and RoleTest) when the user names none: the webhook replaces it with the sidecar image it injects, so
// that the image is set in one place, the webhook chart. A pod still carrying it has not been through the webhook
// (it also keeps the SchedulingGate); `.invalid` (RFC 2606) makes sure no registry ever serves it.
const SidecarImagePlaceholder = "elastic-training.invalid/rdzv-sidecar:set-by-the-webhook"

// AnnotationMutatedImage is AnnotationMutated's value on a RoleRdzv or RoleTest pod whose image the webhook set.
const AnnotationMutatedImage = "image"

// Group names (values of LabelGroup) the job chart gives its fixed groups; workload = naming.Workload(job, group).
// User-named worker groups (chart value workerGroups.<name>) may not take these names.
const (
	GroupWorker    = "worker"    // the main worker group (chart value workers)
	GroupLauncher  = "launcher"  // the MPI launcher Job
	GroupScheduler = "scheduler" // the MXNet scheduler Job
	GroupServer    = "server"    // the MXNet parameter servers Job
	GroupRdzv      = "rdzv"      // the dedicated rendezvous Deployment (role rdzv)
)

// Frameworks (values of AnnotationFramework).
const (
	FrameworkPyTorch = "pytorch"
	FrameworkMPI     = "mpi"
	FrameworkMXNet   = "mxnet"
	FrameworkCustom  = "custom"
)

// The valid values, each listed once: the webhook's checks and denial
// messages, the sidecar's flags and the charts' schemas (test/helm checks
// their enums against these) all use them.
var (
	Frameworks      = []string{FrameworkCustom, FrameworkMPI, FrameworkMXNet, FrameworkPyTorch}
	Backends        = []string{BackendEtcdV2, BackendEtcd, BackendC10d, BackendElasticTraining}
	MPIFlavours     = []string{FlavourOpenMPI, FlavourMPICH, FlavourIntelMPI}
	HostfileFormats = append(MPIFlavours[:len(MPIFlavours):len(MPIFlavours)], FormatHorovod)
	PullPolicies    = []string{"Always", "IfNotPresent", "Never"}
)

// Annotations the chart puts on pod templates: the job's settings. The chart
// writes job-wide values (sums over groups); the webhook computes per-pod ones.
const (
	AnnotationFramework = Domain + "/framework"
	// AnnotationMinNodes and AnnotationMaxNodes: job-wide member counts (torchrun --nnodes=min:max).
	AnnotationMinNodes = Domain + "/min-nodes"
	AnnotationMaxNodes = Domain + "/max-nodes"
	// AnnotationRunID is unique per job install (generated once by the chart and kept across upgrades).
	AnnotationRunID = Domain + "/run-id"
	// AnnotationRdzvBackend: one of the Backend* values.
	AnnotationRdzvBackend = Domain + "/rdzv-backend"
	// AnnotationRdzvHost: "true" on the group whose index-0 pod serves the rendezvous.
	AnnotationRdzvHost = Domain + "/rdzv-host"
	// AnnotationRdzvService overrides the rendezvous Service name (default naming.RendezvousService).
	AnnotationRdzvService = Domain + "/rdzv-service"
	// Timeouts in whole seconds.
	AnnotationRdzvJoinTimeout     = Domain + "/rdzv-join-timeout"
	AnnotationRdzvLastCallTimeout = Domain + "/rdzv-last-call-timeout"
	AnnotationRdzvCloseTimeout    = Domain + "/rdzv-close-timeout"
	AnnotationMaxRestarts         = Domain + "/max-restarts"
	AnnotationMonitorInterval     = Domain + "/monitor-interval"
	// AnnotationHangTimeout: seconds without any rank's progress that are a hang, or "off" (docs/hangs.md); absent:
	// the serving sidecar's rule (the larger of 60 s and ten median steps). The job chart renders it only when
	// hang.enabled or hang.timeout is not the default, so a default job needs no newer webhook.
	AnnotationHangTimeout = Domain + "/hang-timeout"
	// AnnotationHangReplaceAfter: hangs blamed on one pod before the serving sidecar has the webhook replace it, 0 for
	// never (internal/podreplace); absent: the sidecar's default, 2. Rendered only when hang.replaceAfter is not 2.
	AnnotationHangReplaceAfter = Domain + "/hang-replace-after"
	// MaxHangReplaceAfter bounds it: more hangs than this on one pod are a job to stop, not to wait out.
	MaxHangReplaceAfter = 100
	// AnnotationCheckpointReplicas: copies of each piece of an in-memory checkpoint on other pods (docs/checkpoints.md);
	// absent: 1. Rendered by the job chart only when checkpoint.replicas is not 1.
	AnnotationCheckpointReplicas = Domain + "/checkpoint-replicas"
	// AnnotationCheckpointPersist: a directory on a volume of the trainer's where every
	// AnnotationCheckpointPersistEvery-th step's save is also copied (absent: none; every absent: 100). The job chart
	// renders both with persistence.enabled and checkpoint.memory: <persistence.mountPath>/elastic-training/<job>.
	AnnotationCheckpointPersist      = Domain + "/checkpoint-persist"
	AnnotationCheckpointPersistEvery = Domain + "/checkpoint-persist-every"
	// AnnotationWarmStart "false" starts every worker of a PyTorch pod as a fresh `python -u <script>`, as torchrun
	// does by default; absent or "true": from a fork server with torch imported once per pod where the trainer's
	// command allows it (docs/warm-start.md). The job chart renders it only for warmStart: false.
	AnnotationWarmStart = Domain + "/warm-start"
	// AnnotationRdzvTLSSecret names a Secret (tls.crt, tls.key, ca.crt) for rendezvous TLS; empty = plain HTTP.
	AnnotationRdzvTLSSecret = Domain + "/rdzv-tls-secret"
	// AnnotationSlots overrides the slot count the webhook computes from accelerators.
	AnnotationSlots = Domain + "/slots"
	// AnnotationContainer names the training container (default: kubectl.kubernetes.io/default-container, else the first).
	AnnotationContainer = Domain + "/container"
	// AnnotationMPIFlavour: one of the Flavour* values.
	AnnotationMPIFlavour = Domain + "/mpi-flavour"
	// AnnotationNumServers and AnnotationNumWorkers: MXNet job-wide counts (DMLC_NUM_SERVER, DMLC_NUM_WORKER).
	AnnotationNumServers = Domain + "/num-servers"
	AnnotationNumWorkers = Domain + "/num-workers"
	// AnnotationPSPort is the MXNet scheduler port (DMLC_PS_ROOT_PORT).
	AnnotationPSPort = Domain + "/ps-port"
	// AnnotationRdzvEvents names the Job on which the serving sidecar records each torch rendezvous round as an
	// Event (PyTorch; the chart sets it with the RBAC that allows it). Empty: no Events, no token.
	AnnotationRdzvEvents = Domain + "/rdzv-events"
	// AnnotationRdzvRestartSurvivors "false" turns off the serving sidecar's restart of torch's survivors when
	// torch drops a lost participant (internal/torchbackends/survivors; PyTorch, c10d). Default true.
	AnnotationRdzvRestartSurvivors = Domain + "/rdzv-restart-survivors"
	// AnnotationRdzvLeaseTTL: whole seconds (MinLeaseTTL to MaxLeaseTTL) that a member's registration outlives its
	// pod's last word: a pod whose node is lost, or that stops answering, leaves the membership (and its job's round)
	// this long after. Absent: the sidecar's default (docs/failures.md).
	AnnotationRdzvLeaseTTL = Domain + "/rdzv-lease-ttl"
	// AnnotationRdzvPorts moves a job's sidecar ports off their defaults (host networking: two jobs' pods on one
	// node share its ports): the rendezvous client port is its value, the peer, health and c10d ports the three
	// after it (PortsFrom).
	AnnotationRdzvPorts = Domain + "/rdzv-ports"
	// AnnotationRdzvStandbys is how many pods after the rdzv-host group's index 0 (indices 1..n) stand by to serve
	// the rendezvous when the pod that serves it is lost (internal/servinglease); absent: none.
	AnnotationRdzvStandbys = Domain + "/rdzv-standbys"
	// AnnotationForceDeleteLostPods names the job's member StatefulSets (comma-separated) whose pods the serving
	// sidecar force-deletes once Kubernetes evicts them from a lost node (internal/lostpods; the chart sets it with
	// the RBAC that allows it). Empty: none, no token for it.
	AnnotationForceDeleteLostPods = Domain + "/force-delete-lost-pods"
	// AnnotationSidecarResources sets the injected sidecar's resources for this pod (the chart renders it from
	// rendezvous.sidecarResources on every pod of the job): JSON {"serve": <resources>, "join": <resources>}, each key
	// optional, each a container's resources ({"requests": {...}, "limits": {...}} of SidecarResourceNames). A mode it
	// names replaces the webhook's default for that mode whole (--sidecar-serve-resources, --sidecar-join-resources);
	// a mode it leaves out keeps the default. Whatever the value, a sidecar beside a Guaranteed-shaped trainer is made
	// Guaranteed-shaped too (docs/contract.md), or the pod could never be Guaranteed.
	AnnotationSidecarResources = Domain + "/sidecar-resources"
	// AnnotationMutated is written by the webhook; its presence makes a second mutation a no-op.
	AnnotationMutated = Domain + "/mutated"
	// AnnotationContract is the ContractVersion of the job chart that rendered the pod; absent: 1 (the charts
	// before it). A webhook denies a pod of a newer contract than its own, naming both (upgrade the webhook first).
	AnnotationContract = Domain + "/contract"
)

// ContractVersion is the version of what the job chart and the webhook agree on: the annotations, labels and
// their meaning (docs/contract.md). It grows by one whenever a job chart may render a pod that an older webhook
// would mutate wrongly or deny; a webhook serves every contract up to its own (CHANGELOG.md has the table).
//   - 1: the charts up to 0.1.0 (no annotation).
//   - 2: annotation contract.
const ContractVersion = 2

// PodAnnotations are the annotations of our Domain a pod may carry when it
// is created (AnnotationMutated is the webhook's own); the webhook denies any
// other key of the Domain, which is a typo that would otherwise be ignored.
var PodAnnotations = []string{AnnotationFramework, AnnotationMinNodes, AnnotationMaxNodes, AnnotationRunID,
	AnnotationRdzvBackend, AnnotationRdzvHost, AnnotationRdzvService, AnnotationRdzvJoinTimeout,
	AnnotationRdzvLastCallTimeout, AnnotationRdzvCloseTimeout, AnnotationMaxRestarts, AnnotationMonitorInterval,
	AnnotationRdzvTLSSecret, AnnotationSlots, AnnotationContainer, AnnotationMPIFlavour, AnnotationNumServers,
	AnnotationNumWorkers, AnnotationPSPort, AnnotationRdzvEvents, AnnotationRdzvRestartSurvivors,
	AnnotationForceDeleteLostPods, AnnotationRdzvStandbys, AnnotationRdzvPorts, AnnotationContract,
	AnnotationSidecarResources, AnnotationHangTimeout, AnnotationHangReplaceAfter, AnnotationCheckpointReplicas, AnnotationCheckpointPersist,
	AnnotationCheckpointPersistEvery, AnnotationWarmStart, AnnotationRdzvLeaseTTL}

// MinLeaseTTL and MaxLeaseTTL bound AnnotationRdzvLeaseTTL, in seconds: etcd grants no shorter lease, and a member
// that stays listed longer than a minute after its node is gone only delays the job.
// DefaultLeaseTTL is the sidecar's, without the annotation. 2 s (etcd's shortest) loses no lease while a node's CPU is
// saturated (`make bench-lease`); 3 s still tolerates about 2 s of a node's silence (a network stall) and lets the
// survivors of a lost node train again within 3 s (`make bench-node-loss`). A serving pod cut off from the others
// sees their leases end within that time too: it lets no round form on that until it has renewed its Lease
// (internal/servinglease), which a cut-off pod cannot (docs/failures.md, "The member lease").
const (
	MinLeaseTTL     = 2
	MaxLeaseTTL     = 60
	DefaultLeaseTTL = 3
)

// MaxSlots bounds a pod's slot count (accelerators or AnnotationSlots): no
// node has more, and a typo such as 40000 must not become 40000 processes.
const MaxSlots = 1024

// MaxRdzvStandbys bounds AnnotationRdzvStandbys: each standby reads the
// rendezvous Lease from the API server every 2 s, and a few on separate nodes
// survive any likely loss.
const MaxRdzvStandbys = 8

// MaxForceDeleteSets bounds AnnotationForceDeleteLostPods: a job's member StatefulSets, one per MPI worker group
// (the chart's group names are DNS labels of at most 20 characters, so no job needs more).
const MaxForceDeleteSets = 64

// MaxSidecarResourcesBytes bounds AnnotationSidecarResources before it is parsed: two modes of requests and limits
// of three resources take a few hundred bytes, and the webhook decodes it on every pod it admits.
const MaxSidecarResourcesBytes = 4096

// SidecarResourceNames are the resources AnnotationSidecarResources may set. The sidecar uses no accelerator, and
// an extended resource there would be a typo that the scheduler then waits on forever.
var SidecarResourceNames = []string{"cpu", "memory", "ephemeral-storage"}

// Rendezvous backends (values of AnnotationRdzvBackend).
const (
	BackendEtcdV2 = "etcd-v2" // the webhook's default for a pod that does not say (the chart's default is c10d)
	BackendEtcd   = "etcd"
	BackendC10d   = "c10d" // torch's TCPStore, served by the sidecar; needs no python-etcd
	// BackendElasticTraining: the elastic-training backend (docs/elastic-training-backend.md), a torchrun backend of torch >= 2.5's
	// torchrun.handlers entry point that the sidecar installs, on the sidecar's c10d store.
	BackendElasticTraining = "elastic-training"
)

// OnSidecarStore says whether backend keeps the rendezvous in the serving
// sidecar's c10d store, which every trainer reaches through its own pod's
// sidecar (c10d and the elastic-training backend), rather than in its etcd.
func OnSidecarStore(backend string) bool {
	return backend == BackendC10d || backend == BackendElasticTraining
}

// MPI flavours (values of AnnotationMPIFlavour and of the sidecar's --hostfile-flavour).
const (
	FlavourOpenMPI  = "openmpi"
	FlavourMPICH    = "mpich"
	FlavourIntelMPI = "intelmpi"
	// FormatHorovod is not an MPI flavour but the host:slots lines a Horovod
	// discovery script prints; the sidecar's hostfile commands accept it.
	FormatHorovod = "horovod"
)

// Ports: the sidecar's by default (a job on host networking gets its own, AnnotationRdzvPorts).
const (
	RdzvClientPort    = 2379  // sidecar serve: etcd v3 + v2 keys API
	RdzvPeerPort      = 2380  // sidecar serve: etcd's peer port, on loopback
	SidecarHealthPort = 2381  // sidecar (both modes): /healthz /readyz /metrics
	C10dPort          = 29400 // sidecar serve: torch's c10d TCPStore; join: its proxy on loopback
	DefaultPSPort     = 9091  // MXNet scheduler
)

// Ports are one job's sidecar ports. Checkpoint is the in-memory checkpoints' server (peers' copies), only in a pod
// with checkpoints.
type Ports struct{ Client, Peer, Health, C10d, Checkpoint int32 }

// DefaultPorts are a job's sidecar ports on pod networking.
var DefaultPorts = Ports{RdzvClientPort, RdzvPeerPort, SidecarHealthPort, C10dPort, CheckpointPort}

// PortSpan is how many ports a job whose AnnotationRdzvPorts is base takes: base and the PortSpan-1 after it.
const PortSpan = 5

// PortsFrom are the ports of a job whose AnnotationRdzvPorts is base: base and the four after it.
func PortsFrom(base int32) Ports { return Ports{base, base + 1, base + 2, base + 3, base + 4} }

// Bounds of AnnotationRdzvPorts: above the privileged ports, below the kernel's ephemeral range (32768 on Linux),
// from which a host's outgoing connections take their ports.
const (
	MinRdzvPortBase = 1024
	MaxRdzvPortBase = 32768 - PortSpan
)

// NodePortRange is Kubernetes' default range of NodePort Services
// (--service-node-port-range), whose ports kube-proxy holds on every node:
// the job chart never picks a host-network job's ports there and refuses a
// base given there.
var NodePortRange = [2]int{30000, 32767}

// ReservedPort is a port the rendezvous sidecar listens on. All containers of
// a pod share one network namespace, so no other container of a training pod
// may declare it: the webhook denies such a pod, and the job chart refuses
// values that would render one.
type ReservedPort struct {
	Port int32
	// What names the port's user in denial messages: "port 2381 is <What>".
	What string
	// ServeOnly: only the sidecar that serves the rendezvous listens on it.
	ServeOnly bool
}

// ReservedPorts are the sidecar's default ports, each listed once.
var ReservedPorts = DefaultPorts.Reserved()

// Reserved are the sidecar's ports p, each listed once.
func (p Ports) Reserved() []ReservedPort {
	return []ReservedPort{
		{Port: p.Health, What: "the rendezvous sidecar's health port"},
		{Port: p.Client, What: "the rendezvous client port", ServeOnly: true},
		{Port: p.Peer, What: "the rendezvous store's peer port", ServeOnly: true},
		// Every PyTorch trainer reaches the c10d store on its own pod's loopback
		// (the joining sidecar carries it there), so no pod may declare it.
		{Port: p.C10d, What: "the c10d store's port"},
	}
}

// Shared volume between the sidecar and the training containers.
const (
	SidecarContainerName = "rdzv-sidecar"
	FilesVolumeName      = "elastic-training"
	FilesDir             = "/etc/elastic-training" // mounted read-only in training containers
	HostfileName         = "hostfile"
	DiscoverHostsName    = "discover_hosts.sh"
	// SidecarBinaryName: the sidecar copies itself into FilesDir so launchers can run
	// `/etc/elastic-training/rdzv-sidecar wait --members=N` in any image.
	SidecarBinaryName = "rdzv-sidecar"
	// SidecarImageBinary is the sidecar's binary in its image (build/rdzv-sidecar.Dockerfile, hack/images.sh): the
	// sidecar's postStart hook runs it.
	SidecarImageBinary = "/usr/local/bin/rdzv-sidecar"
	// LeaveScriptName: installed next to it; the webhook makes it a PyTorch trainer's
	// preStop hook, so a pod removed by a scale-down leaves the etcd-v2 rendezvous at once.
	LeaveScriptName = "leave-rendezvous.py"
	DataVolumeName  = "elastic-training-data" // serve mode's etcd data (emptyDir)
	DataDir         = "/var/lib/elastic-training"
)

// Rendezvous TLS: the Secret named by AnnotationRdzvTLSSecret is mounted
// read-only here in the sidecar and the training container. One certificate
// (tls.crt/tls.key) serves the rendezvous and authenticates its clients, so it
// must be valid for the rendezvous Service's DNS name and for client auth.
// The chart's dedicated rendezvous pod mounts the same Secret at the same path.
const (
	TLSVolumeName = "elastic-training-tls"
	TLSDir        = "/etc/elastic-training-tls"
	TLSCertName   = "tls.crt"
	TLSKeyName    = "tls.key"
	TLSCAName     = "ca.crt"
)

// The serving sidecar's API token, for its Events (AnnotationRdzvEvents): a projected service account token
// mounted in the sidecar only, where client-go's in-cluster config looks for it. The trainer gets no token.
const (
	TokenVolumeName = "elastic-training-token"
	TokenDir        = "/var/run/secrets/kubernetes.io/serviceaccount"
	// TokenExpirationSeconds: the kubelet refreshes the token; client-go rereads the file.
	TokenExpirationSeconds = 3607
)

// MembersPrefix is the etcd v3 key prefix under which join registers members.
const MembersPrefix = "/elastic-training/members/"

// ServerKey is the etcd v3 key where the serving sidecar names itself: its stable pod name and c10d port
// (host:port), which a verifying sidecar checks is a pod of its own job before it carries connections there.
const ServerKey = "/elastic-training/server"

// Env vars the webhook sets in training containers besides the frameworks' own.
const (
	EnvJob           = "ET_JOB"
	EnvSlots         = "ET_SLOTS"
	EnvHostfile      = "ET_HOSTFILE"
	EnvDiscoverHosts = "ET_DISCOVER_HOSTS"
	// EnvDisableSharedStore is torch's opt-out of sharing the rendezvous TCPStore with the workers (torch >= 2.5).
	EnvDisableSharedStore = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
	// EnvPythonPath: where a PyTorch trainer of the elastic-training backend finds its backend (PythonDir), first.
	EnvPythonPath = "PYTHONPATH"
	// PythonDir: the trainer's Python package elastic_training (the elastic-training backend's agent side), as the sidecar installs it (internal/trainerpy).
	PythonDir       = FilesDir + "/" + PythonDirName
	PythonDirName   = "python"
	EnvRdzvEndpoint = "ET_RDZV_ENDPOINT"
	EnvMemberHost   = "ET_MEMBER_HOST" // this pod's stable FQDN
	// EnvMemberIP is this pod's IP (the downward API's status.podIP), in a trainer of the elastic-training backend: the
	// address its round's rank 0 gives the workers as MASTER_ADDR. Not the FQDN: while a lost pod's replacement
	// starts beside the old one, still Terminating on a node cut off, the headless Service's name resolves to both.
	EnvMemberIP = "ET_POD_IP"
)

// In-memory checkpoints (docs/checkpoints.md): the trainer's elastic_training.checkpoint saves into EnvCheckpointDir,
// a memory-backed volume it shares with its sidecar, and asks the sidecar at EnvCheckpointURL (loopback) what to load;
// the sidecars replicate the pieces among themselves on CheckpointPort and record who holds what under
// CheckpointsPrefix in the job's store.
const (
	EnvCheckpointDir = "ET_CHECKPOINT_DIR"
	EnvCheckpointURL = "ET_CHECKPOINT_URL"
	// EnvCheckpointPersistDir and EnvCheckpointPersistEvery, in a trainer whose pod carries AnnotationCheckpointPersist:
	// every N-th step's save is also copied, by each rank, to that directory on the job's shared volume.
	EnvCheckpointPersistDir   = "ET_CHECKPOINT_PERSIST_DIR"
	EnvCheckpointPersistEvery = "ET_CHECKPOINT_PERSIST_EVERY"
	CheckpointPort            = 2382
	CheckpointsPrefix         = "/elastic-training/checkpoints/"
	// CheckpointIncidentsPrefix + a member's host: that pod's last checkpoint that did not fit (checkpoint.Incident),
	// which the serving sidecar records as a Warning Event on the Job.
	CheckpointIncidentsPrefix = "/elastic-training/checkpoint-incidents/"
	// CheckpointVolumeName is the emptyDir (medium Memory, sizeLimit: what the pod's checkpoints may hold) that a
	// PyTorch worker's pod brings (the job chart's checkpoint.memory renders it): the webhook mounts it at
	// CheckpointDir in the trainer and the sidecar and turns the sidecar's checkpoints on. A pod without it gets none.
	CheckpointVolumeName = "elastic-training-checkpoints"
	CheckpointDir        = "/run/elastic-training/checkpoints"
	// CheckpointSavesDir is where, in the volume, the saves go ($ET_CHECKPOINT_DIR, --checkpoint-dir): a directory
	// the sidecar makes, writable by all and not sticky (an emptyDir's root is sticky on a memory medium), so that
	// the sidecar (uid 65532) may remove the trainer's older saves.
	CheckpointSavesDir = CheckpointDir + "/saves"
	// EnvNodeName is the node a pod runs on (the downward API's spec.nodeName), in its sidecar: copies of a piece go
	// to other nodes first.
	EnvNodeName = "NODE_NAME"
)

// EnvWarmStart "1" tells the elastic-training backend, in torchrun's agent, to preload elastic_training._warm in the
// fork server the workers start from (docs/warm-start.md); the webhook sets it with PET_RUN_PATH and PET_START_METHOD.
const EnvWarmStart = "ET_WARM_START"

// EnvFromProbePrefix + a torchrun setting's name (PET_START_METHOD) is the webhook's question to the kubelet whether a
// warm-started trainer's envFrom sets it (mutate.EnvFromProbes); the elastic-training backend reads the answer.
const EnvFromProbePrefix = "ET_ENV_FROM_"

// Progress and hangs (docs/hangs.md): the trainer's elastic_training.progress sends each rank's step to its pod's
// sidecar at EnvProgressAddr (UDP on loopback, ProgressPort), which reports the pod's ranks to the serving sidecar
// (PyTorch: through the c10d store) or, in an MPI job, into the job's etcd at ProgressPrefix + the member's host,
// where the launcher's `rdzv-sidecar supervise` judges them.
const (
	EnvProgressAddr = "ET_PROGRESS_ADDR"
	ProgressPort    = 2383
	ProgressPrefix  = "/elastic-training/progress/"
)

// On host networking the node's loopback is every host-network pod's, so a trainer reaches its own sidecar's
// checkpoint routes and progress not on loopback ports but on Unix sockets in the pod's own files volume, which no
// other pod sees: EnvCheckpointURL and EnvProgressAddr are then UnixAddrPrefix + the socket's path.
const (
	UnixAddrPrefix   = "unix:"
	CheckpointSocket = FilesDir + "/checkpoint.sock"
	ProgressSocket   = FilesDir + "/progress.sock"
)

// Env vars the webhook sets in a candidate's sidecar (AnnotationRdzvStandbys), from the downward API: the Lease's
// holder and the rendezvous Service's endpoint while it holds the Lease.
const (
	EnvPodName = "POD_NAME"
	EnvPodIP   = "POD_IP"
	// EnvWebhookCA is the CA (PEM) of the webhook's serving certificate, in a serving sidecar that may ask it to
	// replace a pod (internal/podreplace).
	EnvWebhookCA = "ET_WEBHOOK_CA"
)

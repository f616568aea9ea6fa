package mutate

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/gpu"
	"github.com/elastic-training/elastic-training/internal/naming"
)

// Keys Kubernetes' own controllers set on the pods they create (present at CREATE).
const (
	annotationJobCompletionIndex = "batch.kubernetes.io/job-completion-index"
	labelPodIndex                = "apps.kubernetes.io/pod-index"
	annotationDefaultContainer   = "kubectl.kubernetes.io/default-container"
)

// rolesByFramework lists the roles each framework knows.
var rolesByFramework = map[string][]string{
	constants.FrameworkPyTorch: {constants.RoleWorker},
	constants.FrameworkMPI:     {constants.RoleLauncher, constants.RoleWorker},
	constants.FrameworkMXNet:   {constants.RoleScheduler, constants.RoleServer, constants.RoleWorker},
	constants.FrameworkCustom:  {constants.RoleLauncher, constants.RoleScheduler, constants.RoleServer, constants.RoleWorker},
}

var runIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// settings is everything Mutate needs, read and checked from the pod.
type settings struct {
	job, role, group, framework string
	container                   int // index into spec.containers of the training container
	slots                       int
	index                       int
	rdzvHost                    bool
	rdzvService                 string
	tlsSecret                   string          // "" = plain HTTP rendezvous
	eventsJob                   string          // "" = the serving sidecar records no Events
	keepSurvivors               bool            // the serving sidecar leaves torch's survivors alone (AnnotationRdzvRestartSurvivors false)
	forceDeleteLostOf           string          // StatefulSets whose lost pods the serving sidecar force-deletes (AnnotationForceDeleteLostPods)
	standbys                    int             // indices 1..standbys of the rdzv-host group stand by to serve (AnnotationRdzvStandbys)
	ports                       constants.Ports // the sidecar's (AnnotationRdzvPorts; default constants.DefaultPorts)
	runID                       string
	backend                     string
	minNodes, maxNodes          int
	joinTimeout, lastCall       int
	closeTimeout                int
	maxRestarts, monitor        int
	keepAlive                   int
	keepAliveAttempts           int
	flavour                     string
	numServers, numWorkers      int
	psPort                      int
	contract                    int // the job chart's (AnnotationContract; 1 when absent)
	warnings                    []string

	sidecarRes SidecarResources // per mode: AnnotationSidecarResources over the webhook's defaults
	guaranteed bool             // the trainer is Guaranteed-shaped, so the sidecar is made so too (sidecarResources)
}

// invalid collects readable problems, each naming the key and what would be valid.
type invalid []string

func (v *invalid) add(kind, key, value, want string) {
	*v = append(*v, fmt.Sprintf("%s %s=%q is invalid: want %s", kind, key, value, want))
}

func (v *invalid) missing(kind, key, want string) {
	*v = append(*v, fmt.Sprintf("%s %s is missing: want %s", kind, key, want))
}

func (v invalid) err() error {
	if len(v) == 0 {
		return nil
	}
	return errors.New(strings.Join(v, "; "))
}

// parseSettings reads the pod's labels and annotations. Every problem found is
// reported at once, so a user fixes their values in one round.
func parseSettings(pod *corev1.Pod, cfg Config) (*settings, error) {
	var bad invalid
	s := &settings{}
	ann := pod.Annotations
	lbl := pod.Labels

	s.job = lbl[constants.LabelJob]
	if errs := validation.IsDNS1035Label(s.job); len(errs) > 0 || len(s.job) > 63-len("-rdzv") {
		bad.add("label", constants.LabelJob, s.job, "a DNS label (lowercase letters, digits, '-', starting with a letter) of at most 58 characters")
	}

	if err := checkContract(ann[constants.AnnotationContract], cfg.Version); err != nil {
		// A newer chart's other annotations would read as typos: say only what to do.
		return nil, err
	}
	s.contract = 1
	if v := ann[constants.AnnotationContract]; v != "" {
		s.contract, _ = strconv.Atoi(v) // checked above
	}
	for _, k := range slices.Sorted(maps.Keys(ann)) {
		if strings.HasPrefix(k, constants.Domain+"/") && !slices.Contains(constants.PodAnnotations, k) {
			bad.add("annotation", k, ann[k], "no such annotation (a typo?); ours are "+strings.Join(constants.PodAnnotations, ", "))
		}
	}

	s.framework = ann[constants.AnnotationFramework]
	roles, ok := rolesByFramework[s.framework]
	if !ok {
		want := "one of " + strings.Join(constants.Frameworks, ", ")
		if s.framework == "" {
			bad.missing("annotation", constants.AnnotationFramework, want)
		} else {
			bad.add("annotation", constants.AnnotationFramework, s.framework, want)
		}
	}

	s.role = lbl[constants.LabelRole]
	if ok && !contains(roles, s.role) {
		want := "one of " + strings.Join(roles, ", ") + " for framework " + s.framework
		if s.role == "" {
			bad.missing("label", constants.LabelRole, want)
		} else {
			bad.add("label", constants.LabelRole, s.role, want)
		}
	}

	s.group = lbl[constants.LabelGroup]
	if s.group == "" {
		s.group = s.role
	} else if errs := validation.IsDNS1123Label(s.group); len(errs) > 0 {
		bad.add("label", constants.LabelGroup, s.group, "a DNS label")
	}

	// The training container.
	s.container = -1
	if len(pod.Spec.Containers) == 0 {
		bad = append(bad, "pod has no containers")
	} else if name, set := ann[constants.AnnotationContainer]; set {
		s.container = containerIndex(pod, name)
		if s.container < 0 {
			bad.add("annotation", constants.AnnotationContainer, name, "the name of one of the pod's containers ("+containerNames(pod)+")")
		}
	} else if i := containerIndex(pod, ann[annotationDefaultContainer]); i >= 0 {
		s.container = i
	} else {
		s.container = 0
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == constants.SidecarContainerName {
			bad = append(bad, fmt.Sprintf("container name %q is reserved for the injected sidecar: rename the container", c.Name))
		}
	}

	s.sidecarRes = cfg.Defaults.SidecarResources
	if v := ann[constants.AnnotationSidecarResources]; v != "" {
		if r, err := parseSidecarResources(v, s.sidecarRes); err != nil {
			bad.add("annotation", constants.AnnotationSidecarResources, truncate(v, 100), sidecarResourcesWant+": "+err.Error())
		} else {
			s.sidecarRes = r
		}
	}
	// Pod-level resources (spec.resources), where the pod has them, decide its QoS class instead of its containers',
	// and raising the sidecar's requests would only eat into them.
	s.guaranteed = s.container >= 0 && pod.Spec.Resources == nil && guaranteedShaped(pod.Spec.Containers[s.container].Resources)

	// Slots: the annotation wins over the accelerator count.
	if s.container >= 0 {
		c := &pod.Spec.Containers[s.container]
		computed, gerr := gpu.Slots(c, cfg.ExtraAccelerators)
		if v, set := ann[constants.AnnotationSlots]; set {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > constants.MaxSlots {
				bad.add("annotation", constants.AnnotationSlots, v, fmt.Sprintf("a whole number from 1 to %d", constants.MaxSlots))
			} else {
				s.slots = n
				if gerr == nil && len(gpu.Accelerators(c, cfg.ExtraAccelerators)) > 0 && computed != n {
					s.warnings = append(s.warnings, fmt.Sprintf("annotation %s=%d overrides the %d accelerators of container %q", constants.AnnotationSlots, n, computed, c.Name))
				}
			}
		} else if gerr != nil {
			bad = append(bad, fmt.Sprintf("container %q: %v: set annotation %s to the number of processes per pod", c.Name, gerr, constants.AnnotationSlots))
		} else if computed > constants.MaxSlots {
			bad = append(bad, fmt.Sprintf("container %q asks for %d accelerators: at most %d slots per pod are supported", c.Name, computed, constants.MaxSlots))
		} else {
			s.slots = computed
		}
	}

	// The pod's index in its group, as the Job or StatefulSet controller sets it.
	s.index = -1
	if v, set := ann[annotationJobCompletionIndex]; set {
		s.index = parseIndex(&bad, "annotation", annotationJobCompletionIndex, v)
	} else if v, set := lbl[labelPodIndex]; set {
		s.index = parseIndex(&bad, "label", labelPodIndex, v)
	} else {
		bad = append(bad, fmt.Sprintf("pod index unknown: create training pods through an Indexed Job (annotation %s) or a StatefulSet (label %s), or set one of them", annotationJobCompletionIndex, labelPodIndex))
	}

	s.rdzvHost = parseBool(&bad, ann, constants.AnnotationRdzvHost)
	s.rdzvService = naming.RendezvousService(s.job)
	if v, set := ann[constants.AnnotationRdzvService]; set {
		if errs := validation.IsDNS1035Label(v); len(errs) > 0 {
			bad.add("annotation", constants.AnnotationRdzvService, v, "a Service name (a DNS label starting with a letter)")
		} else {
			s.rdzvService = v
		}
	}
	if v := ann[constants.AnnotationRdzvTLSSecret]; v != "" {
		// Checked here so that a typo is denied at admission, not left as a pod
		// stuck in ContainerCreating on a volume that can never mount.
		if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
			bad.add("annotation", constants.AnnotationRdzvTLSSecret, v, "the name of a Secret in the pod's namespace (a DNS subdomain: lowercase letters, digits, '-', '.')")
		} else {
			s.tlsSecret = v
		}
	}

	if _, ok := ann[constants.AnnotationRdzvRestartSurvivors]; ok {
		s.keepSurvivors = !parseBool(&bad, ann, constants.AnnotationRdzvRestartSurvivors)
	}
	if v := ann[constants.AnnotationRdzvEvents]; v != "" {
		if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
			bad.add("annotation", constants.AnnotationRdzvEvents, v, "the name of a Job in the pod's namespace (a DNS subdomain)")
		} else {
			s.eventsJob = v
		}
	}

	if v := ann[constants.AnnotationForceDeleteLostPods]; v != "" {
		if _, err := naming.StatefulSets(v); err != nil {
			bad.add("annotation", constants.AnnotationForceDeleteLostPods, truncate(v, 100), fmt.Sprintf("comma-separated names of the job's StatefulSets (DNS labels, at most %d): %v", constants.MaxForceDeleteSets, err))
		} else {
			s.forceDeleteLostOf = v
		}
	}

	s.standbys = parseInt(&bad, ann, constants.AnnotationRdzvStandbys, 0, 0, constants.MaxRdzvStandbys, "")
	s.ports = constants.DefaultPorts
	if base := parseInt(&bad, ann, constants.AnnotationRdzvPorts, 0, constants.MinRdzvPortBase, constants.MaxRdzvPortBase, "the first of 4 ports"); base != 0 {
		s.ports = constants.PortsFrom(int32(base))
	}

	d := cfg.Defaults
	s.backend = parseEnum(&bad, ann, constants.AnnotationRdzvBackend, d.RdzvBackend, constants.Backends)
	s.joinTimeout = parseInt(&bad, ann, constants.AnnotationRdzvJoinTimeout, d.JoinTimeout, 1, 86400, "seconds")
	s.lastCall = parseInt(&bad, ann, constants.AnnotationRdzvLastCallTimeout, d.LastCallTimeout, 1, 86400, "seconds")
	s.closeTimeout = parseInt(&bad, ann, constants.AnnotationRdzvCloseTimeout, d.CloseTimeout, 1, 86400, "seconds")
	s.maxRestarts = parseInt(&bad, ann, constants.AnnotationMaxRestarts, d.MaxRestarts, 0, 10000, "")
	s.monitor = parseInt(&bad, ann, constants.AnnotationMonitorInterval, d.MonitorInterval, 1, 3600, "seconds")

	s.keepAlive, s.keepAliveAttempts = d.KeepAliveInterval, d.KeepAliveMaxAttempts

	s.flavour = parseEnum(&bad, ann, constants.AnnotationMPIFlavour, d.MPIFlavour, constants.MPIFlavours)

	switch s.framework {
	case constants.FrameworkPyTorch:
		s.runID = ann[constants.AnnotationRunID]
		if s.runID == "" {
			bad.missing("annotation", constants.AnnotationRunID, "an id unique per job install (the chart generates one)")
		} else if !runIDPattern.MatchString(s.runID) {
			bad.add("annotation", constants.AnnotationRunID, s.runID, "1 to 128 letters, digits, '.', '_' or '-'")
		}
		s.minNodes = requireInt(&bad, ann, constants.AnnotationMinNodes, 1, 100000)
		s.maxNodes = requireInt(&bad, ann, constants.AnnotationMaxNodes, 1, 100000)
		// torch's TCPStore protocol has no TLS (neither its client nor the
		// sidecar's store), so a TLS request cannot be honoured for c10d.
		if s.backend == constants.BackendC10d && ann[constants.AnnotationRdzvTLSSecret] != "" {
			bad = append(bad, fmt.Sprintf("annotation %s=%q with %s=%s: torch's c10d rendezvous has no TLS; use backend etcd-v2 or etcd, or drop the TLS Secret",
				constants.AnnotationRdzvTLSSecret, ann[constants.AnnotationRdzvTLSSecret], constants.AnnotationRdzvBackend, constants.BackendC10d))
		}
		// A standby's fresh store is one more round for torch's c10d agents; its etcd backends are not known to take
		// one (their state would vanish under them).
		if s.standbys > 0 && s.backend != constants.BackendC10d {
			bad = append(bad, fmt.Sprintf("annotation %s=%d with %s=%s: standbys serve the c10d rendezvous only; use backend c10d or drop the standbys",
				constants.AnnotationRdzvStandbys, s.standbys, constants.AnnotationRdzvBackend, s.backend))
		}
		if s.minNodes > 0 && s.maxNodes > 0 && s.minNodes > s.maxNodes {
			bad = append(bad, fmt.Sprintf("annotation %s=%d is greater than %s=%d: want min <= max",
				constants.AnnotationMinNodes, s.minNodes, constants.AnnotationMaxNodes, s.maxNodes))
		}
	default:
		if s.standbys > 0 {
			bad = append(bad, fmt.Sprintf("annotation %s=%d with %s=%s: standbys serve a PyTorch job's c10d rendezvous only",
				constants.AnnotationRdzvStandbys, s.standbys, constants.AnnotationFramework, s.framework))
		}
	}
	// Checked on every pod that carries it, MXNet's or not: a value no port can be is a mistake wherever it is.
	s.psPort = parseInt(&bad, ann, constants.AnnotationPSPort, constants.DefaultPSPort, 1, 65535, "port")
	if s.framework == constants.FrameworkMXNet {
		s.numServers = requireInt(&bad, ann, constants.AnnotationNumServers, 1, 100000)
		s.numWorkers = requireInt(&bad, ann, constants.AnnotationNumWorkers, 1, 100000)
	}
	return s, bad.err()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func containerIndex(pod *corev1.Pod, name string) int {
	if name == "" {
		return -1
	}
	for i, c := range pod.Spec.Containers {
		if c.Name == name {
			return i
		}
	}
	return -1
}

func containerNames(pod *corev1.Pod) string {
	names := make([]string, len(pod.Spec.Containers))
	for i, c := range pod.Spec.Containers {
		names[i] = c.Name
	}
	return strings.Join(names, ", ")
}

func parseIndex(bad *invalid, kind, key, v string) int {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		bad.add(kind, key, v, "a whole number >= 0")
		return -1
	}
	return n
}

func parseBool(bad *invalid, ann map[string]string, key string) bool {
	v, set := ann[key]
	if !set {
		return false
	}
	switch v {
	case "true":
		return true
	case "false":
		return false
	}
	bad.add("annotation", key, v, `"true" or "false"`)
	return false
}

func parseInt(bad *invalid, ann map[string]string, key string, def, lo, hi int, unit string) int {
	v, set := ann[key]
	if !set {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		want := fmt.Sprintf("a whole number from %d to %d", lo, hi)
		if unit != "" {
			want += " (" + unit + ")"
		}
		bad.add("annotation", key, v, want)
		return def
	}
	return n
}

// parseEnum returns the annotation's value when it is one of allowed, def when it is absent, and records a
// denial naming the valid values otherwise.
func parseEnum(bad *invalid, ann map[string]string, key, def string, allowed []string) string {
	v, set := ann[key]
	if !set {
		return def
	}
	if !slices.Contains(allowed, v) {
		bad.add("annotation", key, v, "one of "+strings.Join(allowed, ", "))
		return def
	}
	return v
}

func requireInt(bad *invalid, ann map[string]string, key string, lo, hi int) int {
	if _, set := ann[key]; !set {
		bad.missing("annotation", key, fmt.Sprintf("a whole number from %d to %d", lo, hi))
		return 0
	}
	return parseInt(bad, ann, key, 0, lo, hi, "")
}

// candidate says whether this pod may serve the rendezvous: the rdzv-host
// group's index 0, and its standbys after it. Each candidate's sidecar talks
// to the API server (the Lease, the Service's endpoint, Events, lost pods).
func (s *settings) candidate() bool {
	return s.rdzvHost && s.index >= 0 && s.index <= s.standbys
}

// checkContract refuses a pod rendered by a job chart of a newer contract
// than this webhook's (AnnotationContract; absent: 1): the chart may rely on
// what this webhook does not do, so the pod is denied with both versions and
// the order of upgrades, instead of as a list of unknown annotations.
func checkContract(v, webhookVersion string) error {
	if v == "" {
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return fmt.Errorf("annotation %s=%q is invalid: want the job chart's contract version, a number from 1", constants.AnnotationContract, v)
	}
	if n <= constants.ContractVersion {
		return nil
	}
	release := ""
	if webhookVersion != "" {
		release = " " + webhookVersion
	}
	return fmt.Errorf("annotation %s=%q: this pod's job chart needs contract %d, and this webhook (elastic-training-webhook%s) serves contracts up to %d: "+
		"upgrade the elastic-training-webhook chart first (helm upgrade <webhook release> elastic-training-webhook), then install or upgrade the job; "+
		"CHANGELOG.md has which chart versions go together",
		constants.AnnotationContract, v, n, release, constants.ContractVersion)
}

// truncate shortens a value quoted in a denial: an annotation may hold 256 KiB.
func truncate(v string, n int) string {
	if len(v) <= n {
		return v
	}
	return v[:n] + "..."
}

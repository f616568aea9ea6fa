package mutate

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

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
	hostNetwork                 bool            // the trainer reaches its sidecar on Unix sockets (constants.CheckpointSocket)
	runID                       string
	backend                     string
	minNodes, maxNodes          int
	joinTimeout, lastCall       int
	closeTimeout                int
	maxRestarts                 int
	monitor                     float64        // seconds; the job's own, or the webhook's scaled to maxNodes (monitorInterval)
	monitorSet                  bool           // the job set monitor (AnnotationMonitorInterval)
	hangOff                     bool           // AnnotationHangTimeout "off": no round is restarted for a hang
	warmStart                   string         // AnnotationWarmStart: "" (absent), "true" or "false"
	hangTimeout                 int            // AnnotationHangTimeout in seconds; 0: the serving sidecar's rule
	hangReplaceAfter            int            // AnnotationHangReplaceAfter; -1: absent (the sidecar's default), 0: never
	replace                     PodReplacement // the webhook's, when this pod's serving sidecar may ask it (replaces)
	leaseTTL                    int            // AnnotationRdzvLeaseTTL in seconds; 0: the sidecar's default
	checkpointReplicas          int            // AnnotationCheckpointReplicas, with the checkpoint volume
	keepAlive                   int
	keepAliveAttempts           int
	flavour                     string
	numServers, numWorkers      int
	psPort                      int
	contract                    int // the job chart's (AnnotationContract; 1 when absent)
	warnings                    []string

	checkpointBytes int64  // the checkpoint volume's sizeLimit; 0: no in-memory checkpoints (parseCheckpoint)
	persistDir      string // AnnotationCheckpointPersist; "": saves are not copied to a volume
	persistEvery    int    // AnnotationCheckpointPersistEvery

	sidecarRes SidecarResources // per mode: AnnotationSidecarResources over the webhook's defaults
	guaranteed bool             // the trainer is Guaranteed-shaped, so the sidecar is made so too (sidecarResources)
}

var (
	annotationsPath = field.NewPath("metadata", "annotations")
	labelsPath      = field.NewPath("metadata", "labels")
	containersPath  = field.NewPath("spec", "containers")
)

func annotationPath(key string) *field.Path { return annotationsPath.Key(key) }
func labelPath(key string) *field.Path      { return labelsPath.Key(key) }

// denial renders errs in the webhook's own wording, not field.ErrorList's: users, docs and the tests quote it. A
// value of one label or annotation that is Invalid or Required names its kind and key and what would be valid; any
// other problem's Detail is its whole sentence. All in the order found, "; " between them.
func denial(errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = describe(e)
	}
	return errors.New(strings.Join(msgs, "; "))
}

func describe(e *field.Error) string {
	kind, key, ok := metadataKey(e.Field)
	switch {
	case ok && e.Type == field.ErrorTypeInvalid:
		return fmt.Sprintf("%s %s=%q is invalid: want %s", kind, key, e.BadValue, e.Detail)
	case ok && e.Type == field.ErrorTypeRequired:
		return fmt.Sprintf("%s %s is missing: want %s", kind, key, e.Detail)
	}
	return e.Detail
}

// metadataKey reads a label's or annotation's kind and key back from its path, which Path.Key writes unescaped
// (so a key holding "]" or "." comes back whole).
func metadataKey(path string) (kind, key string, ok bool) {
	for _, m := range []struct {
		kind string
		path *field.Path
	}{{"annotation", annotationsPath}, {"label", labelsPath}} {
		if rest, found := strings.CutPrefix(path, m.path.String()+"["); found && strings.HasSuffix(rest, "]") {
			return m.kind, strings.TrimSuffix(rest, "]"), true
		}
	}
	return "", "", false
}

// parseSettings reads the pod's labels and annotations. Every problem found is
// reported at once, so a user fixes their values in one round.
func parseSettings(pod *corev1.Pod, cfg Config) (*settings, error) {
	contract, err := parseContract(pod.Annotations, cfg.Version)
	if err != nil {
		// A newer chart's other annotations would read as typos: say only what to do.
		return nil, err
	}
	s := &settings{contract: contract}
	ann, lbl, d := pod.Annotations, pod.Labels, cfg.Defaults
	// Order matters twice: later steps read what earlier ones set (container, framework, standbys, backend), and
	// the denial lists the problems in this order, as it always has.
	errs := s.parseJob(lbl)
	errs = append(errs, checkAnnotationKeys(ann)...)
	errs = append(errs, s.parseFrameworkRole(ann, lbl)...)
	errs = append(errs, s.parseGroup(lbl)...)
	errs = append(errs, s.parseContainer(pod)...)
	errs = append(errs, s.parseSidecarResources(pod, d.SidecarResources)...)
	errs = append(errs, s.parseSlots(pod, cfg.ExtraAccelerators)...)
	errs = append(errs, s.parsePodIndex(ann, lbl)...)
	errs = append(errs, s.parseRdzvHost(ann)...)
	errs = append(errs, s.parseTLS(ann)...)
	errs = append(errs, s.parseServeOptions(ann)...)
	errs = append(errs, s.parseStandbysPorts(ann)...)
	s.hostNetwork = pod.Spec.HostNetwork
	errs = append(errs, s.parseAgent(ann, d)...)
	errs = append(errs, s.parseMPI(ann, d)...)
	errs = append(errs, s.parsePyTorch(ann)...)
	errs = append(errs, s.parseMXNet(ann)...)
	errs = append(errs, s.parseCheckpoint(pod)...)
	s.replace = cfg.PodReplacement
	return s, denial(errs)
}

// parseContract is the pod's job chart contract (1 when absent), or the error that alone denies the pod.
func parseContract(ann map[string]string, webhookVersion string) (int, error) {
	v := ann[constants.AnnotationContract]
	if err := checkContract(v, webhookVersion); err != nil {
		return 0, err
	}
	if v == "" {
		return 1, nil
	}
	n, _ := strconv.Atoi(v) // checked above
	return n, nil
}

func (s *settings) parseJob(lbl map[string]string) (errs field.ErrorList) {
	s.job = lbl[constants.LabelJob]
	// The rendezvous Service's name adds "-rdzv" to the job's and must stay a DNS label.
	if e := validation.IsDNS1035Label(s.job); len(e) > 0 || len(s.job) > 63-len("-rdzv") {
		errs = append(errs, field.Invalid(labelPath(constants.LabelJob), s.job,
			"a DNS label (lowercase letters, digits, '-', starting with a letter) of at most 58 characters"))
	}
	return errs
}

// checkAnnotationKeys refuses any other annotation of our domain: a typo would otherwise be ignored silently.
func checkAnnotationKeys(ann map[string]string) (errs field.ErrorList) {
	for _, k := range slices.Sorted(maps.Keys(ann)) {
		if strings.HasPrefix(k, constants.Domain+"/") && !slices.Contains(constants.PodAnnotations, k) {
			errs = append(errs, field.Invalid(annotationPath(k), ann[k],
				"no such annotation (a typo?); ours are "+strings.Join(constants.PodAnnotations, ", ")))
		}
	}
	return errs
}

func (s *settings) parseFrameworkRole(ann, lbl map[string]string) (errs field.ErrorList) {
	s.framework = ann[constants.AnnotationFramework]
	s.role = lbl[constants.LabelRole]
	roles, ok := rolesByFramework[s.framework]
	if !ok {
		// Which roles are valid depends on the framework: with none known, the role is not judged.
		return append(errs, invalidOrMissing(annotationPath(constants.AnnotationFramework), s.framework,
			"one of "+strings.Join(constants.Frameworks, ", ")))
	}
	if !contains(roles, s.role) {
		errs = append(errs, invalidOrMissing(labelPath(constants.LabelRole), s.role,
			"one of "+strings.Join(roles, ", ")+" for framework "+s.framework))
	}
	return errs
}

func (s *settings) parseGroup(lbl map[string]string) (errs field.ErrorList) {
	s.group = lbl[constants.LabelGroup]
	if s.group == "" {
		s.group = s.role
	} else if e := validation.IsDNS1123Label(s.group); len(e) > 0 {
		errs = append(errs, field.Invalid(labelPath(constants.LabelGroup), s.group, "a DNS label"))
	}
	return errs
}

// parseContainer finds the training container: the annotation's, else kubectl's default, else the first.
func (s *settings) parseContainer(pod *corev1.Pod) (errs field.ErrorList) {
	ann := pod.Annotations
	s.container = -1
	if len(pod.Spec.Containers) == 0 {
		errs = append(errs, field.Required(containersPath, "pod has no containers"))
	} else if name, set := ann[constants.AnnotationContainer]; set {
		s.container = containerIndex(pod, name)
		if s.container < 0 {
			errs = append(errs, field.Invalid(annotationPath(constants.AnnotationContainer), name,
				"the name of one of the pod's containers ("+containerNames(pod)+")"))
		}
	} else if i := containerIndex(pod, ann[annotationDefaultContainer]); i >= 0 {
		s.container = i
	} else {
		s.container = 0
	}
	for i, c := range pod.Spec.Containers {
		if c.Name == constants.SidecarContainerName {
			errs = append(errs, field.Forbidden(containersPath.Index(i).Child("name"),
				fmt.Sprintf("container name %q is reserved for the injected sidecar: rename the container", c.Name)))
		}
	}
	return errs
}

func (s *settings) parseSidecarResources(pod *corev1.Pod, defaults SidecarResources) (errs field.ErrorList) {
	s.sidecarRes = defaults
	if v := pod.Annotations[constants.AnnotationSidecarResources]; v != "" {
		if r, err := parseSidecarResources(v, s.sidecarRes); err != nil {
			errs = append(errs, field.Invalid(annotationPath(constants.AnnotationSidecarResources), truncate(v, 100),
				sidecarResourcesWant+": "+err.Error()))
		} else {
			s.sidecarRes = r
		}
	}
	// Pod-level resources (spec.resources), where the pod has them, decide its QoS class instead of its containers',
	// and raising the sidecar's requests would only eat into them.
	s.guaranteed = s.container >= 0 && pod.Spec.Resources == nil && guaranteedShaped(pod.Spec.Containers[s.container].Resources)
	return errs
}

// parseSlots counts the training container's processes: the annotation wins over the accelerator count.
func (s *settings) parseSlots(pod *corev1.Pod, extraAccelerators []string) (errs field.ErrorList) {
	if s.container < 0 {
		return nil
	}
	c := &pod.Spec.Containers[s.container]
	computed, gerr := gpu.Slots(c, extraAccelerators)
	if v, set := pod.Annotations[constants.AnnotationSlots]; set {
		return s.parseSlotsAnnotation(v, c, computed, gerr == nil && len(gpu.Accelerators(c, extraAccelerators)) > 0)
	}
	resources := containersPath.Index(s.container).Child("resources")
	switch {
	case gerr != nil:
		errs = append(errs, field.Invalid(resources, c.Resources, fmt.Sprintf("container %q: %v: set annotation %s to the number of processes per pod",
			c.Name, gerr, constants.AnnotationSlots)))
	case computed > constants.MaxSlots:
		errs = append(errs, field.Invalid(resources, c.Resources, fmt.Sprintf("container %q asks for %d accelerators: at most %d slots per pod are supported",
			c.Name, computed, constants.MaxSlots)))
	default:
		s.slots = computed
	}
	return errs
}

// parseSlotsAnnotation reads AnnotationSlots, and warns where it overrides the container's counted accelerators.
func (s *settings) parseSlotsAnnotation(v string, c *corev1.Container, computed int, counted bool) (errs field.ErrorList) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > constants.MaxSlots {
		return append(errs, field.Invalid(annotationPath(constants.AnnotationSlots), v,
			fmt.Sprintf("a whole number from 1 to %d", constants.MaxSlots)))
	}
	s.slots = n
	if counted && computed != n {
		s.warnings = append(s.warnings, fmt.Sprintf("annotation %s=%d overrides the %d accelerators of container %q",
			constants.AnnotationSlots, n, computed, c.Name))
	}
	return errs
}

// parsePodIndex reads the pod's index in its group, as the Job or StatefulSet controller sets it.
func (s *settings) parsePodIndex(ann, lbl map[string]string) (errs field.ErrorList) {
	s.index = -1
	if v, set := ann[annotationJobCompletionIndex]; set {
		s.index = parseIndex(&errs, annotationPath(annotationJobCompletionIndex), v)
	} else if v, set := lbl[labelPodIndex]; set {
		s.index = parseIndex(&errs, labelPath(labelPodIndex), v)
	} else {
		// Either key would do, so the problem is the pod's metadata, not one key of it.
		errs = append(errs, field.Required(field.NewPath("metadata"), fmt.Sprintf("pod index unknown: create training pods through an Indexed Job (annotation %s) or a StatefulSet (label %s), or set one of them",
			annotationJobCompletionIndex, labelPodIndex)))
	}
	return errs
}

func (s *settings) parseRdzvHost(ann map[string]string) (errs field.ErrorList) {
	s.rdzvHost = parseBool(&errs, ann, constants.AnnotationRdzvHost)
	s.rdzvService = naming.RendezvousService(s.job)
	if v, set := ann[constants.AnnotationRdzvService]; set {
		if e := validation.IsDNS1035Label(v); len(e) > 0 {
			errs = append(errs, field.Invalid(annotationPath(constants.AnnotationRdzvService), v,
				"a Service name (a DNS label starting with a letter)"))
		} else {
			s.rdzvService = v
		}
	}
	return errs
}

func (s *settings) parseTLS(ann map[string]string) (errs field.ErrorList) {
	v := ann[constants.AnnotationRdzvTLSSecret]
	if v == "" {
		return nil
	}
	// Checked here so that a typo is denied at admission, not left as a pod
	// stuck in ContainerCreating on a volume that can never mount.
	if e := validation.IsDNS1123Subdomain(v); len(e) > 0 {
		return append(errs, field.Invalid(annotationPath(constants.AnnotationRdzvTLSSecret), v,
			"the name of a Secret in the pod's namespace (a DNS subdomain: lowercase letters, digits, '-', '.')"))
	}
	s.tlsSecret = v
	return nil
}

// parseServeOptions reads what only a serving sidecar does: survivors, Events, lost pods.
func (s *settings) parseServeOptions(ann map[string]string) (errs field.ErrorList) {
	if _, ok := ann[constants.AnnotationRdzvRestartSurvivors]; ok {
		s.keepSurvivors = !parseBool(&errs, ann, constants.AnnotationRdzvRestartSurvivors)
	}
	if v := ann[constants.AnnotationRdzvEvents]; v != "" {
		if e := validation.IsDNS1123Subdomain(v); len(e) > 0 {
			errs = append(errs, field.Invalid(annotationPath(constants.AnnotationRdzvEvents), v,
				"the name of a Job in the pod's namespace (a DNS subdomain)"))
		} else {
			s.eventsJob = v
		}
	}
	if v := ann[constants.AnnotationForceDeleteLostPods]; v != "" {
		if _, err := naming.StatefulSets(v); err != nil {
			errs = append(errs, field.Invalid(annotationPath(constants.AnnotationForceDeleteLostPods), truncate(v, 100),
				fmt.Sprintf("comma-separated names of the job's StatefulSets (DNS labels, at most %d): %v", constants.MaxForceDeleteSets, err)))
		} else {
			s.forceDeleteLostOf = v
		}
	}
	return errs
}

func (s *settings) parseStandbysPorts(ann map[string]string) (errs field.ErrorList) {
	s.standbys = parseInt(&errs, ann, constants.AnnotationRdzvStandbys, 0, 0, constants.MaxRdzvStandbys, "")
	s.ports = constants.DefaultPorts
	if base := parseInt(&errs, ann, constants.AnnotationRdzvPorts, 0, constants.MinRdzvPortBase, constants.MaxRdzvPortBase, fmt.Sprintf("the first of %d ports", constants.PortSpan)); base != 0 {
		s.ports = constants.PortsFrom(int32(base))
	}
	return errs
}

// parseAgent reads the rendezvous backend and the elastic agent's timeouts, each over the webhook's default.
func (s *settings) parseAgent(ann map[string]string, d Defaults) (errs field.ErrorList) {
	s.backend = parseEnum(&errs, ann, constants.AnnotationRdzvBackend, d.RdzvBackend, constants.Backends)
	s.joinTimeout = parseInt(&errs, ann, constants.AnnotationRdzvJoinTimeout, d.JoinTimeout, 1, 86400, "seconds")
	s.lastCall = parseInt(&errs, ann, constants.AnnotationRdzvLastCallTimeout, d.LastCallTimeout, 1, 86400, "seconds")
	s.closeTimeout = parseInt(&errs, ann, constants.AnnotationRdzvCloseTimeout, d.CloseTimeout, 1, 86400, "seconds")
	s.maxRestarts = parseInt(&errs, ann, constants.AnnotationMaxRestarts, d.MaxRestarts, 0, 10000, "")
	s.monitor, s.monitorSet = parseSeconds(&errs, ann, constants.AnnotationMonitorInterval, d.MonitorInterval, MinMonitorInterval, MaxMonitorInterval)
	s.keepAlive, s.keepAliveAttempts = d.KeepAliveInterval, d.KeepAliveMaxAttempts
	s.leaseTTL = parseInt(&errs, ann, constants.AnnotationRdzvLeaseTTL, 0, constants.MinLeaseTTL, constants.MaxLeaseTTL, "seconds")
	s.warmStart = parseEnum(&errs, ann, constants.AnnotationWarmStart, "", []string{"true", "false"})
	switch v := ann[constants.AnnotationHangTimeout]; v {
	case "":
	case "off":
		s.hangOff = true
	default:
		s.hangTimeout = parseInt(&errs, ann, constants.AnnotationHangTimeout, 0, 1, 86400, `seconds, or "off"`)
	}
	s.hangReplaceAfter = parseInt(&errs, ann, constants.AnnotationHangReplaceAfter, -1, 0, constants.MaxHangReplaceAfter, "hangs, 0 for never")
	return errs
}

func (s *settings) parseMPI(ann map[string]string, d Defaults) (errs field.ErrorList) {
	s.flavour = parseEnum(&errs, ann, constants.AnnotationMPIFlavour, d.MPIFlavour, constants.MPIFlavours)
	return errs
}

// parsePyTorch reads what torch's elastic agent needs; a pod of another framework may only not ask for standbys.
func (s *settings) parsePyTorch(ann map[string]string) (errs field.ErrorList) {
	if s.framework != constants.FrameworkPyTorch {
		if s.standbys > 0 {
			errs = append(errs, field.Forbidden(annotationPath(constants.AnnotationRdzvStandbys),
				fmt.Sprintf("annotation %s=%d with %s=%s: standbys serve a PyTorch job's c10d rendezvous only",
					constants.AnnotationRdzvStandbys, s.standbys, constants.AnnotationFramework, s.framework)))
		}
		return errs
	}
	s.runID = ann[constants.AnnotationRunID]
	if s.runID == "" {
		errs = append(errs, field.Required(annotationPath(constants.AnnotationRunID), "an id unique per job install (the chart generates one)"))
	} else if !runIDPattern.MatchString(s.runID) {
		errs = append(errs, field.Invalid(annotationPath(constants.AnnotationRunID), s.runID, "1 to 128 letters, digits, '.', '_' or '-'"))
	}
	s.minNodes = requireInt(&errs, ann, constants.AnnotationMinNodes, 1, 100000)
	s.maxNodes = requireInt(&errs, ann, constants.AnnotationMaxNodes, 1, 100000)
	return append(errs, s.pytorchConflicts(ann)...)
}

// pytorchConflicts refuses values each valid alone but not together. Each is Forbidden, so its Detail is the whole
// sentence, naming both annotations.
func (s *settings) pytorchConflicts(ann map[string]string) (errs field.ErrorList) {
	// torch's TCPStore protocol has no TLS (neither its client nor the
	// sidecar's store), so a TLS request cannot be honoured for c10d.
	if tls := ann[constants.AnnotationRdzvTLSSecret]; constants.OnSidecarStore(s.backend) && tls != "" {
		errs = append(errs, field.Forbidden(annotationPath(constants.AnnotationRdzvTLSSecret),
			fmt.Sprintf("annotation %s=%q with %s=%s: torch's c10d store has no TLS; use backend etcd-v2 or etcd, or drop the TLS Secret",
				constants.AnnotationRdzvTLSSecret, tls, constants.AnnotationRdzvBackend, s.backend)))
	}
	// A standby's fresh store is one more round for torch's c10d agents; its etcd backends are not known to take
	// one (their state would vanish under them).
	if s.standbys > 0 && !constants.OnSidecarStore(s.backend) {
		errs = append(errs, field.Forbidden(annotationPath(constants.AnnotationRdzvStandbys),
			fmt.Sprintf("annotation %s=%d with %s=%s: standbys serve the c10d store only; use backend c10d or elastic-training, or drop the standbys",
				constants.AnnotationRdzvStandbys, s.standbys, constants.AnnotationRdzvBackend, s.backend)))
	}
	if s.minNodes > 0 && s.maxNodes > 0 && s.minNodes > s.maxNodes {
		errs = append(errs, field.Forbidden(annotationPath(constants.AnnotationMinNodes),
			fmt.Sprintf("annotation %s=%d is greater than %s=%d: want min <= max",
				constants.AnnotationMinNodes, s.minNodes, constants.AnnotationMaxNodes, s.maxNodes)))
	}
	return errs
}

func (s *settings) parseMXNet(ann map[string]string) (errs field.ErrorList) {
	// Checked on every pod that carries it, MXNet's or not: a value no port can be is a mistake wherever it is.
	s.psPort = parseInt(&errs, ann, constants.AnnotationPSPort, constants.DefaultPSPort, 1, 65535, "port")
	if s.framework == constants.FrameworkMXNet {
		s.numServers = requireInt(&errs, ann, constants.AnnotationNumServers, 1, 100000)
		s.numWorkers = requireInt(&errs, ann, constants.AnnotationNumWorkers, 1, 100000)
	}
	return errs
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

func parseIndex(errs *field.ErrorList, path *field.Path, v string) int {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		*errs = append(*errs, field.Invalid(path, v, "a whole number >= 0"))
		return -1
	}
	return n
}

func parseBool(errs *field.ErrorList, ann map[string]string, key string) bool {
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
	*errs = append(*errs, field.Invalid(annotationPath(key), v, `"true" or "false"`))
	return false
}

func parseInt(errs *field.ErrorList, ann map[string]string, key string, def, lo, hi int, unit string) int {
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
		*errs = append(*errs, field.Invalid(annotationPath(key), v, want))
		return def
	}
	return n
}

// parseSeconds returns the annotation's decimal seconds and true when it is set and from lo to hi, def and false
// when it is absent, and records a denial naming the range otherwise.
func parseSeconds(errs *field.ErrorList, ann map[string]string, key string, def, lo, hi float64) (float64, bool) {
	v, set := ann[key]
	if !set {
		return def, false
	}
	x, err := strconv.ParseFloat(v, 64)
	if err != nil || !(x >= lo && x <= hi) { // NaN fails both
		*errs = append(*errs, field.Invalid(annotationPath(key), v, fmt.Sprintf("seconds from %v to %v, such as 0.5", lo, hi)))
		return def, false
	}
	return x, true
}

// parseEnum returns the annotation's value when it is one of allowed, def when it is absent, and records a
// denial naming the valid values otherwise.
func parseEnum(errs *field.ErrorList, ann map[string]string, key, def string, allowed []string) string {
	v, set := ann[key]
	if !set {
		return def
	}
	if !slices.Contains(allowed, v) {
		*errs = append(*errs, field.Invalid(annotationPath(key), v, "one of "+strings.Join(allowed, ", ")))
		return def
	}
	return v
}

func requireInt(errs *field.ErrorList, ann map[string]string, key string, lo, hi int) int {
	if _, set := ann[key]; !set {
		*errs = append(*errs, field.Required(annotationPath(key), fmt.Sprintf("a whole number from %d to %d", lo, hi)))
		return 0
	}
	return parseInt(errs, ann, key, 0, lo, hi, "")
}

// invalidOrMissing tells an empty value apart, as a denial of a value the user never set would confuse.
func invalidOrMissing(path *field.Path, v, want string) *field.Error {
	if v == "" {
		return field.Required(path, want)
	}
	return field.Invalid(path, v, want)
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

// parseCheckpoint reads the pod's checkpoint volume (constants.CheckpointVolumeName), if it has one: an emptyDir
// with a sizeLimit, in a PyTorch worker's pod (docs/checkpoints.md).
func (s *settings) parseCheckpoint(pod *corev1.Pod) (errs field.ErrorList) {
	i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == constants.CheckpointVolumeName })
	if i < 0 {
		for _, key := range []string{constants.AnnotationCheckpointPersist, constants.AnnotationCheckpointPersistEvery} {
			if v, ok := pod.Annotations[key]; ok {
				errs = append(errs, field.Forbidden(annotationPath(key), fmt.Sprintf("annotation %s=%q: saves are copied to a volume only with in-memory checkpoints (volume %s; the job chart's checkpoint.memory)",
					key, truncate(v, 64), constants.CheckpointVolumeName)))
			}
		}
		return errs
	}
	path := field.NewPath("spec", "volumes").Index(i)
	v := pod.Spec.Volumes[i]
	switch {
	case s.framework != constants.FrameworkPyTorch || s.role != constants.RoleWorker:
		return append(errs, field.Forbidden(path, fmt.Sprintf("%s (volume %s): in-memory checkpoints are for a PyTorch job's workers (elastic_training.checkpoint), not %s=%s %s=%s",
			path, constants.CheckpointVolumeName, constants.AnnotationFramework, s.framework, constants.LabelRole, s.role)))
	case v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.Sign() <= 0:
		return append(errs, field.Invalid(path, constants.CheckpointVolumeName, fmt.Sprintf(
			"%s (volume %s) must be an emptyDir with a sizeLimit (medium: Memory): the bytes the pod's checkpoints may hold, its saves and its copies of other pods' together",
			path, constants.CheckpointVolumeName)))
	}
	for ci, c := range pod.Spec.Containers {
		for pi, p := range c.Ports {
			if p.ContainerPort == s.ports.Checkpoint {
				pp := containersPath.Index(ci).Child("ports").Index(pi)
				errs = append(errs, field.Forbidden(pp, fmt.Sprintf("%s: port %d is the checkpoint server's (volume %s turns it on): use another",
					pp, s.ports.Checkpoint, constants.CheckpointVolumeName)))
			}
		}
	}
	s.checkpointBytes = v.EmptyDir.SizeLimit.Value()
	s.checkpointReplicas = parseInt(&errs, pod.Annotations, constants.AnnotationCheckpointReplicas, 1, 0, MaxCheckpointReplicas, "copies on other pods")
	return append(errs, s.parsePersist(pod)...)
}

// DefaultCheckpointPersistEvery is how often a save goes to the volume when AnnotationCheckpointPersistEvery is absent.
const DefaultCheckpointPersistEvery = 100

// parsePersist reads where saves are also copied to (AnnotationCheckpointPersist): a clean absolute directory on a
// writable volume of the trainer container, so that the trainer's copies land on the job's volume and not in the
// container's own filesystem, which a lost pod takes with it.
func (s *settings) parsePersist(pod *corev1.Pod) (errs field.ErrorList) {
	ann := pod.Annotations
	dir, set := ann[constants.AnnotationCheckpointPersist]
	s.persistEvery = parseInt(&errs, ann, constants.AnnotationCheckpointPersistEvery, DefaultCheckpointPersistEvery, 1, 1_000_000_000, "steps between copies to the volume")
	if !set {
		if v, ok := ann[constants.AnnotationCheckpointPersistEvery]; ok {
			errs = append(errs, field.Forbidden(annotationPath(constants.AnnotationCheckpointPersistEvery), fmt.Sprintf("annotation %s=%q without %s (the directory to copy to)",
				constants.AnnotationCheckpointPersistEvery, truncate(v, 64), constants.AnnotationCheckpointPersist)))
		}
		return errs
	}
	p := annotationPath(constants.AnnotationCheckpointPersist)
	if !path.IsAbs(dir) || path.Clean(dir) != dir || strings.ContainsRune(dir, 0) || len(dir) > 1024 {
		return append(errs, field.Invalid(p, truncate(dir, 64), "a clean absolute directory (such as /data/elastic-training/<job>) on a volume of the training container"))
	}
	if s.container < 0 || s.container >= len(pod.Spec.Containers) {
		return errs // parseContainer said why
	}
	c := pod.Spec.Containers[s.container]
	under := func(root string) bool { return root != "" && (dir == root || strings.HasPrefix(dir, root+"/")) }
	if under(constants.CheckpointDir) || under(constants.FilesDir) {
		return append(errs, field.Invalid(p, dir, fmt.Sprintf("%s and %s are the webhook's (the pod's memory, the sidecar's files): a directory on the job's volume (persistence.mountPath)",
			constants.CheckpointDir, constants.FilesDir)))
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return under(strings.TrimSuffix(m.MountPath, "/")) && !m.ReadOnly
	}) {
		return append(errs, field.Invalid(p, dir, fmt.Sprintf("no writable volume of the training container %q is mounted there: saves copied into the container's own filesystem are lost with the pod (the job chart's persistence.enabled mounts the job's volume at persistence.mountPath)", c.Name)))
	}
	s.persistDir = dir
	return errs
}

// MaxCheckpointReplicas bounds the copies of each piece of a checkpoint: each is the state's size in every pod's memory.
const MaxCheckpointReplicas = 8

// Package mutate is the pure core of the admission webhook: given a training
// pod, its namespace and the webhook's configuration it returns the pod with
// the rendezvous settings, slot counts, hostfile wiring and the rdzv-sidecar
// added. It reads no globals, no environment and no clock, so the same input
// always gives the same output (golden tests rely on it).
package mutate

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"

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
	if isChartPod(pod.Labels[constants.LabelRole]) {
		e := &editor{pod: pod}
		if err := chartPod(e, in.Config); err != nil {
			return Result{}, err
		}
		return Result{Pod: pod, Patch: e.ops}, nil
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
	if s.framework == constants.FrameworkMPI {
		searchSubdomain(e, naming.ServiceFQDN(pod.Spec.Subdomain, namespace, domain))
	}
	rdzvHost := naming.ServiceFQDN(s.rdzvService, namespace, domain)
	rdzvURL := scheme(s) + "://" + rdzvHost + ":" + svcClientPort

	// The rendezvous candidates serve it, one at a time (the holder of its Lease); the others join.
	serving := s.candidate()
	register := s.role == constants.RoleWorker

	// Labels and annotations.
	mode := modeJoin
	if serving {
		mode = modeServe
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
	if serving {
		if err := setTokenVolume(e, s); err != nil {
			return err
		}
	}
	if err := checkPorts(pod, s.ports, serving); err != nil {
		return err
	}

	// The training container: env and the read-only files mount.
	c := &pod.Spec.Containers[s.container]
	path := "/spec/containers/" + strconv.Itoa(s.container)
	for _, v := range trainerEnv(s, fqdn, rdzvHost, rdzvURL, namespace, domain) {
		setEnv(e, path, c, v)
	}
	if s.progressOn() {
		// torchrun finds the elastic-training backend through its entry point, in the dist-info the sidecar installs
		// there; an MPI rank imports elastic_training (the chart's sshd gives it the container's environment).
		prependPath(e, path, c, constants.EnvPythonPath, constants.PythonDir)
	}
	if warm, why := warmStart(s, c); warm {
		if len(c.EnvFrom) > 0 {
			for _, v := range EnvFromProbes() {
				setEnv(e, path, c, v)
			}
		}
		for _, v := range WarmStartEnv() {
			setEnv(e, path, c, v)
		}
	} else if s.warmStart == "true" {
		e.warn("annotation %s=true: container %q starts its workers cold, as torchrun does by default: %s (docs/warm-start.md)",
			constants.AnnotationWarmStart, c.Name, why)
	}
	if err := setMount(e, path, c, constants.FilesVolumeName, constants.FilesDir, true); err != nil {
		return err
	}
	if s.framework == constants.FrameworkPyTorch {
		setLeaveHook(e, path, c)
		shareProcesses(e)
	}
	if s.checkpointBytes > 0 {
		// elastic_training.checkpoint saves here and asks its own pod's sidecar what to load (docs/checkpoints.md).
		if err := setMount(e, path, c, constants.CheckpointVolumeName, constants.CheckpointDir, false); err != nil {
			return err
		}
		setEnv(e, path, c, corev1.EnvVar{Name: constants.EnvCheckpointDir, Value: constants.CheckpointSavesDir})
		setEnv(e, path, c, corev1.EnvVar{Name: constants.EnvCheckpointURL, Value: s.checkpointURL()})
		if s.persistDir != "" {
			setEnv(e, path, c, corev1.EnvVar{Name: constants.EnvCheckpointPersistDir, Value: s.persistDir})
			setEnv(e, path, c, corev1.EnvVar{Name: constants.EnvCheckpointPersistEvery, Value: strconv.Itoa(s.persistEvery)})
		}
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
	sc := sidecar(cfg, s, mode, register, fqdn, rdzvHost, rdzvURL)
	if missing := missingQoSResources(sc.Resources); s.guaranteed && len(missing) > 0 {
		// Nothing to raise to: a limit made up here would be a guess at what the sidecar needs.
		e.warn("container %q has cpu and memory limits equal to its requests, but the %s sidecar's resources (annotation %s, else the webhook's --sidecar-%s-resources) have no %s: the pod is not Guaranteed; give the sidecar cpu and memory",
			c.Name, mode, constants.AnnotationSidecarResources, mode, strings.Join(missing, " and no "))
	}
	setSidecar(e, sc)

	// Last: the pod may be scheduled only once everything above is in it.
	openGate(e)
	return nil
}

// searchSubdomain makes the short hostnames of the job's pods resolve in this
// one (a DNS search domain): MPICH's and Intel MPI's Hydra proxies call back
// to the launcher by its gethostname(), the pod's short hostname, which
// resolves only within its subdomain.
func searchSubdomain(e *editor, domain string) {
	pod := e.pod
	if pod.Spec.HostNetwork {
		return // gethostname() is the node's name: no search domain helps
	}
	if pod.Spec.DNSConfig == nil {
		set(e, "/spec/dnsConfig", &pod.Spec.DNSConfig, &corev1.PodDNSConfig{Searches: []string{domain}})
		return
	}
	if !slices.Contains(pod.Spec.DNSConfig.Searches, domain) {
		appendTo(e, "/spec/dnsConfig/searches", &pod.Spec.DNSConfig.Searches, domain)
	}
}

package helm_test

// The rdzv-sidecar container is described twice: by the webhook (internal/mutate, func sidecar) for the pod that
// serves the rendezvous among the job's own pods, and by the job chart (templates/rendezvous.yaml) for the dedicated
// rendezvous pod. This test renders the chart with a dedicated rendezvous pod, hands the index-0 pod of its first
// worker group, made the rendezvous host, to the webhook's mutation, and compares the two serving sidecars.

import (
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/mutate"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// sidecarFlagsAllowedToDiffer are the sidecar flags whose values (or presence) may differ between the dedicated
// rendezvous pod and a webhook-served rendezvous: they say who the pod is, not how the rendezvous is served.
// The dedicated pod's values of them are checked on their own (wantMember in the test).
var sidecarFlagsAllowedToDiffer = map[string]string{
	"--register":      "the dedicated pod is not a training member (false); a serving worker registers itself (true)",
	"--member-host":   "each pod's own stable DNS name",
	"--member-group":  "each pod's own group (rdzv for the dedicated pod)",
	"--member-index":  "each pod's own index in its group",
	"--member-slots":  "a member's slot count; the dedicated pod does not register, so it leaves the flag out",
	"--c10d-verify":   "a serving worker's trainer reaches the store through its sidecar while another pod serves; the dedicated pod has no trainer",
	"--progress-addr": "a worker's trainer says its progress to its own sidecar; the dedicated pod has no trainer",
	"--run-id":        "the run a worker's progress reports are of; the dedicated pod reports none",
}

// sidecarView is what the two descriptions of the serving sidecar must agree on.
type sidecarView struct {
	// Mode is the first argument (serve or join).
	Mode string
	// Flags are the other arguments, --name to value ("" for a bare boolean flag), less sidecarFlagsAllowedToDiffer.
	Flags map[string]string
	// Mounts are the container's volume mounts, sorted by path, each with the source of the volume it mounts.
	Mounts []map[string]any
	// Restart is when the kubelet restarts the container. The injected sidecar is a native sidecar (an init
	// container with restartPolicy Always): restarted whenever it exits, whatever the pod's restartPolicy. The
	// dedicated pod's container is the main container of a Deployment's pod, whose restartPolicy is Always (the only
	// one a Deployment accepts): restarted whenever it exits too. Both must come out "Always".
	Restart string
	// Container is everything else: name, ports (sorted by number), probes, securityContext,
	// terminationMessagePolicy, env, lifecycle, ... Cleared because they may differ: image and imagePullPolicy
	// (chart value rendezvous.image vs the webhook's --sidecar-image flags), command (the webhook relies on the
	// image's entrypoint; the chart's rendezvous.command lets an image without that entrypoint be used), resources
	// (chart value rendezvous.resources vs the webhook's sidecar resources flags), and the fields above.
	// (Mounts and Container are compared as their JSON, so that a diff prints what is missing in full.)
	Container map[string]any
}

// TestDedicatedRendezvousMatchesInjectedSidecar fails on any drift between the dedicated rendezvous pod's sidecar
// (charts/elastic-training/templates/rendezvous.yaml) and the sidecar the webhook injects into a serving pod
// (internal/mutate) with the same settings, with and without TLS.
func TestDedicatedRendezvousMatchesInjectedSidecar(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	dedicated := map[string]any{"placement": "dedicated"}
	withTLS := map[string]any{"placement": "dedicated", "tls": map[string]any{"secretName": "demo-rdzv-tls"}}
	type tc struct {
		name     string
		values   map[string]any
		scenario bool // a ci scenario or example: may have no dedicated rendezvous pod
	}
	// A trainer command: the chart refuses a job with nothing to run.
	train := func() map[string]any {
		return merge(pinned(t), map[string]any{"command": []any{"torchrun", "train.py"}})
	}
	cases := []tc{
		{"pytorch", merge(train(), map[string]any{"rendezvous": dedicated}), false},
		{"pytorch-hang-timeout", merge(train(), map[string]any{"rendezvous": dedicated, "hang": map[string]any{"timeout": 30}}), false},
		{"pytorch-hang-off", merge(train(), map[string]any{"rendezvous": dedicated, "hang": map[string]any{"enabled": false}}), false},
		{"pytorch-tls", merge(train(), map[string]any{"rendezvous": merge(withTLS, map[string]any{"backend": constants.BackendEtcdV2})}), false},
		{"pytorch-etcd-tls", merge(train(), map[string]any{"rendezvous": merge(withTLS, map[string]any{"backend": constants.BackendEtcd})}), false},
		{"pytorch-c10d-preemptible", merge(train(), map[string]any{"rendezvous": map[string]any{"backend": constants.BackendC10d}, "workers": map[string]any{"preemptible": true}}), false},
		{"mpi-mpich", merge(pinned(t), map[string]any{"framework": constants.FrameworkMPI, "rendezvous": dedicated,
			"mpi": map[string]any{"flavour": constants.FlavourMPICH, "launcher": map[string]any{"command": []any{"mpirun"}}}}), false},
		{"custom-tls", merge(pinned(t), map[string]any{"framework": constants.FrameworkCustom, "rendezvous": withTLS,
			"command": []any{"python3", "train.py"}}), false},
	}
	// And every scenario (ci values, examples) that renders a dedicated rendezvous pod, as it stands.
	for _, sc := range scenarios(t) {
		cases = append(cases, tc{sc.name, merge(sc.read(t), pinned(t)), true})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := render(ch, c.values, chartrender.Options{})
			require.NoError(t, err)
			var rdzv *appsv1.Deployment
			var member *corev1.Pod
			for _, o := range r.Objects {
				if o.Kind != "StatefulSet" && o.Kind != "Job" && o.Kind != "Deployment" {
					continue
				}
				switch role := roleOf(o); {
				case role == constants.RoleRdzv && o.Kind == "Deployment":
					rdzv = decode[appsv1.Deployment](t, o)
				case role == constants.RoleWorker && member == nil:
					member = servingPod(t, o)
				}
			}
			if rdzv == nil {
				if c.scenario {
					t.Skip("no dedicated rendezvous pod in this scenario")
				}
				t.Fatal("no dedicated rendezvous Deployment rendered")
			}
			require.NotNil(t, member, "no worker group rendered")

			domain, _ := c.values["clusterDomain"].(string)
			if domain == "" {
				domain = naming.DefaultClusterDomain
			}
			// The dedicated pod has no CA of the webhook's to ask it with: it never asks for a replacement
			// (hang.replaceAfter says so).
			sc, volumes := injectedSidecar(t, member, domain, func(c *mutate.Config) { c.PodReplacement = mutate.PodReplacement{} })
			want := viewOf(t, sc, volumes, restartBehaviour(sc, true, ""))

			spec := rdzv.Spec.Template.Spec
			i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == constants.SidecarContainerName })
			require.GreaterOrEqual(t, i, 0, "the dedicated rendezvous pod has no container %q", constants.SidecarContainerName)
			got := viewOf(t, spec.Containers[i], spec.Volumes, restartBehaviour(spec.Containers[i], false, spec.RestartPolicy))

			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("the dedicated rendezvous pod's %s container (charts/elastic-training/templates/rendezvous.yaml) "+
					"drifted from the sidecar the webhook injects into a serving pod (internal/mutate, func sidecar) "+
					"(-webhook +chart):\n%s", constants.SidecarContainerName, diff)
			}

			// The pod's own DNS name (hostname and subdomain of its template).
			require.Equal(t, rdzv.Name+"-0", spec.Hostname, "the dedicated rendezvous pod's hostname")
			fqdn := naming.PodFQDN(spec.Hostname, spec.Subdomain, namespace, domain)
			wantMember := map[string]string{"--register": "false", "--member-host": fqdn, "--member-group": constants.GroupRdzv, "--member-index": "0"}
			_, flags := parseSidecarArgs(t, spec.Containers[i].Args)
			gotMember := map[string]string{}
			for f := range sidecarFlagsAllowedToDiffer {
				if v, ok := flags[f]; ok {
					gotMember[f] = v
				}
			}
			if diff := cmp.Diff(wantMember, gotMember); diff != "" {
				t.Errorf("the dedicated rendezvous pod's member flags (-want +got):\n%s", diff)
			}
		})
	}
}

// injectedSidecar is this test's one use of internal/mutate: it mutates pod as the webhook would in namespace (the
// webhook's default configuration, cluster domain domain) and returns the injected sidecar and the pod's volumes.
func injectedSidecar(t *testing.T, pod *corev1.Pod, domain string, edits ...func(*mutate.Config)) (corev1.Container, []corev1.Volume) {
	t.Helper()
	res := webhookMutated(t, pod, domain, edits...)
	for _, c := range res.Pod.Spec.InitContainers {
		if c.Name == constants.SidecarContainerName {
			return c, res.Pod.Spec.Volumes
		}
	}
	t.Fatalf("the webhook injected no %s init container", constants.SidecarContainerName)
	return corev1.Container{}, nil
}

// servingPod is the index-0 pod of a Job or StatefulSet of the chart as its controller creates it, with the
// annotation that makes it serve the rendezvous.
func servingPod(t *testing.T, o chartrender.Object) *corev1.Pod {
	t.Helper()
	var tmpl corev1.PodTemplateSpec
	switch o.Kind {
	case "Job":
		tmpl = decode[batchv1.Job](t, o).Spec.Template
	case "StatefulSet":
		tmpl = decode[appsv1.StatefulSet](t, o).Spec.Template
	case "Deployment":
		tmpl = decode[appsv1.Deployment](t, o).Spec.Template
	}
	pod := &corev1.Pod{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
	pod.Name, pod.Namespace, pod.Spec.Hostname = o.Name+"-0", namespace, o.Name+"-0"
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	if o.Kind == "Job" {
		pod.Annotations["batch.kubernetes.io/job-completion-index"] = "0"
	} else {
		pod.Labels["apps.kubernetes.io/pod-index"] = "0"
	}
	pod.Annotations[constants.AnnotationRdzvHost] = "true"
	return pod
}

func roleOf(o chartrender.Object) string {
	role, _, _ := unstructured.NestedString(o.Obj, "spec", "template", "metadata", "labels", constants.LabelRole)
	return role
}

func decode[T any](t *testing.T, o chartrender.Object) *T {
	t.Helper()
	out := new(T)
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Obj, out), o.Key())
	return out
}

// restartBehaviour is when the kubelet restarts c, an init container or a main container of a pod with
// restartPolicy podPolicy.
func restartBehaviour(c corev1.Container, init bool, podPolicy corev1.RestartPolicy) string {
	switch {
	case c.RestartPolicy != nil:
		return string(*c.RestartPolicy)
	case init:
		return "none: an init container without restartPolicy runs to completion before the next one starts"
	case podPolicy != "":
		return string(podPolicy)
	default:
		return string(corev1.RestartPolicyAlways) // the API server's default for a pod (and a StatefulSet's only choice)
	}
}

// viewOf is c, a container of a pod with volumes, as sidecarView sees it.
func viewOf(t *testing.T, c corev1.Container, volumes []corev1.Volume, restart string) sidecarView {
	t.Helper()
	v := sidecarView{Restart: restart}
	v.Mode, v.Flags = parseSidecarArgs(t, c.Args)
	for f := range sidecarFlagsAllowedToDiffer {
		delete(v.Flags, f)
	}
	for _, m := range c.VolumeMounts {
		mv := toJSONMap(t, &m)
		if i := slices.IndexFunc(volumes, func(vol corev1.Volume) bool { return vol.Name == m.Name }); i >= 0 {
			mv["source"] = toJSONMap(t, &volumes[i].VolumeSource)
		} else {
			t.Errorf("container %s mounts volume %q, which its pod does not have", c.Name, m.Name)
		}
		v.Mounts = append(v.Mounts, mv)
	}
	sort.Slice(v.Mounts, func(i, j int) bool { return v.Mounts[i]["mountPath"].(string) < v.Mounts[j]["mountPath"].(string) })
	c = *c.DeepCopy()
	c.Image, c.ImagePullPolicy, c.Command, c.Resources = "", "", nil, corev1.ResourceRequirements{}
	c.Args, c.VolumeMounts, c.RestartPolicy = nil, nil, nil
	sort.Slice(c.Ports, func(i, j int) bool { return c.Ports[i].ContainerPort < c.Ports[j].ContainerPort })
	v.Container = toJSONMap(t, &c)
	delete(v.Container, "resources") // cleared above: {} on both sides
	return v
}

func toJSONMap(t *testing.T, v any) map[string]any {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(v)
	require.NoError(t, err)
	return m
}

// parseSidecarArgs splits rdzv-sidecar's arguments into the mode (the first argument) and --flag[=value] pairs.
func parseSidecarArgs(t *testing.T, args []string) (string, map[string]string) {
	t.Helper()
	flags := map[string]string{}
	if len(args) == 0 {
		t.Errorf("no arguments")
		return "", flags
	}
	for _, a := range args[1:] {
		name, value, _ := strings.Cut(a, "=")
		if !strings.HasPrefix(name, "--") {
			t.Errorf("argument %q is not a --flag (arguments %q)", a, args)
			continue
		}
		if _, dup := flags[name]; dup {
			t.Errorf("flag %s given twice (arguments %q)", name, args)
		}
		flags[name] = value
	}
	return args[0], flags
}

// webhookMutated is pod as the webhook (its defaults) mutates it.
const replaceURL = "https://elastic-training-webhook.elastic-training-system.svc:443/replace-pod"

func webhookMutated(t *testing.T, pod *corev1.Pod, domain string, edits ...func(*mutate.Config)) mutate.Result {
	t.Helper()
	cfg := mutate.DefaultConfig()
	cfg.SidecarImage = "example.com/rdzv-sidecar:contract"
	cfg.ClusterDomain = domain
	// As the webhook chart installs it (podReplacement.enabled).
	cfg.PodReplacement = mutate.PodReplacement{URL: replaceURL, CA: []byte("-----BEGIN CERTIFICATE-----\nMIIBtestCA\n-----END CERTIFICATE-----\n")}
	for _, e := range edits {
		e(&cfg)
	}
	res, err := mutate.Mutate(mutate.Input{Pod: pod, Namespace: namespace, Config: cfg})
	require.NoError(t, err)
	return res
}

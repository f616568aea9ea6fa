package mutate

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

// servingPod is base's pod as the rdzv-host group's index 0: it serves the rendezvous.
func servingPod(t testing.TB) *corev1.Pod {
	p := base(t)
	p.Annotations[annotationJobCompletionIndex] = "0"
	p.Labels[annotationJobCompletionIndex] = "0"
	p.Spec.Hostname = "bert-workers-0"
	return p
}

// resourcesOf parses a container's resources written as JSON, as a pod's are.
func resourcesOf(t testing.TB, s string) corev1.ResourceRequirements {
	t.Helper()
	var r corev1.ResourceRequirements
	require.NoError(t, json.Unmarshal([]byte(s), &r), s)
	return r
}

// mutated mutates p with the test configuration, and returns the result and its sidecar.
func mutated(t testing.TB, p *corev1.Pod) (Result, corev1.Container) {
	t.Helper()
	res, err := Mutate(Input{Pod: p, Namespace: "team-a", Config: testConfig()})
	require.NoError(t, err)
	require.Equal(t, constants.SidecarContainerName, res.Pod.Spec.InitContainers[0].Name)
	return res, res.Pod.Spec.InitContainers[0]
}

// assertResources compares resources as the API server stores them (JSON, quantities canonical).
func assertResources(t testing.TB, want string, got corev1.ResourceRequirements) {
	t.Helper()
	b, err := json.Marshal(got)
	require.NoError(t, err)
	assert.JSONEq(t, want, string(b))
}

const (
	joinDefault  = `{"requests":{"cpu":"10m","memory":"32Mi"},"limits":{"memory":"128Mi"}}`
	serveDefault = `{"requests":{"cpu":"50m","memory":"64Mi"},"limits":{"memory":"512Mi"}}`
)

// TestSidecarResourcesAccepted: the annotation's mode replaces the webhook's default for that mode whole, and leaves
// the other mode's default alone (base's trainer is Burstable: no shaping here).
func TestSidecarResourcesAccepted(t *testing.T) {
	cases := []struct {
		desc  string
		serve bool // the pod serves the rendezvous
		value string
		want  string // the sidecar's resources
	}{
		{"join given, join pod", false,
			`{"join":{"requests":{"cpu":"100m","memory":"64Mi"},"limits":{"cpu":"500m","memory":"256Mi"}}}`,
			`{"requests":{"cpu":"100m","memory":"64Mi"},"limits":{"cpu":"500m","memory":"256Mi"}}`},
		{"serve given, serving pod", true,
			`{"serve":{"requests":{"cpu":"1","memory":"1Gi"},"limits":{"cpu":"2","memory":"2Gi"}}}`,
			`{"requests":{"cpu":"1","memory":"1Gi"},"limits":{"cpu":"2","memory":"2Gi"}}`},
		{"both given, serving pod takes serve", true,
			`{"serve":{"requests":{"cpu":"200m"}},"join":{"requests":{"cpu":"20m"}}}`,
			`{"requests":{"cpu":"200m"}}`},
		{"both given, join pod takes join", false,
			`{"serve":{"requests":{"cpu":"200m"}},"join":{"requests":{"cpu":"20m"}}}`,
			`{"requests":{"cpu":"20m"}}`},
		{"serve given, join pod keeps the join default", false,
			`{"serve":{"requests":{"cpu":"1"}}}`, joinDefault},
		{"join given, serving pod keeps the serve default", true,
			`{"join":{"requests":{"cpu":"1"}}}`, serveDefault},
		{"a mode given with requests only keeps no default limit", false,
			`{"join":{"requests":{"cpu":"100m","memory":"256Mi"}}}`, `{"requests":{"cpu":"100m","memory":"256Mi"}}`},
		{"an empty mode is no resources", false, `{"join":{}}`, `{}`},
		{"a null mode keeps the default", false, `{"join":null}`, joinDefault},
		{"an empty object keeps both defaults", true, `{}`, serveDefault},
		{"an empty value is no annotation", false, ``, joinDefault},
		{"numbers, ephemeral-storage and whitespace", false,
			` { "join" : { "requests" : { "cpu" : 0.25, "memory" : "64Mi", "ephemeral-storage": "1Gi" }, "limits": { "memory": 268435456, "ephemeral-storage": "2Gi" } } } `,
			`{"requests":{"cpu":"250m","memory":"64Mi","ephemeral-storage":"1Gi"},"limits":{"memory":"268435456","ephemeral-storage":"2Gi"}}`},
		{"a limit equal to its request, written otherwise", false,
			`{"join":{"requests":{"cpu":"0.5"},"limits":{"cpu":"500m"}}}`, `{"requests":{"cpu":"500m"},"limits":{"cpu":"500m"}}`},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			p := base(t)
			if tc.serve {
				p = servingPod(t)
			}
			p.Annotations[constants.AnnotationSidecarResources] = tc.value
			res, sc := mutated(t, p)
			assert.Empty(t, res.Warnings)
			assertResources(t, tc.want, sc.Resources)
			wantMode := "sidecar=join"
			if tc.serve {
				wantMode = "sidecar=serve"
			}
			assert.Contains(t, res.Pod.Annotations[constants.AnnotationMutated], wantMode)
		})
	}
}

// TestServingLimitCarriesTheJob: the serving sidecar's memory limit grows to what carries the job's largest size
// (membudget.LimitFor: its store's connections and its own state), the webhook's default and the job's own alike;
// a joining sidecar's never does, nor a serving one's that carries the job already.
func TestServingLimitCarriesTheJob(t *testing.T) {
	cases := []struct {
		desc     string
		serve    bool
		maxNodes string
		backend  string
		value    string // the annotation; "": the webhook's default
		want     string // the sidecar's memory limit
	}{
		{"a small job keeps the default", true, "8", "", "", "512Mi"},
		{"1,024 nodes", true, "1024", "", "", "896Mi"},
		{"4,096 nodes", true, "4096", "", "", "3264Mi"},
		{"4,096 nodes on torch's etcd-v2 backend", true, "4096", constants.BackendEtcdV2, "", "6400Mi"},
		{"the job's own limit, too small, grows (in steps of 64Mi)", true, "1024", "", `{"serve":{"limits":{"memory":"600Mi"}}}`, "856Mi"},
		{"the job's own limit, large enough, stays", true, "1024", "", `{"serve":{"limits":{"memory":"2Gi"}}}`, "2Gi"},
		{"a joining pod keeps its own", false, "4096", "", "", "128Mi"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			p := base(t)
			if tc.serve {
				p = servingPod(t)
			}
			p.Annotations[constants.AnnotationMaxNodes] = tc.maxNodes
			p.Annotations[constants.AnnotationRdzvBackend] = cmp.Or(tc.backend, constants.BackendElasticTraining)
			if tc.value != "" {
				p.Annotations[constants.AnnotationSidecarResources] = tc.value
			}
			res, sc := mutated(t, p)
			require.NotNil(t, res.Pod)
			got := sc.Resources.Limits[corev1.ResourceMemory]
			assert.Equal(t, tc.want, got.String())
		})
	}
}

// TestSidecarResourcesDenied: every malformed value is denied with the annotation's name, what would be valid, the
// problem, and at most 100 bytes of the value.
func TestSidecarResourcesDenied(t *testing.T) {
	long := `{"join":{"requests":{"cpu":"` + strings.Repeat("9", constants.MaxSidecarResourcesBytes) + `"}}}`
	cases := []struct {
		desc, value string
		wants       []string
	}{
		{"not JSON", `serve: 100m`, []string{"not a JSON object: "}},
		{"a JSON list", `[{"serve":{}}]`, []string{"not a JSON object: "}},
		{"trailing data", `{"join":{}} {"serve":{}}`, []string{"not a JSON object: "}},
		{"a mode misspelt", `{"server":{"requests":{"cpu":"1"}}}`, []string{`the value: key "server" is not one of serve, join`}},
		{"a mode in capitals (keys are case-sensitive)", `{"Join":{}}`, []string{`the value: key "Join" is not one of serve, join`}},
		{"a mode given twice", `{"join":{},"join":{}}`, []string{`the value: `, `duplicate field "join"`}},
		{"a mode not an object", `{"join":"100m"}`, []string{`join: "100m" is not a JSON object`}},
		{"a list misspelt", `{"join":{"limit":{"memory":"1Gi"}}}`, []string{`join: key "limit" is not one of requests, limits`}},
		{"claims (dynamic resources) are not the sidecar's", `{"serve":{"claims":[{"name":"gpu"}]}}`, []string{`serve: key "claims" is not one of requests, limits`}},
		{"a list not an object", `{"join":{"requests":["cpu"]}}`, []string{`join.requests: ["cpu"] is not a JSON object`}},
		{"an accelerator", `{"serve":{"limits":{"nvidia.com/gpu":1}}}`,
			[]string{`serve.limits: "nvidia.com/gpu" is not a resource the sidecar may set: want one of cpu, memory, ephemeral-storage`}},
		{"a resource in capitals", `{"join":{"requests":{"CPU":"1"}}}`, []string{`join.requests: "CPU" is not a resource the sidecar may set`}},
		{"a quantity that does not parse", `{"join":{"requests":{"cpu":"ten"}}}`, []string{`join.requests.cpu: "ten" is not a quantity: want e.g. 100m, 2, 256Mi`}},
		{"a unit Kubernetes does not know", `{"join":{"limits":{"memory":"256MB"}}}`, []string{`join.limits.memory: "256MB" is not a quantity`}},
		{"a quantity that is not a string or number", `{"join":{"limits":{"memory":true}}}`, []string{`join.limits.memory: "true" is not a quantity`}},
		{"a null quantity", `{"join":{"limits":{"memory":null}}}`, []string{`join.limits.memory: "null" is not a quantity`}},
		{"a negative quantity", `{"serve":{"requests":{"memory":"-64Mi"}}}`, []string{`serve.requests.memory: -64Mi is negative: want a quantity >= 0`}},
		{"a resource given twice", `{"join":{"requests":{"cpu":"1","cpu":"2"}}}`, []string{`join.requests: `, `duplicate field "cpu"`}},
		{"a memory limit below its request", `{"join":{"requests":{"memory":"256Mi"},"limits":{"memory":"128Mi"}}}`,
			[]string{`join: limits.memory=128Mi is below requests.memory=256Mi: want a limit at least its request`}},
		{"a cpu limit below its request", `{"serve":{"requests":{"cpu":"1"},"limits":{"cpu":"500m"}}}`,
			[]string{`serve: limits.cpu=500m is below requests.cpu=1: want a limit at least its request`}},
		{"an ephemeral-storage limit below its request", `{"join":{"requests":{"ephemeral-storage":"2Gi"},"limits":{"ephemeral-storage":"1Gi"}}}`,
			[]string{`join: limits.ephemeral-storage=1Gi is below requests.ephemeral-storage=2Gi`}},
		{"too long", long, []string{fmt.Sprintf("the value has %d bytes", len(long)), `..."`}},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			p := base(t)
			p.Annotations[constants.AnnotationSidecarResources] = tc.value
			_, err := Mutate(Input{Pod: p, Namespace: "team-a", Config: testConfig()})
			require.Error(t, err)
			msg := err.Error()
			assert.Contains(t, msg, fmt.Sprintf("annotation elastic-training.io/sidecar-resources=%q is invalid", truncate(tc.value, 100)))
			assert.Contains(t, msg, `is invalid: want JSON {"serve": {"requests": {...}, "limits": {...}}, "join": {...}} (each key optional) of cpu, memory, ephemeral-storage, at most 4096 bytes: `)
			for _, w := range tc.wants {
				assert.Contains(t, msg, w)
			}
			// The whole message stays short whatever the value holds: at most 100 bytes of it are quoted, and each
			// piece the problem names at most 32.
			assert.Less(t, len(msg), 600, msg)
		})
	}
}

// TestSidecarResourcesDeniedWithOthers: a bad value is one problem among the pod's others, reported together.
func TestSidecarResourcesDeniedWithOthers(t *testing.T) {
	p := base(t)
	p.Annotations[constants.AnnotationSidecarResources] = `{"join":{"requests":{"cpu":"ten"}}}`
	p.Annotations[constants.AnnotationSlots] = "0"
	_, err := Mutate(Input{Pod: p, Namespace: "team-a", Config: testConfig()})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "annotation elastic-training.io/sidecar-resources=")
	assert.Contains(t, err.Error(), `annotation elastic-training.io/slots="0" is invalid`)
}

// TestGuaranteedSidecar: beside a trainer whose cpu and memory limits equal its requests (a request left out is its
// limit), the sidecar's cpu and memory requests and limits all become the larger of the two it would get; beside any
// other trainer the sidecar is left as it was.
func TestGuaranteedSidecar(t *testing.T) {
	const (
		guaranteed = `{"requests":{"cpu":"8","memory":"32Gi","nvidia.com/gpu":"4"},"limits":{"cpu":"8","memory":"32Gi","nvidia.com/gpu":"4"}}`
		limitsOnly = `{"limits":{"cpu":"8","memory":"32Gi","nvidia.com/gpu":"4"}}`
		burstable  = `{"requests":{"cpu":"8","memory":"32Gi"},"limits":{"memory":"32Gi"}}`
	)
	cases := []struct {
		desc       string
		serve      bool
		trainer    string // the training container's resources
		annotation string // AnnotationSidecarResources; "" none
		podLevel   bool   // the pod has pod-level resources (spec.resources)
		want       string // the sidecar's resources
		warn       string // a substring of the one warning, "" none
	}{
		{desc: "Guaranteed trainer, join default", trainer: guaranteed,
			want: `{"requests":{"cpu":"10m","memory":"128Mi"},"limits":{"cpu":"10m","memory":"128Mi"}}`},
		{desc: "Guaranteed trainer, serve default", serve: true, trainer: guaranteed,
			want: `{"requests":{"cpu":"50m","memory":"512Mi"},"limits":{"cpu":"50m","memory":"512Mi"}}`},
		{desc: "trainer with limits only (requests default to them)", trainer: limitsOnly,
			want: `{"requests":{"cpu":"10m","memory":"128Mi"},"limits":{"cpu":"10m","memory":"128Mi"}}`},
		{desc: "trainer with its cpu request only left out", trainer: `{"requests":{"memory":"32Gi"},"limits":{"cpu":"8","memory":"32Gi"}}`,
			want: `{"requests":{"cpu":"10m","memory":"128Mi"},"limits":{"cpu":"10m","memory":"128Mi"}}`},
		{desc: "trainer's equal quantities written otherwise", trainer: `{"requests":{"cpu":"8000m","memory":"32Gi"},"limits":{"cpu":"8","memory":"34359738368"}}`,
			want: `{"requests":{"cpu":"10m","memory":"128Mi"},"limits":{"cpu":"10m","memory":"128Mi"}}`},
		{desc: "the annotation's join, shaped: the larger of each", trainer: guaranteed,
			annotation: `{"join":{"requests":{"cpu":"100m","memory":"64Mi"},"limits":{"cpu":"250m","memory":"256Mi"}}}`,
			want:       `{"requests":{"cpu":"250m","memory":"256Mi"},"limits":{"cpu":"250m","memory":"256Mi"}}`},
		{desc: "the annotation's serve, a request with no limit becomes both", serve: true, trainer: guaranteed,
			annotation: `{"serve":{"requests":{"cpu":"300m","memory":"64Mi"},"limits":{"memory":"1Gi"}}}`,
			want:       `{"requests":{"cpu":"300m","memory":"1Gi"},"limits":{"cpu":"300m","memory":"1Gi"}}`},
		{desc: "a limit with no request becomes both; ephemeral-storage is left as it is", trainer: guaranteed,
			annotation: `{"join":{"requests":{"ephemeral-storage":"1Gi"},"limits":{"cpu":"200m","memory":"200Mi","ephemeral-storage":"2Gi"}}}`,
			want:       `{"requests":{"cpu":"200m","memory":"200Mi","ephemeral-storage":"1Gi"},"limits":{"cpu":"200m","memory":"200Mi","ephemeral-storage":"2Gi"}}`},
		{desc: "an already Guaranteed sidecar is kept", trainer: guaranteed,
			annotation: `{"join":{"requests":{"cpu":"1","memory":"1Gi"},"limits":{"cpu":"1","memory":"1Gi"}}}`,
			want:       `{"requests":{"cpu":"1","memory":"1Gi"},"limits":{"cpu":"1","memory":"1Gi"}}`},
		{desc: "a sidecar with no cpu cannot be Guaranteed: memory shaped, and a warning", trainer: guaranteed,
			annotation: `{"join":{"limits":{"memory":"128Mi"}}}`,
			want:       `{"requests":{"memory":"128Mi"},"limits":{"memory":"128Mi"}}`,
			warn:       `container "trainer" has cpu and memory limits equal to its requests, but the join sidecar's resources (annotation elastic-training.io/sidecar-resources, else the webhook's --sidecar-join-resources) have no cpu: the pod is not Guaranteed`},
		{desc: "a sidecar with no resources at all cannot be Guaranteed: a warning", serve: true, trainer: guaranteed,
			annotation: `{"serve":{}}`, want: `{}`,
			warn: `the serve sidecar's resources (annotation elastic-training.io/sidecar-resources, else the webhook's --sidecar-serve-resources) have no cpu and no memory`},
		{desc: "Burstable trainer (requests only): unchanged", trainer: `{"requests":{"cpu":"8","memory":"32Gi"}}`, want: joinDefault},
		{desc: "Burstable trainer (no cpu limit): unchanged", trainer: burstable, want: joinDefault},
		{desc: "Burstable trainer (request below its limit): unchanged", serve: true,
			trainer: `{"requests":{"cpu":"4","memory":"32Gi"},"limits":{"cpu":"8","memory":"32Gi"}}`, want: serveDefault},
		{desc: "Burstable trainer (accelerators only): unchanged", trainer: `{"limits":{"nvidia.com/gpu":"4"}}`, want: joinDefault},
		{desc: "Burstable trainer (zero limits, which Kubernetes ignores): unchanged", trainer: `{"limits":{"cpu":"0","memory":"0"}}`, want: joinDefault},
		{desc: "BestEffort trainer: unchanged", trainer: `{}`, want: joinDefault},
		{desc: "Burstable trainer, the annotation's join as given", trainer: burstable,
			annotation: `{"join":{"requests":{"cpu":"100m"},"limits":{"memory":"256Mi"}}}`,
			want:       `{"requests":{"cpu":"100m"},"limits":{"memory":"256Mi"}}`},
		{desc: "pod-level resources decide the class: unchanged", trainer: guaranteed, podLevel: true, want: joinDefault},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			p := trainerPod(t, tc.serve, tc.trainer, tc.annotation)
			if tc.podLevel {
				p.Spec.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("9"), corev1.ResourceMemory: resource.MustParse("40Gi")}}
			}
			res, sc := mutated(t, p)
			assertResources(t, tc.want, sc.Resources)
			if tc.warn == "" {
				assert.Empty(t, res.Warnings)
			} else if assert.Len(t, res.Warnings, 1) {
				assert.Contains(t, res.Warnings[0], tc.warn)
			}
			// The trainer is never changed.
			assert.Equal(t, p.Spec.Containers[0].Resources, res.Pod.Spec.Containers[0].Resources)
		})
	}
}

// TestGuaranteedSidecarFollowsTheTrainer: of several containers, only the training container (annotation container,
// else kubectl.kubernetes.io/default-container, else the first) decides.
func TestGuaranteedSidecarFollowsTheTrainer(t *testing.T) {
	guaranteed := resourcesOf(t, `{"limits":{"cpu":"8","memory":"32Gi"}}`)
	shaped := `{"requests":{"cpu":"10m","memory":"128Mi"},"limits":{"cpu":"10m","memory":"128Mi"}}`
	for _, tc := range []struct {
		desc      string
		trainer   string // the annotation container's value
		guarantee string // the container made Guaranteed-shaped
		want      string
	}{
		{"the trainer is Guaranteed, the other not", "main", "main", shaped},
		{"the other is Guaranteed, the trainer not", "main", "logger", joinDefault},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			p := base(t)
			p.Spec.Containers[0].Name = "logger"
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "main", Image: "example.com/train:1.0"})
			p.Annotations[constants.AnnotationContainer] = tc.trainer
			i := slices.IndexFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == tc.guarantee })
			p.Spec.Containers[i].Resources = guaranteed
			_, sc := mutated(t, p)
			assertResources(t, tc.want, sc.Resources)
		})
	}
}

func TestQOSClass(t *testing.T) {
	pod := func(inits []string, containers ...string) *corev1.Pod {
		p := &corev1.Pod{}
		for _, r := range inits {
			p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Resources: resourcesOf(t, r)})
		}
		for _, r := range containers {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Resources: resourcesOf(t, r)})
		}
		return p
	}
	const g = `{"requests":{"cpu":"1","memory":"1Gi"},"limits":{"cpu":"1","memory":"1Gi"}}`
	assert.Equal(t, corev1.PodQOSBestEffort, testenv.QOSClass(pod(nil, `{}`, `{"limits":{"nvidia.com/gpu":"1"}}`)))
	assert.Equal(t, corev1.PodQOSGuaranteed, testenv.QOSClass(pod(nil, g, `{"limits":{"cpu":"2","memory":"2Gi"}}`)))
	assert.Equal(t, corev1.PodQOSGuaranteed, testenv.QOSClass(pod([]string{g}, g)))
	assert.Equal(t, corev1.PodQOSBurstable, testenv.QOSClass(pod([]string{`{"requests":{"cpu":"10m"}}`}, g)), "an init container counts")
	assert.Equal(t, corev1.PodQOSBurstable, testenv.QOSClass(pod(nil, g, `{}`)), "every container counts")
	assert.Equal(t, corev1.PodQOSBurstable, testenv.QOSClass(pod(nil, `{"limits":{"cpu":"1"}}`)), "memory too")
	assert.Equal(t, corev1.PodQOSBurstable, testenv.QOSClass(pod(nil, `{"requests":{"cpu":"500m","memory":"1Gi"},"limits":{"cpu":"1","memory":"1Gi"}}`)))
}

// TestGuaranteedTrainerMakesAGuaranteedPod: the class Kubernetes gives the mutated pod is Guaranteed exactly when the
// trainer (and everything else the user put in the pod) is, for a serving and a joining pod, with the webhook's
// defaults and with the job's own sidecar resources; before this, the sidecar made every pod Burstable.
func TestGuaranteedTrainerMakesAGuaranteedPod(t *testing.T) {
	const own = `{"serve":{"requests":{"cpu":"500m","memory":"256Mi"},"limits":{"memory":"1Gi"}},"join":{"requests":{"cpu":"100m","memory":"64Mi"}}}`
	for _, tc := range []struct {
		desc       string
		serve      bool
		trainer    string
		annotation string
		userInit   string // a user init container's resources ("" none), as MPI's ssh-setup
		want       corev1.PodQOSClass
	}{
		{"join, Guaranteed trainer", false, `{"requests":{"cpu":"8","memory":"32Gi"},"limits":{"cpu":"8","memory":"32Gi"}}`, "", "", corev1.PodQOSGuaranteed},
		{"serve, Guaranteed trainer", true, `{"requests":{"cpu":"8","memory":"32Gi"},"limits":{"cpu":"8","memory":"32Gi"}}`, "", "", corev1.PodQOSGuaranteed},
		{"join, trainer with limits only", false, `{"limits":{"cpu":"8","memory":"32Gi","nvidia.com/gpu":"4"}}`, "", "", corev1.PodQOSGuaranteed},
		{"serve, trainer with limits only", true, `{"limits":{"cpu":"8","memory":"32Gi","nvidia.com/gpu":"4"}}`, "", "", corev1.PodQOSGuaranteed},
		{"join, the job's own sidecar resources", false, `{"limits":{"cpu":"8","memory":"32Gi"}}`, own, "", corev1.PodQOSGuaranteed},
		{"serve, the job's own sidecar resources", true, `{"limits":{"cpu":"8","memory":"32Gi"}}`, own, "", corev1.PodQOSGuaranteed},
		{"with a Guaranteed user init container", false, `{"limits":{"cpu":"8","memory":"32Gi"}}`, "", `{"limits":{"cpu":"100m","memory":"64Mi"}}`, corev1.PodQOSGuaranteed},
		{"with a Burstable user init container", false, `{"limits":{"cpu":"8","memory":"32Gi"}}`, "", `{"requests":{"cpu":"100m"}}`, corev1.PodQOSBurstable},
		{"join, Burstable trainer", false, `{"requests":{"cpu":"8","memory":"32Gi"},"limits":{"memory":"32Gi"}}`, "", "", corev1.PodQOSBurstable},
		{"serve, Burstable trainer", true, `{"requests":{"cpu":"8","memory":"32Gi"}}`, "", "", corev1.PodQOSBurstable},
		{"BestEffort trainer: Burstable, the sidecar has requests", false, `{}`, "", "", corev1.PodQOSBurstable},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			p := trainerPod(t, tc.serve, tc.trainer, tc.annotation)
			if tc.userInit != "" {
				p.Spec.InitContainers = []corev1.Container{{Name: "ssh-setup", Image: "example.com/train:1.0", Resources: resourcesOf(t, tc.userInit)}}
			}
			res, _ := mutated(t, p)
			assert.Equal(t, tc.want, testenv.QOSClass(res.Pod))
			assert.Empty(t, res.Warnings)
		})
	}
}

// TestGuaranteedResources checks the shaping alone: the larger of request and limit, per resource, on a copy.
func TestGuaranteedResources(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"requests":{"cpu":"10m","memory":"32Mi"},"limits":{"memory":"128Mi"}}`,
			`{"requests":{"cpu":"10m","memory":"128Mi"},"limits":{"cpu":"10m","memory":"128Mi"}}`},
		{`{"limits":{"cpu":"1","memory":"1Gi"}}`, `{"requests":{"cpu":"1","memory":"1Gi"},"limits":{"cpu":"1","memory":"1Gi"}}`},
		{`{"requests":{"cpu":"2"},"limits":{"cpu":"3"}}`, `{"requests":{"cpu":"3"},"limits":{"cpu":"3"}}`},
		{`{}`, `{}`},
		{`{"requests":{"ephemeral-storage":"1Gi"}}`, `{"requests":{"ephemeral-storage":"1Gi"}}`},
	} {
		in := resourcesOf(t, tc.in)
		before := *in.DeepCopy()
		got := guaranteedResources(in)
		assertResources(t, tc.want, got)
		assert.Equal(t, before, in, "the input is left alone")
	}
}

// FuzzSidecarResources: no value panics, and one that is accepted gives the sidecar only the resources it may set,
// every limit at least its request, and leaves the defaults it does not name.
func FuzzSidecarResources(f *testing.F) {
	for _, v := range []string{`{"serve":{"requests":{"cpu":"500m","memory":"256Mi"},"limits":{"cpu":"1","memory":"1Gi"}},"join":{"requests":{"cpu":"100m"}}}`,
		`{"join":{}}`, `{"join":null}`, `{"join":{"limits":{"memory":268435456,"ephemeral-storage":"1Gi"}}}`, `[]`, `{"serve":{"claims":[]}}`} {
		f.Add(v)
	}
	def := testConfig().Defaults.SidecarResources
	f.Fuzz(func(t *testing.T, v string) {
		got, err := parseSidecarResources(v, def)
		if err != nil {
			assert.Equal(t, def, got)
			return
		}
		for _, r := range []corev1.ResourceRequirements{got.Serve, got.Join} {
			assert.Empty(t, r.Claims)
			for _, list := range []corev1.ResourceList{r.Requests, r.Limits} {
				for name, q := range list {
					assert.Contains(t, constants.SidecarResourceNames, string(name))
					assert.GreaterOrEqual(t, q.Sign(), 0)
				}
			}
			for name, req := range r.Requests {
				if lim, ok := r.Limits[name]; ok {
					assert.GreaterOrEqual(t, lim.Cmp(req), 0, "%s", name)
				}
			}
			shaped := guaranteedResources(r)
			assert.True(t, guaranteedShaped(shaped) || len(missingQoSResources(shaped)) > 0, "%v", shaped)
		}
		if !strings.Contains(v, `"serve"`) {
			assert.Equal(t, def.Serve, got.Serve)
		}
		if !strings.Contains(v, `"join"`) {
			assert.Equal(t, def.Join, got.Join)
		}
	})
}

// trainerPod is a training pod (serving the rendezvous with serve) whose trainer has the resources trainer (JSON),
// with annotation as the job's sidecar resources ("": none).
func trainerPod(t *testing.T, serve bool, trainer, annotation string) *corev1.Pod {
	t.Helper()
	p := base(t)
	if serve {
		p = servingPod(t)
	}
	p.Spec.Containers[0].Resources = resourcesOf(t, trainer)
	if annotation != "" {
		p.Annotations[constants.AnnotationSidecarResources] = annotation
	}
	return p
}

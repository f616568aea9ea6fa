package helm_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// podSpecs are the pod templates of every Job, StatefulSet and Deployment rendered, by object.
func podSpecs(t *testing.T, r *chartrender.Rendered) map[string]corev1.PodTemplateSpec {
	out := map[string]corev1.PodTemplateSpec{}
	for _, o := range r.Objects {
		switch o.Kind {
		case "Job", "StatefulSet", "Deployment":
			out[o.Key()] = servingPodTemplate(t, o)
		}
	}
	return out
}

func servingPodTemplate(t *testing.T, o chartrender.Object) corev1.PodTemplateSpec {
	p := servingPod(t, o)
	return corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec}
}

func lossToleration(key string, seconds int64) corev1.Toleration {
	return corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &seconds}
}

// Every pod of every workload kind the chart renders (the ci scenarios and examples: PyTorch Jobs, MPI launcher
// and worker StatefulSet, MXNet roles, ElasticDL groups, the dedicated rendezvous pod) leaves a lost node after
// nodeLossTolerationSeconds, not Kubernetes' 300 s.
func TestNodeLossTolerations(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	for _, sc := range scenarios(t) {
		t.Run(sc.name, func(t *testing.T) {
			r, err := render(ch, merge(sc.read(t), pinned(t)), chartrender.Options{})
			require.NoError(t, err)
			specs := podSpecs(t, r)
			require.NotEmpty(t, specs)
			for key, s := range specs {
				for _, k := range []string{"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"} {
					require.Contains(t, s.Spec.Tolerations, lossToleration(k, 10), key)
				}
			}
		})
	}
}

func TestNodeLossTolerationsValues(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	base := merge(pinned(t), map[string]any{"command": []any{"torchrun", "train.py"}, "rendezvous": map[string]any{"placement": "dedicated"}})
	mine := map[string]any{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 600}
	for name, c := range map[string]struct {
		values map[string]any
		want   []corev1.Toleration
	}{
		"seconds": {map[string]any{"nodeLossTolerationSeconds": 45},
			[]corev1.Toleration{lossToleration("node.kubernetes.io/not-ready", 45), lossToleration("node.kubernetes.io/unreachable", 45)}},
		"Kubernetes' default": {map[string]any{"nodeLossTolerationSeconds": nil}, nil},
		"a toleration of the same key wins": {map[string]any{"tolerations": []any{mine}, "rendezvous": map[string]any{"placement": "dedicated", "tolerations": []any{mine}}},
			[]corev1.Toleration{lossToleration("node.kubernetes.io/unreachable", 600), lossToleration("node.kubernetes.io/not-ready", 10)}},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := render(ch, merge(base, c.values), chartrender.Options{})
			require.NoError(t, err)
			specs := podSpecs(t, r)
			require.Len(t, specs, 2, "the worker Job and the dedicated rendezvous pod")
			for key, s := range specs {
				require.Equal(t, c.want, s.Spec.Tolerations, key)
			}
		})
	}
}

// rendezvous.restartSurvivors false reaches the serving sidecar, injected by the webhook or in the dedicated pod.
func TestRestartSurvivorsOff(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	for _, placement := range []string{"auto", "dedicated"} {
		t.Run(placement, func(t *testing.T) {
			for _, off := range []bool{false, true} {
				v := merge(pinned(t), map[string]any{"command": []any{"torchrun", "train.py"},
					"rendezvous": map[string]any{"placement": placement, "restartSurvivors": !off}})
				r, err := render(ch, v, chartrender.Options{})
				require.NoError(t, err)
				var flagged []string
				for _, o := range r.Objects {
					if o.Kind != "Job" && o.Kind != "StatefulSet" && o.Kind != "Deployment" {
						continue
					}
					pod := servingPod(t, o)
					_, ann := pod.Annotations[constants.AnnotationRdzvRestartSurvivors]
					require.Equal(t, off, ann, o.Key())
					sc := pod.Spec.Containers
					if roleOf(o) == constants.RoleWorker && placement == "auto" { // the worker serves
						c, _ := injectedSidecar(t, pod, naming.DefaultClusterDomain)
						sc = []corev1.Container{c}
					}
					for _, c := range sc {
						if c.Name == constants.SidecarContainerName && slices.Contains(c.Args, "--restart-survivors=false") {
							flagged = append(flagged, o.Key())
						}
					}
				}
				if off {
					require.Len(t, flagged, 1, "the one serving sidecar")
				} else {
					require.Empty(t, flagged)
				}
			}
		})
	}
}

// forceDeleteLostPods (default true) reaches the serving sidecar of a job with member StatefulSets (MPI workers):
// the annotation naming them, the flag and token on the sidecar the webhook injects into the launcher, and a Role
// that may get and delete exactly those pods, bound to the launcher's service account. Jobs whose members are Jobs
// (PyTorch) need none of it.
func TestForceDeleteLostPods(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	mpi := func(on bool) map[string]any {
		return merge(pinned(t), map[string]any{"framework": constants.FrameworkMPI, "forceDeleteLostPods": on,
			"mpi":          map[string]any{"launcher": map[string]any{"command": []any{"mpirun"}, "serviceAccountName": "launcher-sa"}},
			"workers":      map[string]any{"replicas": 1, "maxReplicas": 2},
			"workerGroups": map[string]any{"wide": map[string]any{"replicas": 1}}})
	}
	job := release
	for name, c := range map[string]struct {
		values map[string]any
		sets   string   // the annotation; "": none
		pods   []string // the Role's resourceNames
	}{
		"mpi":     {mpi(true), job + "-worker," + job + "-wide", []string{job + "-worker-0", job + "-worker-1", job + "-wide-0"}},
		"mpi off": {mpi(false), "", nil},
		"pytorch": {merge(pinned(t), map[string]any{"command": []any{"torchrun", "train.py"}}), "", nil},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := render(ch, c.values, chartrender.Options{})
			require.NoError(t, err)
			for key, s := range podSpecs(t, r) {
				require.Equal(t, c.sets, s.Annotations[constants.AnnotationForceDeleteLostPods], key)
			}
			// The serving sidecar's Role: the pods' rule only where there are member StatefulSets.
			role := r.Find("Role", job+"-rdzv")
			require.NotNil(t, role)
			rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
			podRules := slices.DeleteFunc(slices.Clone(rules), func(r any) bool {
				return !slices.Equal(r.(map[string]any)["resources"].([]any), []any{"pods"})
			})
			if c.sets == "" {
				require.Empty(t, podRules)
				return
			}
			require.Equal(t, []any{map[string]any{"apiGroups": []any{""}, "resources": []any{"pods"},
				"verbs": []any{"get", "delete"}, "resourceNames": toAny(c.pods)}}, podRules)
			binding := r.Find("RoleBinding", job+"-rdzv")
			require.NotNil(t, binding)
			subjects, _, _ := unstructured.NestedSlice(binding.Object, "subjects")
			require.Equal(t, []any{map[string]any{"kind": "ServiceAccount", "name": "launcher-sa", "namespace": namespace}}, subjects)

			launcher := servingPod(t, *findObject(t, r, "Job", job+"-launcher"))
			sc, volumes := injectedSidecar(t, launcher, naming.DefaultClusterDomain)
			require.Contains(t, sc.Args, "--force-delete-lost-pods-of="+c.sets)
			require.Contains(t, sc.VolumeMounts, corev1.VolumeMount{Name: constants.TokenVolumeName, MountPath: constants.TokenDir, ReadOnly: true})
			require.True(t, slices.ContainsFunc(volumes, func(v corev1.Volume) bool { return v.Name == constants.TokenVolumeName }))
		})
	}
}

func findObject(t *testing.T, r *chartrender.Rendered, kind, name string) *chartrender.Object {
	t.Helper()
	for i, o := range r.Objects {
		if o.Kind == kind && o.Name == name {
			return &r.Objects[i]
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// TestEveryLostPodIsReplaced: every pod the chart renders is replaced once Kubernetes evicts it from a lost node.
// Jobs and Deployments replace evicted pods by themselves; a StatefulSet never does (kubernetes/kubernetes#54368), so
// the only StatefulSets are member groups whose pods name them for the serving sidecar to force-delete
// (forceDeleteLostPods, internal/lostpods). Every scenario and example.
func TestEveryLostPodIsReplaced(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	for _, sc := range scenarios(t) {
		t.Run(sc.name, func(t *testing.T) {
			r, err := render(ch, merge(sc.read(t), pinned(t)), chartrender.Options{})
			require.NoError(t, err)
			for key, s := range podSpecs(t, r) {
				kind, name, _ := strings.Cut(key, "/")
				if kind != "StatefulSet" {
					continue
				}
				sets, _ := naming.StatefulSets(s.Annotations[constants.AnnotationForceDeleteLostPods])
				assert.Contains(t, sets, name, "%s: a StatefulSet whose lost pods nobody deletes would stay Terminating for ever", key)
			}
		})
	}
}

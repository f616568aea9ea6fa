package helm_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/internal/podreplace"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// hang.enabled, hang.timeout and hang.replaceAfter, from the chart through the webhook to the serving sidecar's
// flags; the defaults render no annotation, so that a default job needs no newer webhook.
func TestHangValues(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	replace := "--replace-url=" + replaceURL
	for _, tc := range []struct {
		name       string
		hang       map[string]any
		annotation string
		replace    string // the hang-replace-after annotation
		flags      []string
	}{
		{"the default: the sidecar's rule", nil, "", "", []string{replace}},
		{"off", map[string]any{"enabled": false}, "off", "", []string{"--hang=false"}},
		{"off, with a count that no longer matters", map[string]any{"enabled": false, "replaceAfter": 5}, "off", "", []string{"--hang=false"}},
		{"a timeout", map[string]any{"timeout": 30}, "30", "", []string{"--hang-timeout=30s", replace}},
		{"replaced after 3", map[string]any{"replaceAfter": 3}, "", "3", []string{replace, "--hang-replace-after=3"}},
		{"never replaced", map[string]any{"replaceAfter": 0}, "", "0", []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := map[string]any{"command": []any{"torchrun", "train.py"}, "workers": map[string]any{"replicas": 2}}
			if tc.hang != nil {
				vals["hang"] = tc.hang
			}
			pod := renderedServingPod(t, ch, vals)
			require.Equal(t, tc.annotation, pod.Annotations[constants.AnnotationHangTimeout])
			require.Equal(t, tc.replace, pod.Annotations[constants.AnnotationHangReplaceAfter])
			sc, vols := injectedSidecar(t, pod, naming.DefaultClusterDomain)
			args := sc.Args
			require.NotEmpty(t, args)
			got := slices.DeleteFunc(slices.Clone(args), func(a string) bool {
				return !strings.HasPrefix(a, "--hang") && !strings.HasPrefix(a, "--replace")
			})
			require.Equal(t, tc.flags, got)
			// The token for the webhook is there exactly where the sidecar may ask.
			var audiences []string
			for _, v := range vols {
				if v.Name == constants.TokenVolumeName {
					for _, src := range v.Projected.Sources {
						if src.ServiceAccountToken != nil && src.ServiceAccountToken.Audience != "" {
							audiences = append(audiences, src.ServiceAccountToken.Audience)
						}
					}
				}
			}
			if slices.Contains(got, replace) {
				require.Equal(t, []string{podreplace.Audience}, audiences)
			} else {
				require.Empty(t, audiences)
			}
		})
	}
}

// An MPI job's hangs: hang.enabled and hang.timeout become the launcher's `rdzv-sidecar launch` flags (its supervise
// judges the runs), and the webhook gives every worker's trainer the progress address and the Python package (the
// chart's sshd hands the container's environment to the ranks) and its sidecar --progress-addr without a run id
// (the reports go into the job's etcd); the launcher, which runs no rank, hears none.
func TestHangValuesMPI(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	for _, tc := range []struct {
		name  string
		hang  map[string]any
		flags []string
	}{
		{"the default: supervise's rule", nil, []string{}},
		{"off", map[string]any{"enabled": false}, []string{"--hang=false"}},
		{"a timeout", map[string]any{"timeout": 30}, []string{"--hang-timeout=30s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := map[string]any{"framework": "mpi", "mpi": map[string]any{"launcher": map[string]any{"command": []any{"mpirun", "python3", "train.py"}}},
				"workers": map[string]any{"replicas": 2}}
			if tc.hang != nil {
				vals["hang"] = tc.hang
			}
			r, err := render(ch, merge(pinned(t), vals), chartrender.Options{})
			require.NoError(t, err)
			launcher := servingPod(t, *findObject(t, r, "Job", release+"-launcher"))
			cmd := launcher.Spec.Containers[0].Command
			end := slices.Index(cmd, "--")
			require.Positive(t, end, "the launcher runs through rdzv-sidecar launch: %q", cmd)
			require.Equal(t, []string{"mpirun", "python3", "train.py"}, cmd[end+1:])
			got := slices.DeleteFunc(slices.Clone(cmd[:end]), func(a string) bool { return !strings.HasPrefix(a, "--hang") })
			require.Equal(t, tc.flags, got)

			worker := webhookMutated(t, servingPod(t, *findObject(t, r, "StatefulSet", release+"-worker")), naming.DefaultClusterDomain).Pod
			env := map[string]string{}
			for _, e := range worker.Spec.Containers[0].Env {
				env[e.Name] = e.Value
			}
			require.Equal(t, "127.0.0.1:"+strconv.Itoa(constants.ProgressPort), env[constants.EnvProgressAddr])
			require.Equal(t, constants.PythonDir, env[constants.EnvPythonPath])
			sc := worker.Spec.InitContainers[0]
			require.Equal(t, constants.SidecarContainerName, sc.Name)
			require.Contains(t, sc.Args, "--progress-addr=127.0.0.1:"+strconv.Itoa(constants.ProgressPort))
			require.False(t, slices.ContainsFunc(sc.Args, func(a string) bool { return strings.HasPrefix(a, "--run-id") }), "%q", sc.Args)

			sc, _ = injectedSidecar(t, launcher, naming.DefaultClusterDomain)
			require.False(t, slices.ContainsFunc(sc.Args, func(a string) bool { return strings.HasPrefix(a, "--progress-addr") }), "%q", sc.Args)
		})
	}
}

// checkpoint.replicas, from the chart through the webhook to the sidecar's --checkpoint-replicas; the default (1)
// renders no annotation.
func TestCheckpointReplicas(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	for _, tc := range []struct {
		replicas   int
		annotation string
		flag       []string
	}{{1, "", []string{}}, {2, "2", []string{"--checkpoint-replicas=2"}}, {0, "0", []string{"--checkpoint-replicas=0"}}} {
		t.Run(strconv.Itoa(tc.replicas), func(t *testing.T) {
			pod := renderedServingPod(t, ch, map[string]any{"command": []any{"torchrun", "train.py"},
				"checkpoint": map[string]any{"memory": "1Gi", "replicas": tc.replicas}})
			require.Equal(t, tc.annotation, pod.Annotations[constants.AnnotationCheckpointReplicas])
			sc, _ := injectedSidecar(t, pod, naming.DefaultClusterDomain)
			got := slices.DeleteFunc(slices.Clone(sc.Args), func(a string) bool { return !strings.HasPrefix(a, "--checkpoint-replicas") })
			require.Equal(t, tc.flag, got)
		})
	}
}

// rendezvous.leaseTTL, from the chart through the webhook to every sidecar's --lease-ttl (the members register with
// it; the serving one waits that long for a previous holder's members), and into the dedicated rendezvous pod's own
// command line; 0 (the default) renders no annotation: the sidecar's default, and no newer webhook needed.
func TestLeaseTTLValues(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	for _, tc := range []struct {
		ttl        int
		annotation string
		flag       []string
	}{{0, "", []string{}}, {3, "3", []string{"--lease-ttl=3s"}}, {60, "60", []string{"--lease-ttl=60s"}}} {
		t.Run(strconv.Itoa(tc.ttl), func(t *testing.T) {
			flags := func(args []string) []string {
				return slices.DeleteFunc(slices.Clone(args), func(a string) bool { return !strings.HasPrefix(a, "--lease-ttl") })
			}
			for _, placement := range []string{"auto", "dedicated"} {
				r, err := render(ch, merge(pinned(t), map[string]any{"command": []any{"torchrun", "train.py"},
					"rendezvous": map[string]any{"leaseTTL": tc.ttl, "placement": placement}}), chartrender.Options{})
				require.NoError(t, err)
				n := 0
				for _, o := range r.Objects {
					switch o.Kind {
					case "Job":
						pod := servingPod(t, o)
						require.Equal(t, tc.annotation, pod.Annotations[constants.AnnotationRdzvLeaseTTL], placement)
						sc, _ := injectedSidecar(t, pod, naming.DefaultClusterDomain)
						require.Equal(t, tc.flag, flags(sc.Args), "%s: the injected sidecar", placement)
						n++
					case "Deployment": // the dedicated rendezvous pod: the chart's own sidecar
						pod := servingPod(t, o)
						require.Equal(t, tc.flag, flags(pod.Spec.Containers[0].Args), "the dedicated rendezvous pod")
						n++
					}
				}
				require.Equal(t, map[string]int{"auto": 1, "dedicated": 2}[placement], n, placement)
			}
		})
	}
}

// The one Job the serving sidecar writes the job's status on (the events Job, elastic-training backend) carries
// constants.LabelStatus, so that NOTES' command lists every job of a namespace by it; no other object does, and a
// job on torch's own c10d backend (no status written) has none.
func TestStatusLabel(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	for _, tc := range []struct {
		name string
		vals map[string]any
		want []string // the labelled objects, Kind/name
	}{
		{"elastic-training backend", map[string]any{}, []string{"Job/" + release + "-worker"}},
		{"torch's c10d backend", map[string]any{"rendezvous": map[string]any{"backend": "c10d"}}, nil},
		{"mpi", map[string]any{"framework": "mpi", "mpi": map[string]any{"launcher": map[string]any{"command": []any{"mpirun"}}}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := merge(map[string]any{"command": []any{"torchrun", "train.py"}, "workers": map[string]any{"replicas": 2}}, tc.vals)
			r, err := render(ch, merge(pinned(t), vals), chartrender.Options{})
			require.NoError(t, err)
			var got []string
			for _, o := range r.Objects {
				if v, ok := o.Unstructured().GetLabels()[constants.LabelStatus]; ok {
					require.Equal(t, "true", v)
					got = append(got, o.Key())
				}
			}
			require.Equal(t, tc.want, got)
			if tc.want != nil {
				require.Contains(t, r.Notes, "get jobs -l "+constants.LabelStatus+" -o custom-columns=")
			}
		})
	}
}

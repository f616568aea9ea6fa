package helm_test

// Installing and upgrading like a cluster add-on (issue 33): one registry value moves every image of both charts,
// the job's pods carry the contract version the webhook checks, a new chart version alone never blocks a scale, and
// a host-network job's ports never land in the NodePort range.

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/mutate"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// images lists every container image of every object rendered (workloads, the helm test pod), by object and
// container.
func images(t *testing.T, r *chartrender.Rendered) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, o := range r.Objects {
		var spec []any
		switch o.Kind {
		case "Pod":
			spec = []any{"spec"}
		case "Job", "StatefulSet", "Deployment":
			spec = []any{"spec", "template", "spec"}
		default:
			continue
		}
		for _, list := range []string{"initContainers", "containers"} {
			path := make([]string, 0, len(spec)+1)
			for _, p := range spec {
				path = append(path, p.(string))
			}
			cs, _, _ := unstructured.NestedSlice(o.Obj, append(path, list)...)
			for _, c := range cs {
				m := c.(map[string]any)
				out[fmt.Sprintf("%s %s", o.Key(), m["name"])] = m["image"].(string)
			}
		}
	}
	return out
}

// One value, global.imageRegistry, moves every image of the job chart (trainers of every group, MPI's ssh-setup,
// the dedicated rendezvous pod, the helm test pod) and of the webhook chart (the webhook, its test, the sidecar it
// injects) to a mirror, keeping each repository's path; an image's own registry wins, and a digest is kept.
func TestOneRegistryMovesEveryImage(t *testing.T) {
	const mirror = "registry.example.com:5000/mirror"
	for _, values := range []string{"ci/elasticdl-values.yaml", "ci/mpi-values.yaml", "ci/pytorch-values.yaml"} {
		t.Run(values, func(t *testing.T) {
			vals := merge(sc(t, "charts/elastic-training/"+values), map[string]any{"global": map[string]any{"imageRegistry": mirror}})
			r, err := render(chartrender.Load(t, chartDir), merge(vals, pinned(t)), chartrender.Options{})
			require.NoError(t, err)
			got := images(t, r)
			require.NotEmpty(t, got)
			for where, image := range got {
				if image == constants.SidecarImagePlaceholder {
					continue // the webhook's sidecar image: the webhook chart's global.imageRegistry moves it
				}
				assert.True(t, strings.HasPrefix(image, mirror+"/"), "%s: %s is not from %s", where, image, mirror)
				assert.NotContains(t, image, "ghcr.io", where)
			}
		})
	}
	r, err := render(chartrender.Load(t, chartDir), pytorchJob(t, map[string]any{
		"global":     map[string]any{"imageRegistry": mirror},
		"image":      map[string]any{"repository": "nvcr.io/nvidia/pytorch", "tag": "25.01-py3"},
		"rendezvous": map[string]any{"placement": "dedicated", "image": map[string]any{"registry": "own.example.com", "repository": "ghcr.io/elastic-training/rdzv-sidecar"}},
	}), chartrender.Options{})
	require.NoError(t, err)
	got := images(t, r)
	assert.Equal(t, mirror+"/nvidia/pytorch:25.01-py3", got["Job/demo-worker trainer"], "the repository's registry host is replaced")
	assert.Equal(t, "own.example.com/elastic-training/rdzv-sidecar:0.2.0", got["Deployment/demo-rdzv rdzv-sidecar"], "an image's own registry wins")
	assert.Equal(t, "own.example.com/elastic-training/rdzv-sidecar:0.2.0", got["Pod/demo-test-rdzv test"])
	// By default the chart's own pods run the sidecar image the webhook injects, which the webhook sets in them
	// (internal/mutate chartpod.go): one place for it.
	def, err := render(chartrender.Load(t, chartDir), pytorchJob(t, map[string]any{"rendezvous": map[string]any{"placement": "dedicated"}}), chartrender.Options{})
	require.NoError(t, err)
	got = images(t, def)
	assert.Equal(t, constants.SidecarImagePlaceholder, got["Deployment/demo-rdzv rdzv-sidecar"])
	assert.Equal(t, constants.SidecarImagePlaceholder, got["Pod/demo-test-rdzv test"])
	plain, err := render(chartrender.Load(t, chartDir), pytorchJob(t, map[string]any{"global": map[string]any{"imageRegistry": "mirror.local"}}), chartrender.Options{})
	require.NoError(t, err)
	assert.Equal(t, "mirror.local/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", images(t, plain)["Job/demo-worker trainer"], "a Docker Hub repository gets the registry in front")

	w := renderWebhook(t, map[string]any{"global": map[string]any{"imageRegistry": mirror}})
	got = images(t, w)
	require.NotEmpty(t, got)
	for where, image := range got {
		assert.True(t, strings.HasPrefix(image, mirror+"/elastic-training/"), "%s: %s", where, image)
	}
	dep := convert[appsv1.Deployment](t, w.Find("Deployment", webhookRelease))
	assert.Contains(t, dep.Spec.Template.Spec.Containers[0].Args, "--sidecar-image="+mirror+"/elastic-training/rdzv-sidecar:0.2.0", "the injected sidecar")
	digest := "sha256:" + strings.Repeat("ab", 32)
	w = renderWebhook(t, map[string]any{"sidecar": map[string]any{"image": map[string]any{"repository": "ghcr.io/elastic-training/rdzv-sidecar", "registry": "own.example.com", "digest": digest}}})
	dep = convert[appsv1.Deployment](t, w.Find("Deployment", webhookRelease))
	assert.Contains(t, dep.Spec.Template.Spec.Containers[0].Args, "--sidecar-image=own.example.com/elastic-training/rdzv-sidecar@"+digest)
	_, err = renderWebhookChart(map[string]any{"global": map[string]any{"imageRegistry": "https://registry.example.com"}}, nil)
	require.Error(t, err, "a URL is not a registry")
}

// Every pod the job chart renders carries the contract version (the webhook denies a newer one, naming both).
func TestPodsCarryContractVersion(t *testing.T) {
	for _, s := range scenarios(t) {
		t.Run(s.name, func(t *testing.T) {
			r, err := render(chartrender.Load(t, chartDir), merge(s.read(t), pinned(t)), chartrender.Options{})
			require.NoError(t, err)
			n := 0
			for key, p := range podSpecs(t, r) {
				assert.Equal(t, strconv.Itoa(constants.ContractVersion), p.Annotations[constants.AnnotationContract], key)
				n++
			}
			require.NotZero(t, n)
		})
	}
}

// olderChart is the job chart as a release before this one rendered it: an older version, a different pod template
// (here: one annotation fewer, as before the contract annotation) and fewer values (no global.imageRegistry, no
// image.registry).
func olderChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch := chartrender.Load(t, chartDir)
	ch.Metadata.Version = "0.0.9"
	delete(ch.Values, "global")
	delete(ch.Values["image"].(map[string]any), "registry")
	for _, f := range ch.Templates {
		if f.Name == "templates/_helpers.tpl" {
			s := string(f.Data)
			line := `elastic-training.io/contract: {{ (include "elastic-training.contract" .root | fromJson).contractVersion | int | quote }}` + "\n"
			require.Contains(t, s, line)
			f.Data = []byte(strings.Replace(s, line, "", 1))
		}
	}
	return ch
}

// A new chart version whose templates render other pod templates never blocks `helm upgrade --reuse-values --set
// workers.replicas=N`: the running Jobs, StatefulSets and Deployment keep their own pod templates (a Job's is
// immutable), only their size changes; a value that changes the template is still refused.
func TestChartUpgradeKeepsRunningPodTemplates(t *testing.T) {
	for _, values := range []string{"ci/pytorch-values.yaml", "ci/elasticdl-values.yaml", "ci/mpi-values.yaml"} {
		t.Run(values, func(t *testing.T) {
			vals1 := merge(sc(t, "charts/elastic-training/"+values), pinned(t))
			old, err := render(olderChart(t), vals1, chartrender.Options{Revision: 1})
			require.NoError(t, err)
			sets := scaleSets(t, vals1)
			require.NotEmpty(t, sets)
			over := map[string]any{}
			for _, s := range sets {
				require.NoError(t, strvals.ParseInto(s, over))
			}
			vals2 := chartutil.CoalesceTables(over, vals1)
			// helm upgrade --reuse-values renders the new chart's templates with the old chart's default values;
			// --reset-then-reuse-values with the new chart's.
			reused := chartrender.Load(t, chartDir)
			reused.Values = olderChart(t).Values
			r2, err := render(reused, vals2, chartrender.Options{Revision: 2, Cluster: old.Cluster(namespace)})
			require.NoError(t, err, "a chart upgrade with --reuse-values --set %v", sets)
			r2reset, err := render(chartrender.Load(t, chartDir), vals2, chartrender.Options{Revision: 2, Cluster: old.Cluster(namespace)})
			require.NoError(t, err, "a chart upgrade with --reset-then-reuse-values --set %v", sets)
			for _, o := range r2reset.Objects {
				if o.Kind == "Job" || o.Kind == "StatefulSet" || o.Kind == "Deployment" {
					assert.Equal(t, template(t, *findObjectIn(t, old, o.Key())), template(t, o), "%s (--reset-then-reuse-values)", o.Key())
				}
			}
			fresh, err := render(chartrender.Load(t, chartDir), vals2, chartrender.Options{})
			require.NoError(t, err)
			kept := 0
			for _, o := range old.Objects {
				if o.Kind != "Job" && o.Kind != "StatefulSet" && o.Kind != "Deployment" {
					continue
				}
				var o2 *chartrender.Object
				for i := range r2.Objects {
					if r2.Objects[i].Key() == o.Key() {
						o2 = &r2.Objects[i]
					}
				}
				require.NotNil(t, o2, o.Key())
				assert.Equal(t, template(t, o), template(t, *o2), "%s keeps its running pod template", o.Key())
				assert.Equal(t, o.Obj["metadata"].(map[string]any)["annotations"].(map[string]any)["elastic-training.io/pod-template"],
					o2.Obj["metadata"].(map[string]any)["annotations"].(map[string]any)["elastic-training.io/pod-template"], o.Key())
				assert.NotEqual(t, template(t, o), template(t, *findObjectIn(t, fresh, o.Key())), "%s: the new chart does render another template", o.Key())
				kept++
			}
			require.NotZero(t, kept)
			// The size moved.
			assert.NotEqual(t, manifest(old.Objects), manifest(r2.Objects))

			// A value that changes the pod template is refused as before, whatever chart rendered the running one.
			_, err = render(chartrender.Load(t, chartDir), chartutil.CoalesceTables(map[string]any{"env": []any{map[string]any{"name": "X", "value": "1"}}}, vals1),
				chartrender.Options{Revision: 2, Cluster: old.Cluster(namespace)})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "values changed since the running revision: env")
		})
	}
}

func findObjectIn(t *testing.T, r *chartrender.Rendered, key string) *chartrender.Object {
	t.Helper()
	for i := range r.Objects {
		if r.Objects[i].Key() == key {
			return &r.Objects[i]
		}
	}
	t.Fatalf("no %s", key)
	return nil
}

// A host-network job's five ports, picked from its namespace and name, stay below Kubernetes' NodePort range
// (30000-32767) for every name; the pick is kept for the job's life (a job installed by a chart that picked from
// 20000..30990 keeps its ports on upgrade); a base given in the range is refused at install.
func TestHostNetworkPortsOutsideNodePortRange(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	baseOf := func(t *testing.T, r *chartrender.Rendered, job string) int {
		t.Helper()
		p := podSpecs(t, r)["Job/"+naming.Workload(job, "worker")]
		b, err := strconv.Atoi(p.Annotations[constants.AnnotationRdzvPorts])
		require.NoError(t, err)
		return b
	}
	seen := map[int]bool{}
	for i := range 200 {
		job := fmt.Sprintf("llm%d", i)
		vals := pytorchJob(t, map[string]any{"hostNetwork": true, "fullnameOverride": job})
		r, err := chartrender.Render(ch, vals, chartrender.Options{Release: job, Namespace: "train"})
		require.NoError(t, err)
		b := baseOf(t, r, job)
		assert.True(t, b >= 20000 && b+constants.PortSpan-1 < constants.NodePortRange[0], "job %s: base %d", job, b)
		seen[b] = true
	}
	assert.Greater(t, len(seen), 150, "names spread over the range")

	// llm18 in namespace train picked 30400 before this chart; its run ConfigMap has no rdzv-port-base. An upgrade
	// keeps 30400 (the running pods listen there); a job installed now records its pick.
	vals := pytorchJob(t, map[string]any{"hostNetwork": true, "fullnameOverride": "llm18"})
	r1, err := chartrender.Render(ch, vals, chartrender.Options{Release: "llm18", Namespace: "train", Revision: 1})
	require.NoError(t, err)
	picked := baseOf(t, r1, "llm18")
	assert.Less(t, picked+constants.PortSpan-1, constants.NodePortRange[0])
	run := r1.Find("ConfigMap", "llm18-run")
	require.NotNil(t, run)
	recorded, _, _ := unstructured.NestedString(run.Object, "data", "rdzv-port-base")
	assert.Equal(t, strconv.Itoa(picked), recorded)
	cluster := r1.Cluster("train")
	for _, o := range cluster {
		if o["kind"] == "ConfigMap" && o["metadata"].(map[string]any)["name"] == "llm18-run" {
			delete(o["data"].(map[string]any), "rdzv-port-base")
		}
	}
	r2, err := chartrender.Render(ch, vals, chartrender.Options{Release: "llm18", Namespace: "train", Revision: 2, Cluster: cluster})
	require.NoError(t, err)
	svc := r2.Find("Service", naming.RendezvousService("llm18"))
	require.NotNil(t, svc)
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	assert.Equal(t, 30400, toInt(ports[0].(map[string]any)["targetPort"]), "an older chart's pick is kept: the Service targets the running pods' port")

	for _, b := range []int{29996, 30000, 31000, 32763} {
		_, err := render(ch, pytorchJob(t, map[string]any{"hostNetwork": true, "hostNetworkPortBase": b}), chartrender.Options{})
		require.Error(t, err, "base %d", b)
		assert.Contains(t, err.Error(), "overlaps Kubernetes' NodePort range (30000-32767)")
		assert.Contains(t, err.Error(), "choose a base below 29996")
	}
	_, err = render(ch, pytorchJob(t, map[string]any{"hostNetwork": true, "hostNetworkPortBase": 29995}), chartrender.Options{})
	assert.NoError(t, err)
}

// NOTES' scale command pins the chart version the job runs, and a job whose serving pods run as the namespace's
// default account (named so by the user) is warned about.
func TestNotesPinVersionAndWarnOfDefault(t *testing.T) {
	r, err := render(chartrender.Load(t, chartDir), pytorchJob(t, nil), chartrender.Options{})
	require.NoError(t, err)
	assert.Contains(t, r.Notes, "helm upgrade demo <chart> --version 0.2.0 -n ml --reuse-values --set workers.replicas=N")
	assert.NotContains(t, r.Notes, "WARNING")
	r, err = render(chartrender.Load(t, chartDir), pytorchJob(t, map[string]any{"serviceAccount": map[string]any{"create": false}, "serviceAccountName": "default"}), chartrender.Options{})
	require.NoError(t, err)
	assert.Contains(t, r.Notes, "WARNING: the pods that serve the rendezvous run as the namespace's default account")
}

// A job chart of a newer contract than the webhook: every pod it renders (a training pod, the dedicated rendezvous
// pod) is denied by the webhook with both versions and the order of upgrades, the message the Job's FailedCreate
// Event shows; the chart's own contract is served, and so is an older chart's pod (no annotation).
func TestNewerChartRefusedByOlderWebhook(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	newer := strconv.Itoa(constants.ContractVersion + 1)
	r, err := render(ch, pytorchJob(t, map[string]any{"rendezvous": map[string]any{"placement": "dedicated"}}), chartrender.Options{})
	require.NoError(t, err)
	cfg := mutate.DefaultConfig()
	cfg.SidecarImage = "example.com/rdzv-sidecar:0.2.0"
	cfg.Version = "0.2.0"
	n := 0
	for _, o := range r.Objects {
		if o.Kind != "Job" && o.Kind != "Deployment" {
			continue
		}
		pod := servingPod(t, o)
		_, err := mutate.Mutate(mutate.Input{Pod: pod.DeepCopy(), Namespace: namespace, Config: cfg})
		require.NoError(t, err, "%s: this chart's contract", o.Key())
		old := pod.DeepCopy()
		delete(old.Annotations, constants.AnnotationContract)
		_, err = mutate.Mutate(mutate.Input{Pod: old, Namespace: namespace, Config: cfg})
		require.NoError(t, err, "%s: an older chart's pod", o.Key())
		pod.Annotations[constants.AnnotationContract] = newer
		_, err = mutate.Mutate(mutate.Input{Pod: pod, Namespace: namespace, Config: cfg})
		require.Error(t, err, o.Key())
		assert.Contains(t, err.Error(), fmt.Sprintf("this pod's job chart needs contract %s, and this webhook (elastic-training-webhook 0.2.0) serves contracts up to %d: upgrade the elastic-training-webhook chart first", newer, constants.ContractVersion), o.Key())
		n++
	}
	assert.Equal(t, 2, n, "the worker Job and the dedicated rendezvous Deployment")
}

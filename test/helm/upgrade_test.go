package helm_test

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/strvals"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// scaleSets returns the --set flags that scale every member group that can move within min..max (one up where it
// can, else one down), reading the chart's defaults under the scenario's values.
func scaleSets(t *testing.T, vals map[string]any) []string {
	t.Helper()
	all, err := chartutil.CoalesceValues(chartrender.Load(t, chartDir), vals)
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]map[string]any{}
	if w, _ := all["workers"].(map[string]any); w != nil && w["enabled"] != false {
		groups["workers"] = w
	}
	if wg, _ := all["workerGroups"].(map[string]any); wg != nil {
		for name, g := range wg {
			groups["workerGroups."+name] = g.(map[string]any)
		}
	}
	var sets []string
	for path, g := range groups {
		r := toInt(g["replicas"])
		lo, hi := r, r
		if v, ok := g["minReplicas"]; ok {
			lo = toInt(v)
		}
		if v, ok := g["maxReplicas"]; ok {
			hi = toInt(v)
		}
		switch {
		case r < hi:
			sets = append(sets, fmt.Sprintf("%s.replicas=%d", path, r+1))
		case r > lo:
			sets = append(sets, fmt.Sprintf("%s.replicas=%d", path, r-1))
		}
	}
	return sets
}

func toInt(v any) int {
	switch n := v.(type) {
	case int:
		return n
	case int64:
		return int(n)
	case float64:
		return int(n)
	}
	return 0
}

var scaleLine = regexp.MustCompile(`(?m)^  (parallelism|completions|replicas): \d+$`)

// TestUpgradeScalesOnlyMutableFields renders revision 1 of every scenario (run id and SSH key generated, not
// pinned), then revision 2 as `helm upgrade --reuse-values --set <group>.replicas=N` with revision 1's objects in
// the cluster (so lookup finds them). In every Job only spec.parallelism and spec.completions may differ (and they
// stay equal), in every StatefulSet only spec.replicas; every other object and every pod template is
// byte-identical. MXNet is the documented exception: DMLC_NUM_WORKER must equal the worker count, so its pod
// templates would change, which a Job does not allow; the chart refuses such an upgrade with a message.
func TestUpgradeScalesOnlyMutableFields(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	scaled := 0
	for _, sc := range scenarios(t) {
		t.Run(sc.name, func(t *testing.T) {
			vals1 := sc.read(t)
			sets := scaleSets(t, vals1)
			if len(sets) == 0 {
				t.Skipf("%s: no group can scale within min..max", sc.values)
			}
			scaled++
			r1, err := render(ch, vals1, chartrender.Options{Revision: 1})
			if err != nil {
				t.Fatalf("revision 1: %v", err)
			}
			objs1 := r1.Objects
			// --reuse-values: the new --set values on top of revision 1's user values.
			over := map[string]any{}
			for _, s := range sets {
				if err := strvals.ParseInto(s, over); err != nil {
					t.Fatal(err)
				}
			}
			vals2 := chartutil.CoalesceTables(over, vals1)
			r2, err := render(ch, vals2, chartrender.Options{Revision: 2, Cluster: r1.Cluster(namespace)})
			if strings.Contains(sc.name, "mxnet") {
				// A Job's pod template is immutable and MXNet's carries the worker count: refuse, and say why.
				if err == nil || !strings.Contains(err.Error(), "MXNet jobs are not elastic") {
					t.Fatalf("MXNet upgrade --set %s: want the not-elastic error, got %v", strings.Join(sets, " "), err)
				}
				return
			}
			if err != nil {
				t.Fatalf("revision 2 (--set %s): %v", strings.Join(sets, " "), err)
			}
			objs2 := r2.Objects
			byKey := map[string]chartrender.Object{}
			for _, o := range objs2 {
				byKey[o.Key()] = o
			}
			if len(objs1) != len(objs2) {
				t.Errorf("revision 1 has %d objects, revision 2 has %d", len(objs1), len(objs2))
			}
			changed := 0
			for _, o1 := range objs1 {
				o2, ok := byKey[o1.Key()]
				if !ok {
					t.Errorf("%s disappeared in revision 2", o1.Key())
					continue
				}
				if o1.YAML != o2.YAML {
					changed++
				}
				a, b := o1.YAML, o2.YAML
				switch o1.Kind {
				case "Job":
					p, c := nested(t, o2, "parallelism"), nested(t, o2, "completions")
					if p != c {
						t.Errorf("%s: parallelism %d != completions %d (elastic Indexed Jobs scale both together)", o1.Key(), p, c)
					}
					a, b = scaleLine.ReplaceAllString(a, "  $1: N"), scaleLine.ReplaceAllString(b, "  $1: N")
				case "StatefulSet", "Deployment":
					a, b = scaleLine.ReplaceAllString(a, "  $1: N"), scaleLine.ReplaceAllString(b, "  $1: N")
				}
				if diff := cmp.Diff(a, b); diff != "" {
					t.Errorf("%s changed beyond its scale fields after --set %s (-rev1 +rev2):\n%s", o1.Key(), strings.Join(sets, " "), diff)
				}
				if o1.Kind == "Job" || o1.Kind == "StatefulSet" || o1.Kind == "Deployment" {
					t1, t2 := template(t, o1), template(t, o2)
					if t1 != t2 {
						t.Errorf("%s: pod template not byte-identical across the upgrade", o1.Key())
					}
				}
			}
			if changed == 0 {
				t.Errorf("--set %s changed nothing", strings.Join(sets, " "))
			}
			// The run id was generated once and kept through lookup.
			id1, id2 := runID(t, objs1), runID(t, objs2)
			if !regexp.MustCompile(`^[a-z][-a-z0-9]*-[a-z0-9]{8}$`).MatchString(id1) {
				t.Errorf("generated run id %q: want <job>-<8 random characters>", id1)
			}
			if id1 != id2 {
				t.Errorf("run id changed across the upgrade: %q -> %q", id1, id2)
			}
		})
	}
	if scaled < 5 {
		t.Errorf("only %d scenarios could be scaled; want at least 5", scaled)
	}
}

func nested(t *testing.T, o chartrender.Object, field string) int64 {
	t.Helper()
	v, _, err := unstructured.NestedFieldNoCopy(o.Obj, "spec", field)
	if err != nil {
		t.Fatal(err)
	}
	return int64(toInt(v))
}

func template(t *testing.T, o chartrender.Object) string {
	t.Helper()
	v, _, _ := unstructured.NestedFieldNoCopy(o.Obj, "spec", "template")
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func runID(t *testing.T, objs []chartrender.Object) string {
	t.Helper()
	for _, o := range objs {
		if o.Kind == "ConfigMap" && strings.HasSuffix(o.Name, "-run") {
			id, _, _ := unstructured.NestedString(o.Obj, "data", "run-id")
			return id
		}
	}
	t.Fatal("no run ConfigMap")
	return ""
}

// TestUpgradeRefusesTemplateChanges: an upgrade that would change what every pod template carries (min/max nodes,
// MXNet's worker count) is refused by the chart with a message, instead of Kubernetes' "field is immutable".
func TestUpgradeRefusesTemplateChanges(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	cases := []struct {
		desc   string
		values string
		sets   []string
		want   string
	}{
		{"wider range", "ci/pytorch-values.yaml", []string{"workers.maxReplicas=8"},
			"upgrade refused, nothing was changed: Job demo-worker's pod template would change (values changed since the running revision: workers.maxReplicas), and Kubernetes does not let a Job's pod template change"},
		{"higher minimum in a group", "ci/elasticdl-values.yaml", []string{"workerGroups.burst.minReplicas=2"}, "(values changed since the running revision: workerGroups.burst)"},
		{"MPI range (in every pod template)", "ci/mpi-values.yaml", []string{"workerGroups.big.maxReplicas=3"}, "Job demo-launcher's pod template would change (values changed since the running revision: workerGroups.big)"},
		{"MPI worker set", "ci/mpi-values.yaml", []string{"workerGroups.big.gpus=3"}, "StatefulSet demo-big's pod template would change (values changed since the running revision: workerGroups.big), and every pod of it would restart"},
		{"image tag", "ci/pytorch-values.yaml", []string{"image.tag=2.6"}, "Job demo-worker's pod template would change (values changed since the running revision: image.tag)"},
		{"gpus", "ci/pytorch-values.yaml", []string{"workers.gpus=2"}, "(values changed since the running revision: workers.gpus)"},
		{"two values", "ci/pytorch-values.yaml", []string{"workers.gpus=2", "env[0].name=X", "env[0].value=on"}, "(values changed since the running revision: env, workers.gpus)"},
		{"the advice", "ci/pytorch-values.yaml", []string{"image.tag=2.6"}, "A running job changes only its size (helm upgrade --reuse-values --set workers.replicas=N); to change it, start a new run that resumes from your checkpoints: helm uninstall demo"},
		{"the run id to keep", "ci/pytorch-values.yaml", []string{"image.tag=2.6"}, "then helm install demo with the new values and --set runId=demo-"},
		{"the dedicated rendezvous pod", "ci/elasticdl-values.yaml", []string{"rendezvous.resources.limits.memory=1Gi"}, "Deployment demo-rdzv's pod template would change (values changed since the running revision: rendezvous.resources)"},
		{"MXNet workers", "ci/mxnet-values.yaml", []string{"workers.replicas=3"}, "workers.replicas: MXNet jobs are not elastic"},
		{"MXNet servers", "ci/mxnet-values.yaml", []string{"mxnet.servers.replicas=3"}, "mxnet.servers.replicas: MXNet jobs are not elastic"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			vals1 := chartrender.ReadValues(t, filepath.Join(chartDir, c.values))
			r1, err := render(ch, vals1, chartrender.Options{Revision: 1})
			if err != nil {
				t.Fatal(err)
			}
			over := map[string]any{}
			for _, s := range c.sets {
				if err := strvals.ParseInto(s, over); err != nil {
					t.Fatal(err)
				}
			}
			_, err = render(ch, chartutil.CoalesceTables(over, vals1), chartrender.Options{Revision: 2, Cluster: r1.Cluster(namespace)})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("upgrade --set %v: want an error containing %q, got %v", c.sets, c.want, err)
			}
			// The same values on a fresh install are fine.
			if _, err := render(ch, chartutil.CoalesceTables(over, vals1), chartrender.Options{Revision: 1}); err != nil {
				t.Errorf("install with --set %v: %v", c.sets, err)
			}
		})
	}
}

// TestDataVolumeOutlivesUninstall: the chart's PVC carries helm.sh/resource-policy: keep unless persistence.keep is
// false, so following the refusal's advice (uninstall, install again) loses no checkpoint.
func TestDataVolumeOutlivesUninstall(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	for _, keep := range []bool{true, false} {
		vals := merge(pinned(t), map[string]any{"command": []any{"torchrun", "t.py"},
			"persistence": map[string]any{"enabled": true, "keep": keep}})
		r, err := render(ch, vals, chartrender.Options{})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, o := range r.Objects {
			if o.Kind != "PersistentVolumeClaim" {
				continue
			}
			found = true
			policy, _, _ := unstructured.NestedString(o.Obj, "metadata", "annotations", "helm.sh/resource-policy")
			if want := map[bool]string{true: "keep", false: ""}[keep]; policy != want {
				t.Errorf("persistence.keep=%v: %s has resource-policy %q, want %q", keep, o.Key(), policy, want)
			}
		}
		if !found {
			t.Errorf("persistence.keep=%v: no PVC rendered", keep)
		}
	}
}

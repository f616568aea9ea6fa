package chart_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/releaseutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// TestRefusedUpgradeChangesNothing: on the real cluster, `helm upgrade --reuse-values --set image.tag=…` (a pod
// template change) is refused before anything is applied: every object of the release is as it was, and Helm
// recorded no new revision. Then the advice the refusal gives is followed: `helm uninstall` keeps the data PVC,
// and installing the job again takes that same PVC over.
func TestRefusedUpgradeChangesNothing(t *testing.T) {
	c := getCluster(t)
	ch := chartrender.Load(t, chartDir)
	dc, _, _ := clients(t, c)
	ns := c.namespace(t)
	vals := chartrender.ReadValues(t, filepath.Join(chartDir, "ci", "pytorch-values.yaml"))
	vals["tests"] = map[string]any{"enabled": false}
	vals["persistence"] = map[string]any{"enabled": true, "size": "1Gi", "accessModes": []any{"ReadWriteOnce"}}

	in := action.NewInstall(c.helmConfig(t, ns))
	in.ReleaseName, in.Namespace, in.Timeout = "job", ns, 2*time.Minute
	rel, err := in.Run(ch, vals)
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	before := versions(t, dc, ns, rel.Manifest)

	for _, set := range []map[string]any{
		{"image": map[string]any{"tag": "other"}},
		{"workers": map[string]any{"gpus": 2}},
		{"workers": map[string]any{"maxReplicas": 8}},
	} {
		desc := fmt.Sprint(set) // before Helm merges the release's values into it
		up := action.NewUpgrade(c.helmConfig(t, ns))
		up.Namespace, up.ReuseValues, up.Timeout = ns, true, 2*time.Minute
		_, err = up.Run("job", chartrender.Load(t, chartDir), set)
		if err == nil || !strings.Contains(err.Error(), "upgrade refused, nothing was changed: Job job-worker's pod template would change") {
			t.Fatalf("helm upgrade --reuse-values --set %s: want the refusal, got %v", desc, err)
		}
		t.Logf("--set %s refused: %v", desc, err)
	}
	if diff := cmp.Diff(before, versions(t, dc, ns, rel.Manifest)); diff != "" {
		t.Errorf("objects changed by refused upgrades (-before +after):\n%s", diff)
	}
	hist, err := action.NewHistory(c.helmConfig(t, ns)).Run("job")
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 1 || hist[0].Info.Status != "deployed" {
		t.Errorf("release history after refused upgrades: %d revisions (last %s), want revision 1 deployed", len(hist), hist[len(hist)-1].Info.Status)
	}

	// The advice: uninstall (the PVC stays), install again with the same run id (the new one takes the PVC over).
	pvcs := schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}
	pvc1, err := dc.Resource(pvcs).Namespace(ns).Get(context.Background(), "job-data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	runID, _ := generated(t, c, ns)
	un := action.NewUninstall(c.helmConfig(t, ns))
	un.Wait, un.Timeout = true, 2*time.Minute
	if _, err := un.Run("job"); err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	pvc2, err := dc.Resource(pvcs).Namespace(ns).Get(context.Background(), "job-data", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the data PVC after helm uninstall: %v", err)
	}
	if pvc2.GetUID() != pvc1.GetUID() || pvc2.GetDeletionTimestamp() != nil {
		t.Fatalf("the data PVC did not outlive helm uninstall (uid %s -> %s, deleting %v)", pvc1.GetUID(), pvc2.GetUID(), pvc2.GetDeletionTimestamp())
	}
	vals["image"] = map[string]any{"tag": "other"} // the change the upgrade could not make
	vals["runId"] = runID
	in = action.NewInstall(c.helmConfig(t, ns))
	in.ReleaseName, in.Namespace, in.Timeout = "job", ns, 2*time.Minute
	if _, err := in.Run(chartrender.Load(t, chartDir), vals); err != nil {
		t.Fatalf("helm install again (the refusal's advice): %v", err)
	}
	pvc3, err := dc.Resource(pvcs).Namespace(ns).Get(context.Background(), "job-data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pvc3.GetUID() != pvc1.GetUID() {
		t.Errorf("the new install made a new PVC (uid %s, was %s)", pvc3.GetUID(), pvc1.GetUID())
	}
	if id, _ := generated(t, c, ns); id != runID {
		t.Errorf("run id of the new install %q, want the kept %q", id, runID)
	}
	t.Logf("PVC job-data (uid %s) kept through uninstall and taken over by the new install; run id %s kept", pvc1.GetUID(), runID)
	if _, err := un.Run("job"); err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	if err := dc.Resource(pvcs).Namespace(ns).Delete(context.Background(), "job-data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// versions returns, for every object of a release manifest, what changes only when someone writes the object:
// metadata.generation where the API server keeps one (Jobs and StatefulSets, whose controllers write their status
// all the time, bump it only on spec changes), otherwise the resourceVersion; and its annotations and labels.
func versions(t *testing.T, dc dynamic.Interface, ns, manifest string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, doc := range releaseutil.SplitManifests(manifest) {
		var head unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &head.Object); err != nil || head.GetKind() == "" {
			continue
		}
		gvk := head.GroupVersionKind()
		gvr := schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: strings.ToLower(gvk.Kind) + "s"}
		if gvk.Kind == "NetworkPolicy" || gvk.Kind == "PodDisruptionBudget" {
			gvr.Resource = map[string]string{"NetworkPolicy": "networkpolicies", "PodDisruptionBudget": "poddisruptionbudgets"}[gvk.Kind]
		}
		live, err := dc.Resource(gvr).Namespace(ns).Get(context.Background(), head.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s %s: %v", gvk.Kind, head.GetName(), err)
		}
		v := "rv " + live.GetResourceVersion()
		if g := live.GetGeneration(); g > 0 {
			v = "generation " + strings.TrimSpace(yamlString(g))
		}
		if gvk.Kind == "PersistentVolumeClaim" { // a provisioner may bind it meanwhile: its spec is what Helm writes
			spec, _, _ := unstructured.NestedMap(live.Object, "spec")
			delete(spec, "volumeName")
			v = yamlString(spec)
		}
		out[gvk.Kind+"/"+head.GetName()] = v + " " + yamlString(live.GetAnnotations()) + yamlString(live.GetLabels())
	}
	if len(out) < 4 {
		t.Fatalf("only %d objects in the release manifest", len(out))
	}
	return out
}

func yamlString(v any) string {
	b, _ := yaml.Marshal(v)
	return string(b)
}

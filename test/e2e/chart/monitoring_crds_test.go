package chart_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// The Prometheus Operator's module whose Go types test/helm decodes the job chart's PodMonitor and PrometheusRule
// into (go.mod); its repository's module of the same version ships the CRDs.
const (
	operatorTypes  = "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring"
	operatorModule = "github.com/prometheus-operator/prometheus-operator"
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// installMonitoringCRDs makes the cluster serve the Prometheus Operator's PodMonitor and PrometheusRule, as a cluster
// with kube-prometheus-stack does: its own CRDs (from the Go module cache, `go mod download` of the operator's
// module at the version go.mod has of its types), created as the cluster admin if absent and kept (cluster-scoped,
// like the webhook chart). The operator itself does not run here: what is checked is what the API server accepts.
func installMonitoringCRDs(t *testing.T, c *cluster) {
	t.Helper()
	var typesMod struct{ Version string }
	goJSON(t, &typesMod, "list", "-m", "-json", operatorTypes)
	var mod struct{ Dir, Error string }
	goJSON(t, &mod, "mod", "download", "-json", operatorModule+"@"+typesMod.Version)
	if mod.Error != "" || mod.Dir == "" {
		t.Fatalf("go mod download %s@%s (the Prometheus Operator's CRDs): %s", operatorModule, typesMod.Version, mod.Error)
	}
	dc, err := dynamic.NewForConfig(c.REST)
	if err != nil {
		t.Fatal(err)
	}
	crds := dc.Resource(crdResource)
	for _, name := range []string{"podmonitors", "prometheusrules"} {
		path := filepath.Join(mod.Dir, "example", "prometheus-operator-crd", "monitoring.coreos.com_"+name+".yaml")
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal(data, &obj.Object); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if _, err := crds.Create(context.Background(), &obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create CRD %s: %v", obj.GetName(), err)
		}
		waitFor(t, time.Minute, "CRD "+obj.GetName()+" established", func(ctx context.Context) (bool, error) {
			got, err := crds.Get(ctx, obj.GetName(), metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, x := range conds {
				if m, _ := x.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
					return true, nil
				}
			}
			return false, fmt.Errorf("not established: %v", conds)
		})
	}
	t.Logf("the cluster serves the Prometheus Operator's PodMonitor and PrometheusRule (CRDs of %s@%s)", operatorModule, typesMod.Version)
}

// goJSON runs the go command and decodes its -json output into v.
func goJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		// go mod download -json reports its error in the JSON, with a non-zero status.
		if json.Unmarshal(out, v) == nil && len(out) > 0 {
			return
		}
		t.Fatalf("go %v: %v\n%s", args, err, stderr)
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("go %v: %v", args, err)
	}
}

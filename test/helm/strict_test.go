package helm_test

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
	volcanov1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"

	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// TestObjectsDecodeStrictly decodes every rendered object of every scenario into its typed Kubernetes Go struct
// with unknown fields rejected, so a misspelt field fails here before the API server sees it; and checks that
// each is a namespaced kind a job install may create.
func TestObjectsDecodeStrictly(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	allowed := map[string]bool{
		"ConfigMap": true, "Secret": true, "Service": true, "Job": true, "StatefulSet": true, "Deployment": true, "Pod": true,
		"NetworkPolicy": true, "PodDisruptionBudget": true, "PersistentVolumeClaim": true,
		"Role": true, "RoleBinding": true, // the serving sidecar's rights, in the namespace
		"ServiceAccount": true, // the job's own (serviceAccount.create), which alone holds those rights
		// Who serves the rendezvous (internal/servinglease): the chart makes them, the sidecars write them.
		"Lease": true, "EndpointSlice": true,
		"PodGroup": true, // queue.volcano: Volcano's gang of the job
		// monitoring.*: the Prometheus Operator's, in the job's namespace.
		"PodMonitor": true, "PrometheusRule": true,
	}
	for _, sc := range scenarios(t) {
		t.Run(sc.name, func(t *testing.T) {
			r, err := render(ch, merge(sc.read(t), pinned(t)), chartrender.Options{})
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range r.Objects {
				if !allowed[o.Kind] {
					t.Errorf("%s: not a kind a job install may create", o.Key())
					continue
				}
				decodeStrictly(t, o)
			}
		})
	}
}

// decodeStrictly decodes o into its client-go type, failing t on an unknown apiVersion or any field the type
// does not have.
func decodeStrictly(t *testing.T, o chartrender.Object) {
	t.Helper()
	apiVersion, _ := o.Obj["apiVersion"].(string)
	for gvk, typ := range strictScheme.AllKnownTypes() {
		if gvk.Kind == o.Kind && gvk.GroupVersion().String() == apiVersion {
			if err := yaml.UnmarshalStrict([]byte(o.YAML), reflect.New(typ).Interface()); err != nil {
				t.Errorf("%s (%s): %v", o.Key(), o.Source, err)
			}
			return
		}
	}
	t.Errorf("%s: unknown apiVersion %s", o.Key(), apiVersion)
}

// strictScheme knows Kubernetes' kinds, Volcano's PodGroup (volcano.sh/apis, Volcano's own Go types) and the
// Prometheus Operator's PodMonitor and PrometheusRule (its own Go types; test/e2e/chart sends them to an API server
// serving its CRDs of the same version).
var strictScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := scheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := volcanov1beta1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := monitoringv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

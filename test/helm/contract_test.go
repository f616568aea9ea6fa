package helm_test

import (
	"strings"
	"testing"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestContract checks every scenario's pod templates against internal/constants and internal/naming, the
// contract with the webhook and the sidecar (docs/contract.md).
func TestContract(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	roles := map[string]bool{constants.RoleWorker: true, constants.RoleLauncher: true, constants.RoleScheduler: true,
		constants.RoleServer: true, constants.RoleRdzv: true}
	frameworks := map[string]bool{constants.FrameworkPyTorch: true, constants.FrameworkMPI: true,
		constants.FrameworkMXNet: true, constants.FrameworkCustom: true}
	backends := map[string]bool{}
	for _, b := range constants.Backends {
		backends[b] = true
	}
	known := map[string]bool{}
	for _, k := range constants.PodAnnotations {
		known[k] = true
	}
	for _, sc := range scenarios(t) {
		t.Run(sc.name, func(t *testing.T) {
			r, err := render(ch, merge(sc.read(t), pinned(t)), chartrender.Options{})
			if err != nil {
				t.Fatal(err)
			}
			objs := r.Objects
			hosts := 0
			var job string
			for _, o := range objs {
				if o.Kind == "Service" && !strings.HasSuffix(o.Name, "-rdzv") {
					job = o.Name
				}
			}
			services := map[string]bool{}
			for _, o := range objs {
				if o.Kind == "Service" {
					services[o.Name] = true
				}
			}
			if !services[naming.HeadlessService(job)] || !services[naming.RendezvousService(job)] {
				t.Fatalf("want Services %s and %s, have %v", naming.HeadlessService(job), naming.RendezvousService(job), services)
			}
			for _, o := range objs {
				if o.Kind != "Job" && o.Kind != "StatefulSet" && o.Kind != "Deployment" {
					continue
				}
				labels, _, _ := unstructured.NestedStringMap(o.Obj, "spec", "template", "metadata", "labels")
				ann, _, _ := unstructured.NestedStringMap(o.Obj, "spec", "template", "metadata", "annotations")
				if labels[constants.LabelJob] != job || labels["app.kubernetes.io/instance"] != release {
					t.Errorf("%s: pod labels %v lack %s=%s or app.kubernetes.io/instance=%s", o.Key(), labels, constants.LabelJob, job, release)
				}
				role, group := labels[constants.LabelRole], labels[constants.LabelGroup]
				if !roles[role] {
					t.Errorf("%s: role %q is not one of the contract's roles", o.Key(), role)
				}
				if o.Name != naming.Workload(job, group) {
					t.Errorf("%s: want name naming.Workload(%q, %q) = %q", o.Key(), job, group, naming.Workload(job, group))
				}
				if !frameworks[ann[constants.AnnotationFramework]] || !backends[ann[constants.AnnotationRdzvBackend]] {
					t.Errorf("%s: framework %q / backend %q not in the contract", o.Key(), ann[constants.AnnotationFramework], ann[constants.AnnotationRdzvBackend])
				}
				if ann[constants.AnnotationRunID] == "" || ann[constants.AnnotationMinNodes] == "" || ann[constants.AnnotationMaxNodes] == "" {
					t.Errorf("%s: run id, min-nodes or max-nodes missing", o.Key())
				}
				for k := range ann {
					if strings.HasPrefix(k, constants.Domain+"/") && !known[k] {
						t.Errorf("%s: annotation %s is not in internal/constants", o.Key(), k)
					}
				}
				if ann[constants.AnnotationRdzvHost] == "true" {
					hosts++
				}
				if o.Kind != "StatefulSet" { // a Job's or Deployment's pods name the headless Service themselves
					if sub, _, _ := unstructured.NestedString(o.Obj, "spec", "template", "spec", "subdomain"); sub != naming.HeadlessService(job) {
						t.Errorf("%s: subdomain %q, want %q", o.Key(), sub, naming.HeadlessService(job))
					}
				} else if svc, _, _ := unstructured.NestedString(o.Obj, "spec", "serviceName"); svc != naming.HeadlessService(job) {
					t.Errorf("%s: serviceName %q, want %q", o.Key(), svc, naming.HeadlessService(job))
				}
			}
			if hosts != 1 {
				t.Errorf("%d groups carry %s=true, want exactly 1", hosts, constants.AnnotationRdzvHost)
			}
		})
	}
}

package helm_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// Who serves the rendezvous (internal/servinglease): every job renders the selector-less Service <job>-rdzv, its
// EndpointSlice with the same ports, the Lease, and a Role that may get and patch those two by name, bound to the
// serving pod's service account. A PyTorch c10d job with placement auto has rendezvous.standbys standbys: the
// first worker group's pods carry the annotation, and the webhook makes indices 1..n candidates too.
func TestRendezvousLeaseAndStandbys(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	job := release
	pytorch := func(over map[string]any) map[string]any {
		return merge(merge(pinned(t), map[string]any{"command": []any{"torchrun", "train.py"}, "workers": map[string]any{"replicas": 3, "maxReplicas": 4}}), over)
	}
	for name, c := range map[string]struct {
		values   map[string]any
		standbys string // the annotation on the first worker group's pods; "": none
	}{
		"pytorch defaults":                 {pytorch(nil), "1"},
		"pytorch 2 standbys":               {pytorch(map[string]any{"rendezvous": map[string]any{"standbys": 2}}), "2"},
		"pytorch 0 standbys":               {pytorch(map[string]any{"rendezvous": map[string]any{"standbys": 0}}), ""},
		"pytorch etcd-v2":                  {pytorch(map[string]any{"rendezvous": map[string]any{"backend": "etcd-v2"}}), ""},
		"pytorch elastic-training backend": {pytorch(map[string]any{"rendezvous": map[string]any{"backend": constants.BackendElasticTraining}}), "1"},
		"pytorch dedicated":                {pytorch(map[string]any{"rendezvous": map[string]any{"placement": "dedicated"}}), ""},
		"mpi": {merge(pinned(t), map[string]any{"framework": constants.FrameworkMPI,
			"mpi": map[string]any{"launcher": map[string]any{"command": []any{"mpirun"}}}}), ""},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := render(ch, c.values, chartrender.Options{})
			require.NoError(t, err)
			for key, s := range podSpecs(t, r) {
				want := ""
				if s.Annotations[constants.AnnotationRdzvHost] == "true" && s.Labels[constants.LabelRole] == constants.RoleWorker {
					want = c.standbys
				}
				assert.Equal(t, want, s.Annotations[constants.AnnotationRdzvStandbys], key)
			}

			svc := findObject(t, r, "Service", naming.RendezvousService(job))
			_, hasSelector, _ := unstructured.NestedMap(svc.Obj, "spec", "selector")
			assert.False(t, hasSelector, "the rendezvous Service selects nothing: the pod that serves points it at itself")
			slice := findObject(t, r, "EndpointSlice", naming.RendezvousService(job))
			assert.Equal(t, naming.RendezvousService(job), slice.Obj["metadata"].(map[string]any)["labels"].(map[string]any)["kubernetes.io/service-name"])
			svcPorts, _, _ := unstructured.NestedSlice(svc.Obj, "spec", "ports")
			slicePorts, _, _ := unstructured.NestedSlice(slice.Obj, "ports")
			require.Len(t, slicePorts, len(svcPorts))
			for i, p := range svcPorts { // kube-proxy matches them by name
				sp, ep := p.(map[string]any), slicePorts[i].(map[string]any)
				assert.Equal(t, sp["name"], ep["name"])
				assert.EqualValues(t, sp["targetPort"], ep["port"])
			}
			endpoints, found, _ := unstructured.NestedSlice(slice.Obj, "endpoints")
			assert.True(t, found, "endpoints: the API's schema requires the list")
			assert.Empty(t, endpoints, "a fresh install has no endpoint yet")
			findObject(t, r, "Lease", naming.RendezvousService(job))

			role := findObject(t, r, "Role", job+"-rdzv")
			rules, _, _ := unstructured.NestedSlice(role.Obj, "rules")
			for _, want := range []map[string]any{
				{"apiGroups": []any{"coordination.k8s.io"}, "resources": []any{"leases"}, "resourceNames": []any{job + "-rdzv"}, "verbs": []any{"get", "patch"}},
				{"apiGroups": []any{"discovery.k8s.io"}, "resources": []any{"endpointslices"}, "resourceNames": []any{job + "-rdzv"}, "verbs": []any{"get", "patch"}},
			} {
				assert.True(t, slices.ContainsFunc(rules, func(r any) bool { return assert.ObjectsAreEqual(want, r) }), "rule %v in %v", want, rules)
			}
			findObject(t, r, "RoleBinding", job+"-rdzv")
		})
	}
}

// An upgrade keeps the endpoint the serving pod wrote (lookup): helm must not point the Service at nothing.
func TestRendezvousEndpointKeptOnUpgrade(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	name := naming.RendezvousService(release)
	live := map[string]any{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata":  map[string]any{"name": name, "namespace": namespace},
		"endpoints": []any{map[string]any{"addresses": []any{"10.244.1.7"}, "conditions": map[string]any{"ready": true}}}}
	r, err := render(ch, merge(pinned(t), map[string]any{"command": []any{"torchrun", "train.py"}}),
		chartrender.Options{Revision: 2, Cluster: []map[string]any{live}})
	require.NoError(t, err)
	endpoints, _, _ := unstructured.NestedSlice(findObject(t, r, "EndpointSlice", name).Obj, "endpoints")
	assert.Equal(t, live["endpoints"], endpoints)
}

// The schema's bound on rendezvous.standbys is the webhook's (constants.MaxRdzvStandbys).
func TestStandbysBoundIsTheWebhooks(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartrender.Dir("elastic-training"), "values.schema.json"))
	require.NoError(t, err)
	var schema struct {
		Properties struct {
			Rendezvous struct {
				Properties struct {
					Standbys struct {
						Maximum int `json:"maximum"`
					} `json:"standbys"`
				} `json:"properties"`
			} `json:"rendezvous"`
		} `json:"properties"`
	}
	require.NoError(t, json.Unmarshal(raw, &schema))
	assert.Equal(t, constants.MaxRdzvStandbys, schema.Properties.Rendezvous.Properties.Standbys.Maximum)
	_, err = render(chartrender.Load(t, chartDir), merge(pinned(t), map[string]any{"command": []any{"torchrun", "train.py"},
		"rendezvous": map[string]any{"standbys": constants.MaxRdzvStandbys + 1}}), chartrender.Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "standbys")
	assert.Contains(t, err.Error(), strconv.Itoa(constants.MaxRdzvStandbys))
}

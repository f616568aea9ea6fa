package helm_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// The pod and container fields people expect (they were refused by the schema): rendered where Kubernetes reads
// them, a group's merged with the top level's as the other settings are (ci/everything-values.yaml also goes to
// a real API server in test/e2e/chart).
func TestPodFields(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	vals := merge(pinned(t), chartrender.ReadValues(t, chartDir+"/ci/everything-values.yaml"))
	vals["workers"] = merge(vals["workers"].(map[string]any), map[string]any{
		"ports":       []any{map[string]any{"name": "debug", "containerPort": 5678}},
		"hostAliases": []any{map[string]any{"ip": "10.0.0.11", "hostnames": []any{"ckpt.internal"}}},
		"lifecycle":   map[string]any{"preStop": map[string]any{"exec": map[string]any{"command": []any{"/bin/sync"}}}},
	})
	r, err := render(ch, vals, chartrender.Options{})
	require.NoError(t, err)
	tmpl := podSpecs(t, r)["Job/bert-worker"]
	require.Equal(t, "true", tmpl.Annotations["karpenter.sh/do-not-disrupt"], "worker 0 may serve the rendezvous (rendezvous.doNotDisrupt)")
	require.Equal(t, "false", tmpl.Annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"])
	s := tmpl.Spec
	c := s.Containers[0]
	require.Equal(t, "/opt", c.WorkingDir)
	require.Equal(t, []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090}, {Name: "debug", ContainerPort: 5678}}, c.Ports)
	require.Equal(t, "/healthz", c.StartupProbe.HTTPGet.Path)
	require.EqualValues(t, 60, c.StartupProbe.FailureThreshold)
	require.NotNil(t, c.LivenessProbe)
	require.Nil(t, c.Lifecycle.PostStart, "the group's lifecycle replaces the top level's whole")
	require.Equal(t, []string{"/bin/sync"}, c.Lifecycle.PreStop.Exec.Command)
	require.Equal(t, []corev1.ResourceClaim{{Name: "ib"}}, c.Resources.Claims)
	require.Equal(t, []corev1.PodResourceClaim{{Name: "ib", ResourceClaimTemplateName: ptr("infiniband")}}, s.ResourceClaims)
	require.Equal(t, []corev1.HostAlias{{IP: "10.0.0.10", Hostnames: []string{"datasets.internal"}}, {IP: "10.0.0.11", Hostnames: []string{"ckpt.internal"}}}, s.HostAliases)
	require.Equal(t, "ndots", s.DNSConfig.Options[0].Name)

	// suspend, and exit-code rules after the chart's own.
	vals = merge(vals, map[string]any{"suspend": true, "restartPolicy": "Never", "podFailureRules": []any{map[string]any{"action": "FailJob",
		"onExitCodes": map[string]any{"containerName": "trainer", "operator": "In", "values": []any{42}}}}})
	r, err = render(ch, vals, chartrender.Options{})
	require.NoError(t, err)
	job := fromUnstructured[batchv1.Job](t, r.Find("Job", "bert-worker"))
	require.True(t, *job.Spec.Suspend)
	rules := job.Spec.PodFailurePolicy.Rules
	require.Len(t, rules, 2)
	require.Equal(t, batchv1.PodFailurePolicyActionIgnore, rules[0].Action, "the chart's DisruptionTarget rule first")
	require.Equal(t, batchv1.PodFailurePolicyActionFailJob, rules[1].Action)
	require.Equal(t, []int32{42}, rules[1].OnExitCodes.Values)

	mpi := merge(pinned(t), chartrender.ReadValues(t, chartDir+"/ci/mpi-values.yaml"))
	mpi["suspend"] = true
	r, err = render(ch, mpi, chartrender.Options{})
	require.NoError(t, err)
	sts := fromUnstructured[appsv1.StatefulSet](t, r.Find("StatefulSet", "demo-worker"))
	require.Zero(t, *sts.Spec.Replicas, "a suspended job's StatefulSets have no pods")
}

func ptr[T any](v T) *T { return &v }

func fromUnstructured[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	require.NotNil(t, u)
	out := new(T)
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out))
	return out
}

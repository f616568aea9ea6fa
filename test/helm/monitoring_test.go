package helm_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// monitoring.podMonitor and monitoring.prometheusRule: a PodMonitor of the job's sidecars on their health port that
// names the job and the group in each series, and the job's alerts selecting that job; neither by default.
// test/integration/monitoring runs both through a real Prometheus.
func TestMonitoring(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	base := map[string]any{"command": []any{"torchrun", "train.py"}}
	r, err := render(ch, merge(pinned(t), base), chartrender.Options{})
	require.NoError(t, err)
	assert.Nil(t, r.Find("PodMonitor", ""), "off by default")
	assert.Nil(t, r.Find("PrometheusRule", ""), "off by default")

	on := merge(base, map[string]any{"monitoring": map[string]any{
		"podMonitor":     map[string]any{"enabled": true, "interval": "15s", "labels": map[string]any{"release": "kps"}},
		"prometheusRule": map[string]any{"enabled": true, "noProgressMinutes": 7, "roundChurn": 3}}})
	r, err = render(ch, merge(pinned(t), on), chartrender.Options{})
	require.NoError(t, err)
	pm := r.Find("PodMonitor", release)
	require.NotNil(t, pm)
	assert.Equal(t, "monitoring.coreos.com/v1", pm.GetAPIVersion())
	assert.Equal(t, "kps", pm.GetLabels()["release"])
	sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	assert.Equal(t, map[string]string{"elastic-training.io/job": release}, sel)
	eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	require.Len(t, eps, 1)
	ep := eps[0].(map[string]any)
	assert.Equal(t, "rdzv-health", ep["port"], "the port name the webhook gives the sidecar (and the dedicated pod has)")
	assert.Equal(t, "15s", ep["interval"])
	assert.Contains(t, fmt.Sprint(ep["relabelings"]), "targetLabel:training_job")

	rule := r.Find("PrometheusRule", release)
	require.NotNil(t, rule)
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	require.Len(t, groups, 1)
	rules := groups[0].(map[string]any)["rules"].([]any)
	exprs := map[string]string{}
	for _, x := range rules {
		m := x.(map[string]any)
		exprs[m["alert"].(string)] = m["expr"].(string)
	}
	require.Len(t, exprs, 3)
	sel2 := fmt.Sprintf(`{namespace=%q, training_job=%q}`, namespace, release)
	assert.Equal(t, `max by (namespace, training_job) (elastic_training_job_step`+sel2+`) > 0 and max by (namespace, training_job) (changes(elastic_training_job_step`+sel2+`[7m])) == 0`, exprs["ElasticTrainingNoProgress"])
	assert.Contains(t, exprs["ElasticTrainingRoundChurn"], ">= 3")
	assert.Contains(t, exprs["ElasticTrainingHung"], "elastic_training_job_hangs_total"+sel2)
}

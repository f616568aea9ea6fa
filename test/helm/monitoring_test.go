package helm_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
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

// The Grafana dashboard file loads as Grafana needs it: one JSON object with a uid and a title, panels with unique
// ids inside Grafana's 24 columns, every panel and annotation on the dashboard's data source variable, and only the
// job's metrics (elastic_training_*) and its variables in the queries. That each query returns series is
// TestMonitoringThroughPrometheus's (test/integration/sidecar), with a real Prometheus.
func TestGrafanaDashboard(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(webhookChartDir, "dashboards", "elastic-training.json"))
	require.NoError(t, err)
	var d struct {
		UID, Title    string
		SchemaVersion int
		Panels        []struct {
			ID         int
			Title      string
			Datasource struct{ UID string }
			GridPos    struct{ X, Y, W, H int }
			Targets    []struct{ Expr string }
		}
		Annotations struct {
			List []struct {
				Expr       string
				Datasource struct{ UID string }
			}
		}
		Templating struct{ List []struct{ Name string } }
	}
	require.NoError(t, json.NewDecoder(bytes.NewReader(data)).Decode(&d))
	assert.Equal(t, "elastic-training-jobs", d.UID)
	assert.NotEmpty(t, d.Title)
	assert.GreaterOrEqual(t, d.SchemaVersion, 36)
	var vars []string
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name)
	}
	assert.Equal(t, []string{"datasource", "namespace", "job"}, vars)
	metric := regexp.MustCompile(`\b[a-z_]+_(total|size|step|second|round|members)\b`)
	ids := map[int]bool{}
	require.NotEmpty(t, d.Panels)
	for _, p := range d.Panels {
		assert.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		assert.Equal(t, "${datasource}", p.Datasource.UID, p.Title)
		assert.LessOrEqual(t, p.GridPos.X+p.GridPos.W, 24, p.Title)
		assert.Positive(t, p.GridPos.H, p.Title)
		require.Len(t, p.Targets, 1, p.Title)
		e := p.Targets[0].Expr
		assert.Contains(t, e, `namespace="$namespace", training_job=~"$job"`, p.Title)
		for _, m := range metric.FindAllString(e, -1) {
			assert.True(t, strings.HasPrefix(m, "elastic_training_"), "%s: %s is not one of the product's metrics", p.Title, m)
		}
	}
	for _, a := range d.Annotations.List {
		assert.Equal(t, "${datasource}", a.Datasource.UID)
		assert.Contains(t, a.Expr, `training_job=~"$job"`)
	}
}

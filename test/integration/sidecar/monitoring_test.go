package sidecar_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

const (
	jobChart     = "../../../charts/elastic-training"
	webhookChart = "../../../charts/elastic-training-webhook"
	dashboard    = webhookChart + "/dashboards/elastic-training.json"
	monitoredNS  = "team-a"
)

// What the charts ship for Prometheus, through a real Prometheus (Debian's prometheus package) and real sidecars of
// a job training with real torchrun (torch 2.14) and elastic_training.progress: the job chart's PodMonitor becomes
// Prometheus' scrape configuration (its relabelings, over the labels Kubernetes' pod discovery would give each
// target), the alert rules of both charts load (promtool check rules, and Prometheus' own rule manager says each is
// healthy), and every query of the Grafana dashboard (its panels, annotations and variables) returns the job's
// series. No Prometheus Operator runs here (it needs a cluster with its CRDs); what it would do with a PodMonitor is
// the translation below, which follows its documented fields.
func TestMonitoringThroughPrometheus(t *testing.T) {
	prom, err := exec.LookPath("prometheus")
	require.NoError(t, err, "Debian's prometheus package (hack/deps.sh test installs it)")
	promtool, err := exec.LookPath("promtool")
	require.NoError(t, err)
	const job = "bert"
	jobObjs, err := chartrender.RenderDir(jobChart, map[string]any{"command": []any{"torchrun", "train.py"},
		"monitoring": map[string]any{"podMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}}},
		chartrender.Options{Release: job, Namespace: monitoredNS})
	require.NoError(t, err)
	webhookObjs, err := chartrender.RenderDir(webhookChart, map[string]any{"metrics": map[string]any{"prometheusRule": map[string]any{"enabled": true}}},
		chartrender.Options{Release: "elastic-training-webhook", Namespace: "elastic-training-system"})
	require.NoError(t, err)
	pm := jobObjs.Find("PodMonitor", job)
	require.NotNil(t, pm)

	dir := t.TempDir()
	var rules []string
	for i, r := range []*chartrender.Rendered{jobObjs, webhookObjs} {
		obj := r.Find("PrometheusRule", "")
		require.NotNil(t, obj)
		spec, err := yaml.Marshal(obj.Object["spec"])
		require.NoError(t, err)
		f := filepath.Join(dir, fmt.Sprintf("rules-%d.yaml", i))
		require.NoError(t, os.WriteFile(f, spec, 0o644))
		rules = append(rules, f)
	}
	out, err := exec.Command(promtool, append([]string{"check", "rules"}, rules...)...).CombinedOutput()
	require.NoError(t, err, "promtool check rules: %s", out)

	tr := newTrainer(t, testenv.SuiteForky)
	const run = "monitored"
	o := newOwnRdzv(t, tr, run, "2", "STEP_SLEEP=0.2")
	port := testenv.FreePort(t)
	targets := []map[string]any{target(o.s.Health, job, "rdzv", "bert-rdzv-0")}
	for i := range 2 {
		host := fmt.Sprintf("127.0.0.%d", i+1)
		addr := fmt.Sprintf("%s:%d", host, port)
		_, health := startJoinHealth(t, o.s.URL, host, 1, "", fmt.Sprintf("--member-index=%d", i), "--progress-addr="+addr, "--run-id="+run,
			"--c10d-addr="+fmt.Sprintf("%s:%d", host, testenv.FreePort(t)), "--c10d-upstream="+o.s.C10d)
		script, err := filepath.Abs("testdata/hang_train.py")
		require.NoError(t, err)
		args := append(append([]string{"--local_addr=" + host}, o.args...), script)
		o.tr.startAgent(t, fmt.Sprintf("agent-%d", i), append(slices.Clip(o.env), constants.EnvProgressAddr+"="+addr), args...)
		targets = append(targets, target(health, job, "worker", fmt.Sprintf("bert-worker-%d", i)))
	}

	// The PodMonitor's endpoint as Prometheus' scrape configuration: its path, and its relabelings in Prometheus'
	// own spelling; the targets carry the labels of Kubernetes' pod discovery that the relabelings read.
	eps := pm.Object["spec"].(map[string]any)["podMetricsEndpoints"].([]any)
	require.Len(t, eps, 1)
	ep := eps[0].(map[string]any)
	var relabel []map[string]any
	for _, r := range ep["relabelings"].([]any) {
		relabel = append(relabel, relabelConfig(t, r.(map[string]any)))
	}
	cfg := map[string]any{
		"global":     map[string]any{"scrape_interval": "1s", "evaluation_interval": "1s"},
		"rule_files": rules,
		"scrape_configs": []any{map[string]any{"job_name": "podMonitor/" + monitoredNS + "/" + job + "/0",
			"metrics_path": ep["path"], "scheme": ep["scheme"], "static_configs": targets, "relabel_configs": relabel}},
	}
	data, err := yaml.Marshal(cfg)
	require.NoError(t, err)
	cfgFile := filepath.Join(dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(cfgFile, data, 0o644))
	web := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	testenv.Start(t, "prometheus", exec.Command(prom, "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+web, "--log.level=warn"))
	api := "http://" + web + "/api/v1/"

	testenv.Eventually(t, 60*time.Second, "every target up", func() error {
		var r struct {
			Data struct {
				ActiveTargets []struct{ Health, LastError, ScrapeURL string } `json:"activeTargets"`
			} `json:"data"`
		}
		if err := getJSON(api+"targets", &r); err != nil {
			return err
		}
		if len(r.Data.ActiveTargets) != len(targets) {
			return fmt.Errorf("%d targets", len(r.Data.ActiveTargets))
		}
		for _, tg := range r.Data.ActiveTargets {
			if tg.Health != "up" {
				return fmt.Errorf("%s: %s %s", tg.ScrapeURL, tg.Health, tg.LastError)
			}
		}
		return nil
	})

	d := readDashboard(t)
	vars := map[string]string{"$namespace": monitoredNS, "$job": job, "${datasource}": "prometheus"}
	subst := func(q string) string {
		for k, v := range vars {
			q = strings.ReplaceAll(q, k, v)
		}
		return q
	}
	// The panels: each query returns the job's series once it trains (the step gauge above 0: progress heard).
	testenv.Eventually(t, 90*time.Second, "every panel's query returns series", func() error {
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				n, err := query(api, subst(tg.Expr))
				if err != nil {
					return fmt.Errorf("panel %q: %w", p.Title, err)
				}
				if n == 0 {
					return fmt.Errorf("panel %q: no series for %s", p.Title, subst(tg.Expr))
				}
			}
		}
		if n, err := query(api, subst(`max(elastic_training_job_step{namespace="$namespace", training_job=~"$job"}) > 0`)); err != nil || n == 0 {
			return fmt.Errorf("the step gauge: %d series, %v", n, err)
		}
		return nil
	})
	for _, a := range d.Annotations.List {
		_, err := query(api, subst(a.Expr))
		require.NoError(t, err, "annotation %q", a.Name)
	}
	// The variables: label_values(metric, label), which Grafana asks Prometheus' label values API.
	lv := regexp.MustCompile(`^label_values\((.+), (\w+)\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		require.NoError(t, json.Unmarshal(v.Query, &q), "variable %s", v.Name)
		m := lv.FindStringSubmatch(q.Query)
		require.NotNil(t, m, "variable %s: %q", v.Name, q.Query)
		var r struct{ Data []string }
		require.NoError(t, getJSON(api+"label/"+m[2]+"/values?match[]="+url.QueryEscape(subst(m[1])), &r))
		want := map[string]string{"namespace": monitoredNS, "job": job}[v.Name]
		require.Contains(t, r.Data, want, "variable %s offers the job's", v.Name)
	}
	// The alerts: loaded, evaluated and healthy; the job's own hang alert is quiet (nothing hung).
	testenv.Eventually(t, 30*time.Second, "every rule evaluated and healthy", func() error {
		var r struct {
			Data struct {
				Groups []struct {
					Rules []struct{ Name, Health, LastError, State string }
				}
			}
		}
		if err := getJSON(api+"rules", &r); err != nil {
			return err
		}
		n := 0
		for _, g := range r.Data.Groups {
			for _, rule := range g.Rules {
				n++
				if rule.Health != "ok" {
					return fmt.Errorf("%s: %s %s", rule.Name, rule.Health, rule.LastError)
				}
				if rule.Name == "ElasticTrainingHung" && rule.State != "inactive" {
					return fmt.Errorf("%s is %s", rule.Name, rule.State)
				}
			}
		}
		if n != 4 {
			return fmt.Errorf("%d rules loaded, want 4", n)
		}
		return nil
	})
}

// target is a static target with the labels Kubernetes' pod discovery would give a pod of the job.
func target(addr, job, group, pod string) map[string]any {
	return map[string]any{"targets": []string{addr}, "labels": map[string]string{
		"__meta_kubernetes_pod_label_elastic_training_io_job":   job,
		"__meta_kubernetes_pod_label_elastic_training_io_group": group,
		"__meta_kubernetes_pod_name":                            pod,
		"__meta_kubernetes_namespace":                           monitoredNS,
	}}
}

// relabelConfig is a PodMonitor relabeling (the Prometheus Operator's RelabelConfig) in Prometheus' spelling.
func relabelConfig(t *testing.T, r map[string]any) map[string]any {
	names := map[string]string{"sourceLabels": "source_labels", "targetLabel": "target_label", "regex": "regex",
		"replacement": "replacement", "action": "action", "separator": "separator", "modulus": "modulus"}
	out := map[string]any{}
	for k, v := range r {
		n, ok := names[k]
		require.True(t, ok, "a relabeling field this test does not translate: %s", k)
		out[n] = v
	}
	return out
}

type grafanaDashboard struct {
	Panels []struct {
		ID      int
		Title   string
		Targets []struct{ Expr string }
	}
	Annotations struct {
		List []struct{ Name, Expr string }
	}
	Templating struct {
		List []struct {
			Name, Type string
			Query      json.RawMessage // a query variable's {"query": ...}; a data source variable's plugin id
		}
	}
}

func readDashboard(t *testing.T) grafanaDashboard {
	data, err := os.ReadFile(dashboard)
	require.NoError(t, err)
	var d grafanaDashboard
	require.NoError(t, json.Unmarshal(data, &d))
	return d
}

// query runs an instant query and returns how many series it gave.
func query(api, q string) (int, error) {
	var r struct {
		Status, Error string
		Data          struct{ Result []json.RawMessage }
	}
	if err := getJSON(api+"query?query="+url.QueryEscape(q), &r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("%s: %s", q, r.Error)
	}
	return len(r.Data.Result), nil
}

func getJSON(u string, v any) error {
	resp, err := http.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("%s: %s: %w", u, resp.Status, err)
	}
	return nil
}

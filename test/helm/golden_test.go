package helm_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/lint/support"

	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// scenario is one values file rendered to one golden file.
type scenario struct {
	name   string // golden file: testdata/<name>.golden.yaml
	values string // path of the values file
}

// read is the scenario's values: its file, and what its usage gives with --set-file (chartrender.AddSetFiles).
func (sc scenario) read(t *testing.T) map[string]any {
	t.Helper()
	return chartrender.ReadValues(t, sc.values)
}

// scenarios: every charts/elastic-training/ci/*-values.yaml and every examples/*.yaml.
func scenarios(t *testing.T) []scenario {
	t.Helper()
	var out []scenario
	ci, _ := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	for _, p := range ci {
		out = append(out, scenario{name: "ci-" + strings.TrimSuffix(filepath.Base(p), "-values.yaml"), values: p})
	}
	ex, _ := filepath.Glob(filepath.Join(examplesDir, "*.yaml"))
	for _, p := range ex {
		out = append(out, scenario{name: "example-" + strings.TrimSuffix(filepath.Base(p), ".yaml"), values: p})
	}
	if len(ci) < 5 || len(ex) < 5 {
		t.Fatalf("want at least 5 ci scenarios and 5 examples, found %d and %d", len(ci), len(ex))
	}
	return out
}

// TestGolden renders every scenario and compares it with testdata/<scenario>.golden.yaml (-update rewrites them).
func TestGolden(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	used := map[string]bool{}
	for _, sc := range scenarios(t) {
		golden := filepath.Join("testdata", sc.name+".golden.yaml")
		used[golden] = true
		t.Run(sc.name, func(t *testing.T) {
			r, err := render(ch, merge(sc.read(t), pinned(t)), chartrender.Options{})
			if err != nil {
				t.Fatalf("render %s: %v", sc.values, err)
			}
			got := manifest(r.Objects) + "---\n# NOTES.txt\n" + commented(r.Notes)
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./test/helm -update)", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("%s differs from %s (-want +got); run go test ./test/helm -update if intended:\n%s", sc.values, golden, diff)
			}
		})
	}
	all, _ := filepath.Glob(filepath.Join("testdata", "*.golden.yaml"))
	for _, g := range all {
		if !used[g] && !*update {
			t.Errorf("%s belongs to no scenario: delete it", g)
		}
		if !used[g] && *update {
			_ = os.Remove(g)
		}
	}
}

// TestLint lints the chart with every scenario's values through the SDK (action.NewLint): no warnings, no errors.
func TestLint(t *testing.T) {
	for _, sc := range append([]scenario{{name: "defaults"}}, scenarios(t)...) {
		t.Run(sc.name, func(t *testing.T) {
			vals := map[string]any{}
			if sc.values != "" {
				vals = sc.read(t)
			}
			lintStrict(t, chartDir, namespace, vals)
		})
	}
}

// lintStrict fails t on every warning or error of `helm lint --strict` of the chart in dir with vals.
func lintStrict(t *testing.T, dir, ns string, vals map[string]any) {
	t.Helper()
	l := action.NewLint()
	l.Strict = true
	l.Namespace = ns
	l.KubeVersion = &chartrender.KubeVersion
	res := l.Run([]string{dir}, vals)
	for _, m := range res.Messages {
		if m.Severity >= support.WarningSev {
			t.Errorf("lint: %s", m.Error())
		}
	}
	for _, err := range res.Errors {
		t.Errorf("lint: %v", err)
	}
}

// commented turns text into YAML comment lines.
func commented(text string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		if l == "" {
			b.WriteString("#\n")
			continue
		}
		b.WriteString("# " + l + "\n")
	}
	return b.String()
}

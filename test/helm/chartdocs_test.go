package helm_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/chart/loader"
	"sigs.k8s.io/yaml"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

// TestChartDocs checks that every chart's committed README.md is what `make generate` generates now: it runs
// hack/chart-docs.sh (helm-docs as pinned in hack/tools/go.mod, built through the Go module cache or proxy) on a
// copy of charts/ and compares. With -update it writes the generated READMEs into charts/ instead. It also checks
// that the values table leaves no value undescribed, and that Helm packages the README (`helm show readme`).
func TestChartDocs(t *testing.T) {
	root := testenv.RepoRoot()
	charts := filepath.Join(root, "charts")
	tmp := filepath.Join(t.TempDir(), "charts")
	if err := os.CopyFS(tmp, os.DirFS(charts)); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", filepath.Join(root, "hack", "chart-docs.sh"), tmp)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/chart-docs.sh: %v\n%s\n(helm-docs is built from hack/tools/go.mod: it needs the Go module proxy "+
			"or `cd hack/tools && go mod download` beforehand)", err, out)
	}
	names, _ := filepath.Glob(filepath.Join(charts, "*", "Chart.yaml"))
	if len(names) < 2 {
		t.Fatalf("found charts %q under %s, want both charts", names, charts)
	}
	for _, name := range names {
		chart := filepath.Base(filepath.Dir(name))
		t.Run(chart, func(t *testing.T) {
			dir := filepath.Join(charts, chart)
			if _, err := os.Stat(filepath.Join(dir, "README.md.gotmpl")); err != nil {
				t.Fatalf("%v: every chart needs a README.md.gotmpl for helm-docs", err)
			}
			want, err := os.ReadFile(filepath.Join(tmp, chart, "README.md"))
			if err != nil {
				t.Fatal(err)
			}
			readme := filepath.Join(dir, "README.md")
			if *update {
				if err := os.WriteFile(readme, want, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := os.ReadFile(readme)
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("charts/%s/README.md is not what helm-docs generates from README.md.gotmpl and values.yaml: "+
					"run make generate (-committed +generated):\n%s", chart,
					cmp.Diff(strings.Split(string(got), "\n"), strings.Split(string(want), "\n")))
			}
			checkValuesDescribed(t, chart, dir, string(want))
			checkHelmShowsReadme(t, dir, got)
		})
	}
}

// checkValuesDescribed fails for each value that has no row with a description in the generated values table:
// every key needs one, except the keys of a map whose row shows its whole default (a map whose row says "see
// below", or that has no row, needs one for each key). helm-docs leaves out a value whose comment does not parse
// (e.g. text with " --" after the leading "# --") and shows one without a comment with an empty description.
func checkValuesDescribed(t *testing.T, chart, dir, readme string) {
	t.Helper()
	type row struct{ def, desc string }
	rows := map[string]row{}
	inTable := false
	for _, l := range strings.Split(readme, "\n") {
		if strings.HasPrefix(l, "| Key | Type | Default | Description |") {
			inTable = true
			continue
		}
		if !inTable || strings.HasPrefix(l, "|---") {
			continue
		}
		if !strings.HasPrefix(l, "| ") {
			inTable = false
			continue
		}
		cells := strings.Split(strings.TrimSuffix(strings.TrimPrefix(l, "| "), " |"), " | ")
		if len(cells) < 4 {
			t.Errorf("values table row %q: want | key | type | default | description |", l)
			continue
		}
		rows[cells[0]] = row{def: strings.Join(cells[2:len(cells)-1], " | "), desc: cells[len(cells)-1]}
	}
	raw, err := os.ReadFile(filepath.Join(dir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	var missing []string
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			key := prefix + k
			r, ok := rows[key]
			sub, isMap := v.(map[string]any)
			switch {
			case !ok && isMap && len(sub) > 0:
				walk(key+".", sub) // no row of its own: each of its keys needs one
			case !ok || strings.TrimSpace(r.desc) == "":
				missing = append(missing, key)
			case isMap && r.def == "see below":
				walk(key+".", sub)
			}
		}
	}
	walk("", values)
	if len(missing) > 0 {
		sort.Strings(missing)
		t.Errorf("charts/%s/values.yaml: no description in the values table for %s: give each a `# -- ...` comment "+
			"(no \" --\" in its text but the leading one; a map whose row defaults to \"see below\" needs one on each "+
			"key), then run make generate", chart, strings.Join(missing, ", "))
	}
}

// checkHelmShowsReadme: Helm loads README.md with the chart, so `helm show readme` prints it, and leaves
// README.md.gotmpl out (.helmignore).
func checkHelmShowsReadme(t *testing.T, dir string, readme []byte) {
	t.Helper()
	ch, err := loader.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, f := range ch.Files {
		files = append(files, f.Name)
		if f.Name == "README.md" && !bytes.Equal(f.Data, readme) {
			t.Errorf("the loaded chart's README.md differs from %s/README.md", dir)
		}
	}
	if !slices.Contains(files, "README.md") {
		t.Errorf("the loaded chart has no README.md (files %q): helm show readme would print nothing", files)
	}
	if slices.Contains(files, "README.md.gotmpl") {
		t.Errorf("the loaded chart carries README.md.gotmpl: add it to %s/.helmignore", dir)
	}
}

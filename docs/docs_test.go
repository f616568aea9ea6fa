// Package docs holds the checks that keep the design documents true to the code they describe.
package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docs/architecture.md's table of who owns what names every package under internal/, and only those.
func TestOwnersTableNamesEveryPackage(t *testing.T) {
	doc, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "| package | owns | I/O |")
	if !ok {
		t.Fatal(`docs/architecture.md has no table "| package | owns | I/O |"`)
	}
	table, _, _ = strings.Cut(table, "\n\n")
	listed := map[string]bool{}
	for _, row := range strings.Split(table, "\n") {
		cells := strings.Split(row, "|")
		if len(cells) < 2 {
			continue
		}
		for _, m := range regexp.MustCompile("`(internal/[^`]+)`").FindAllStringSubmatch(cells[1], -1) {
			listed[m[1]] = true
		}
	}
	var pkgs []string
	err = filepath.WalkDir("../internal", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		pkg := strings.TrimPrefix(filepath.ToSlash(filepath.Dir(path)), "../")
		if !slices.Contains(pkgs, pkg) {
			pkgs = append(pkgs, pkg)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pkgs {
		if !listed[p] {
			t.Errorf("docs/architecture.md's table of who owns what has no row for %s", p)
		}
	}
	for p := range listed {
		if !slices.Contains(pkgs, p) {
			t.Errorf("docs/architecture.md's table of who owns what names %s, which is no package", p)
		}
	}
}

// Every test the troubleshooting page and the walkthroughs name as reproducing a symptom exists, and every value
// they tell a user to set is one of the job or webhook chart's values.
func TestTroubleshootingNamesWhatExists(t *testing.T) {
	var tests []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if strings.HasSuffix(path, "_test.go") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range regexp.MustCompile(`(?m)^func (Test\w+)\(`).FindAllStringSubmatch(string(b), -1) {
				tests = append(tests, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var values string
	for _, chart := range []string{"elastic-training", "elastic-training-webhook"} {
		b, err := os.ReadFile(filepath.Join("..", "charts", chart, "values.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		values += string(b)
	}
	for _, doc := range []string{"troubleshooting.md", "walkthrough-eks.md", "walkthrough-gke.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		named := regexp.MustCompile("`(Test[A-Z]\\w+)`").FindAllStringSubmatch(string(b), -1)
		for _, m := range named {
			if !slices.Contains(tests, m[1]) {
				t.Errorf("docs/%s names %s, which is no test", doc, m[1])
			}
		}
		// `--set a.b.c=...` and `a.b.c` in backquotes: the last key must be a value of a chart.
		for _, m := range regexp.MustCompile(`--set(?:-json)? '?([a-zA-Z][\w.]*)=`).FindAllStringSubmatch(string(b), -1) {
			key := m[1][strings.LastIndex(m[1], ".")+1:]
			if !regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(key) + `:`).MatchString(values) {
				t.Errorf("docs/%s sets %s, which no chart's values.yaml has", doc, m[1])
			}
		}
	}
}

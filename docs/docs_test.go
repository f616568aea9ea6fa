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

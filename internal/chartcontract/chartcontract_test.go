package chartcontract_test

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/elastic-training/elastic-training/internal/chartcontract"
)

var update = flag.Bool("update", false, "rewrite "+chartcontract.Path)

// TestChartContractUpToDate fails when the chart's copy of the webhook's rules is not what this module defines.
func TestChartContractUpToDate(t *testing.T) {
	want, err := chartcontract.Template(chartcontract.Current())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "..", chartcontract.Path)
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	have, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (generate it: go test ./internal/chartcontract -update)", err)
	}
	if diff := cmp.Diff(string(want), string(have)); diff != "" {
		t.Errorf("%s is stale: go test ./internal/chartcontract -update (-want +have):\n%s", chartcontract.Path, diff)
	}
}

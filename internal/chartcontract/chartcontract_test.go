package chartcontract

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite "+generatedFile)

// TestChartContractUpToDate fails when the chart's copy of the webhook's rules is not what this module defines.
func TestChartContractUpToDate(t *testing.T) {
	want, err := template(current())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "..", generatedFile)
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
		t.Errorf("%s is stale: go test ./internal/chartcontract -update (-want +have):\n%s", generatedFile, diff)
	}
}

package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TorchAgentTest is torch's LocalElasticAgent test file, as the torch source
// holds it.
const TorchAgentTest = "test/distributed/elastic/agent/server/test/local_elastic_agent_test.py"

// TorchTestsBase is $ET_CACHE/torch-tests: hack/torch-tests.sh extracts the
// torch source's tests there, one directory per torch version ("2.6.0").
func TorchTestsBase() string { return filepath.Join(filepath.Dir(RootfsBase()), "torch-tests") }

// TorchTestFile is rel in the torch source of version (torch.__version__) or,
// where hack/torch-tests.sh found no source of that version on the mirror, of
// the newest older one it has; the test fails when there is none.
func TorchTestFile(t testing.TB, version, rel string) string {
	t.Helper()
	want, ok := parseVersion(ShortVersion(version))
	if !ok {
		t.Fatalf("torch version %q: want major.minor.patch", version)
	}
	entries, _ := os.ReadDir(TorchTestsBase())
	best, found := [3]int{}, ""
	for _, e := range entries {
		v, ok := parseVersion(e.Name())
		if !ok || !lessEq(v, want) || (found != "" && lessEq(v, best)) {
			continue
		}
		if _, err := os.Stat(filepath.Join(TorchTestsBase(), e.Name(), rel)); err == nil {
			best, found = v, e.Name()
		}
	}
	if found == "" {
		t.Fatalf("no torch source at or below %s under %s holds %s: run hack/torch-tests.sh (make rootfs does)",
			ShortVersion(version), TorchTestsBase(), rel)
	}
	if best != want {
		t.Logf("torch %s: the mirror has no source of it; running %s's %s", ShortVersion(version), found, rel)
	}
	return filepath.Join(TorchTestsBase(), found, rel)
}

// parseVersion reads "2.14.1".
func parseVersion(s string) (v [3]int, ok bool) {
	var rest string
	n, _ := fmt.Sscanf(s, "%d.%d.%d%s", &v[0], &v[1], &v[2], &rest)
	return v, n == 3 && fmt.Sprintf("%d.%d.%d", v[0], v[1], v[2]) == s
}

func lessEq(a, b [3]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return true
}

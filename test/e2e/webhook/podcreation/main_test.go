// Package podcreation measures what users feel of the admission webhook: how fast the real Job controller of the
// local cluster (test/e2e/cluster) creates the pods of a big training job with the webhook installed and without
// it, in one run (BenchmarkPodCreation, `make bench-webhook`).
//
// It is a package of its own because test/e2e/webhook runs its tests on a control plane of its own (no kubelet),
// while this benchmark runs on the local cluster through test/e2e/framework.
package podcreation

import (
	"flag"
	"os"
	"testing"

	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// TestMain brings the local cluster up (framework.Main) only when a benchmark is asked for: the package holds
// one benchmark and offline tests of its own arithmetic, so `go test ./test/e2e/...` runs those tests without
// building images or taking the e2e lock for nothing.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run())
	}
	framework.Main(m)
}

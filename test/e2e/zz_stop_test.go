package e2e

import (
	"testing"

	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// Stopping leaves no process, mount, route, rule, iptables chain, cgroup or file of ours behind, and the
// host's network and sysctl state equals what it was before the first start. This file sorts last so the
// test runs after the others of this package; framework.Main restarts the cluster afterwards if it was
// running before the tests.
func TestStopLeavesNothingBehind(t *testing.T) {
	c := framework.Get(t)
	c.Down(t)
	out, err := c.Script("check-clean.sh")
	t.Logf("check-clean.sh:\n%s", out)
	if err != nil {
		t.Fatalf("check-clean.sh: %v", err)
	}
}

// Package e2e holds the test harness's own tests: they prove that the local cluster behaves like a real
// one in the ways the project's e2e tests rely on.
package e2e

import (
	"fmt"
	"io"
	"testing"

	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// TestMain runs the tests, then the stop check: it stops the cluster, so it comes after all of them.
func TestMain(m *testing.M) {
	framework.Main(m, framework.After("TestStopLeavesNothingBehind", stopLeavesNothingBehind))
}

// stopLeavesNothingBehind: stopping leaves no process, mount, route, rule, iptables chain, cgroup or file of ours
// behind, and the host's network and sysctl state equals what it was before the first start. framework.Main
// restarts the cluster afterwards if it was running before the tests.
func stopLeavesNothingBehind(c *framework.Cluster, log io.Writer) error {
	out, err := c.Script("down.sh")
	if err != nil {
		return fmt.Errorf("cluster down: %v\n%s", err, out)
	}
	fmt.Fprintf(log, "cluster down:\n%s", out)
	out, err = c.Script("check-clean.sh")
	fmt.Fprintf(log, "check-clean.sh:\n%s", out)
	if err != nil {
		return fmt.Errorf("check-clean.sh: %v", err)
	}
	return nil
}

package workloads

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// TestHelmTestFailsOnCrashLoop: `helm test` of a PyTorch job proves that training progresses, not only that the
// rendezvous answers. Its trainers exit with an error right after each rendezvous, so torchrun restarts them in
// new rounds and then restarts itself: the test fails, and its log says why from torch's own rendezvous state.
// TestElasticPyTorch runs the same test on healthy jobs (every torch, every backend), where it passes.
func TestHelmTestFailsOnCrashLoop(t *testing.T) {
	c := framework.Get(t)
	installWebhook(t, c)
	ns := c.Namespace(t)
	const job = "crashloop"
	v := jobValues(t, c, pytorchValues, "")
	delete(v, "args")
	v["script"] = "import sys\nprint('trainer: failing on purpose', flush=True)\nsys.exit(3)\n"
	set(v, "tests.stableFor", "20s")
	set(v, "tests.timeout", "90s")
	c.HelmInstall(t, ns, job, c.RepoPath(jobChart), v)

	start := time.Now()
	_, err := c.HelmTestResult(t, ns, job, 3*time.Minute)
	if err == nil {
		t.Fatal("helm test passed on a job whose trainers crash-loop")
	}
	logs := c.PodLogs(t, ns, job+"-test-rdzv", "test")
	t.Logf("helm test failed after %.0fs as it should (%v); its log:\n%s", time.Since(start).Seconds(), err, logs)
	if !strings.Contains(logs, "no progress within 1m30s") {
		t.Errorf("the test pod does not say it saw no progress")
	}
	// It read torch's rounds: the failure is the trainers', not an unreachable rendezvous.
	if !regexp.MustCompile(`round \d+ of run \S+ \(c10d\)`).MatchString(logs) {
		t.Errorf("the test pod never saw a torch round")
	}
	c.HelmUninstall(t, ns, job, 2*time.Minute)
}

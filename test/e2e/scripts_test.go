package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// The cluster scripts and the binaries they build: what the scripts refuse, and the pinned helm. That stopping
// leaves nothing behind is checked last, from TestMain (main_test.go).

// The cluster's helm is the pinned release and knows a current Kubernetes offline: `helm template` (no cluster to
// ask) renders both charts, whose kubeVersion a helm built without its ldflags (Kubernetes 1.20) would refuse.
func TestHelmBinaryVersions(t *testing.T) {
	c := framework.Get(t)
	helm := filepath.Join(c.BinDir, "helm")
	out, err := exec.Command(helm, "version", "--template", "{{.Version}}").CombinedOutput()
	if err != nil || string(out) != framework.HelmVersion {
		t.Errorf("helm version = %q (%v), want %s", out, err, framework.HelmVersion)
	}
	// The job chart refuses a job with nothing to run: give it a command.
	for chart, args := range map[string][]string{"charts/elastic-training": {"--set", "command={torchrun,train.py}"}, "charts/elastic-training-webhook": nil} {
		out, err := exec.Command(helm, append([]string{"template", "x", c.RepoPath(chart)}, args...)...).CombinedOutput()
		if err != nil {
			t.Errorf("helm template %s: %v\n%s", chart, err, out)
		}
	}
}

// The scripts refuse, with the reason, what would break the machine's one cluster.
func TestScriptsRefuse(t *testing.T) {
	c := framework.Get(t)
	// A second instance (another cache dir) while ours runs: up.sh must refuse before building anything.
	other := t.TempDir()
	cmd := exec.Command(filepath.Join(c.ScriptsDir, "up.sh"))
	cmd.Env = append(os.Environ(), "ET_CACHE="+other)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another instance") {
		t.Errorf("up.sh with a second ET_CACHE: err=%v, output:\n%s\nwant a refusal naming another instance", err, out)
	}
	if _, err := os.Stat(filepath.Join(other, "bin")); err == nil {
		t.Errorf("the refused up.sh started building into %s", other)
	}
	// Not root.
	cmd = exec.Command(filepath.Join(c.ScriptsDir, "up.sh"))
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + other}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "must run as root") {
		t.Errorf("up.sh as nobody: err=%v, output:\n%s\nwant a refusal saying it needs root", err, out)
	}
}

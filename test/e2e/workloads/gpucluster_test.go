package workloads

import (
	"regexp"
	"strings"
	"testing"
)

// TestSharedMemory: the trainer's /dev/shm is the chart's memory-backed emptyDir (shm), sized as asked, not the
// container runtime's 64 MiB on which DataLoader workers and NCCL fail with a bus error. `df` in the running trainer
// (one worker of a job with shm.sizeLimit=256Mi) says so; a DataLoader-sized write (100 MiB) fits.
func TestSharedMemory(t *testing.T) {
	t.Parallel() // no figure to keep honest: see main_test.go
	c, ns := startTest(t)
	const job = "shm"
	v := jobValues(t, c, pytorchValues, trainScript)
	set(v, "workers.replicas", 1)
	set(v, "shm.sizeLimit", "256Mi")
	set(v, "args", []any{"--steps=100000", "--step-seconds=0.5"})
	sel := installTraining(t, c, ns, job, v, 1)
	pods, err := livePods(t.Context(), c, ns, sel)
	if err != nil || len(pods) != 1 {
		t.Fatalf("want 1 live worker: %d, %v", len(pods), err)
	}
	out, err := c.Kubectl(t.Context(), "-n", ns, "exec", pods[0].Name, "-c", trainer, "--", "sh", "-c",
		"df -k /dev/shm | tail -1; dd if=/dev/zero of=/dev/shm/fill bs=1M count=100 2>&1 | tail -1; rm -f /dev/shm/fill")
	if err != nil {
		t.Fatalf("df /dev/shm: %v: %s", err, out)
	}
	t.Logf("df -k /dev/shm in %s:\n%s", pods[0].Name, out)
	// Filesystem 1K-blocks Used Available Use% Mounted on
	f := strings.Fields(strings.SplitN(out, "\n", 2)[0])
	if len(f) < 6 || f[0] != "tmpfs" || f[5] != "/dev/shm" || f[1] != "262144" {
		t.Errorf("/dev/shm is not a 256 MiB tmpfs (262144 1K-blocks): %q", out)
	}
	if !regexp.MustCompile(`104857600 bytes`).MatchString(out) {
		t.Errorf("a 100 MiB write to /dev/shm failed: %q", out)
	}
	uninstallJob(t, c, ns, job)
}

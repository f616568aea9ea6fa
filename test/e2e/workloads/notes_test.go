package workloads

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/jobstatus"
)

// TestNotesCommands runs the kubectl commands the chart's NOTES print after `helm install` of an elastic PyTorch
// job, as written (with the cluster's kubectl, a following `logs -f` stopped after 15 s), and checks what each
// shows: every pod with its gates and the webhook's mark, every worker's log lines prefixed with its pod, the
// serving sidecar's log, and each pod's node rank in torch's round.
func TestNotesCommands(t *testing.T) {
	c, ns := startTest(t)
	const job = "notes"
	v := jobValues(t, c, pytorchValues, trainScript)
	set(v, "workers.replicas", 2)
	rel := c.HelmInstall(t, ns, job, c.RepoPath(jobChart), v)
	c.WaitWorld(t, ns, groupSelector(job, constants.GroupWorker), trainer, 2, 1, 3*time.Minute)
	c.WaitFor(t, time.Minute, "the job's status on its Job", func(ctx context.Context) (bool, error) {
		j, err := c.Client.BatchV1().Jobs(ns).Get(ctx, job+"-worker", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return j.Annotations[jobstatus.World] == "2", nil
	})

	var cmds []string
	for _, line := range strings.Split(rel.Info.Notes, "\n") {
		cmd, _, _ := strings.Cut(strings.TrimSpace(line), "   #")              // a comment after the command
		if strings.HasPrefix(cmd, "kubectl ") && !strings.Contains(cmd, "<") { // <pod>, <workload>: the user fills them
			cmds = append(cmds, cmd)
		}
	}
	if len(cmds) < 4 {
		t.Fatalf("NOTES print %d kubectl commands, want at least 4:\n%s", len(cmds), rel.Info.Notes)
	}
	checks := map[string]func(out string) bool{
		"MUTATED:": func(out string) bool {
			return strings.Contains(out, "MUTATED") && strings.Contains(out, job+"-worker-0") && !strings.Contains(out, constants.SchedulingGate)
		},
		// The job's status on its Job, which the serving sidecar writes within 5 s (the test waits below), for every
		// job of the namespace (this one alone here), by the Job's label.
		// Both pods may form round 1 together or worker-0 alone first (min 1), so the round is 1 or 2 and the last
		// incident is <none> or that scale; the columns before LAST-INCIDENT are one word each.
		"world-size": func(out string) bool {
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 2 || !strings.HasPrefix(lines[0], "JOB ") {
				return false
			}
			f := strings.Fields(lines[1])
			return len(f) >= 8 && f[0] == job && (f[1] == "Running" || f[1] == "Training") && f[2] == "2" &&
				(f[3] == "1" || f[3] == "2") && strings.Contains(f[4], "/")
		},
		"--prefix": func(out string) bool {
			return strings.Contains(out, "[pod/"+job+"-worker-1-") && strings.Contains(out, "/trainer] ")
		},
		"-c rdzv-sidecar": func(out string) bool { return strings.Contains(out, "rendezvous") },
		"?format=table": func(out string) bool {
			return strings.Contains(out, "NODE_RANK") && strings.Contains(out, job+"-worker-1")
		},
		"describe job":      func(out string) bool { return strings.Contains(out, "RendezvousRound") },
		"uninstall":         nil,
		"delete pvc":        nil,
		"get pods -l":       nil,
		"logs -f job/":      nil,
		"get workloads":     nil,
		"describe workload": nil,
	}
	for _, cmd := range cmds {
		t.Run(cmd, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			sh := exec.CommandContext(ctx, "bash", "-c", "timeout 15 "+strings.Replace(cmd, "$(kubectl", "$(timeout 15 kubectl", 1))
			sh.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig, "PATH="+c.BinDir+":"+os.Getenv("PATH"))
			out, err := sh.CombinedOutput()
			var ee *exec.ExitError
			if err != nil && !(strings.Contains(cmd, " -f ") && errors.As(err, &ee) && ee.ExitCode() == 124) {
				t.Fatalf("%v:\n%s", err, out)
			}
			for key, ok := range checks {
				if strings.Contains(cmd, key) && ok != nil && !ok(string(out)) {
					t.Errorf("its output does not show what NOTES promise (%s):\n%s", key, out)
				}
			}
			t.Logf("output:\n%s", out)
		})
	}
}

package sidecar_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

// fakeHosts: three members registered by three `join` processes.
var fakeHosts = []struct {
	host  string
	slots int
}{
	{"job-worker-0.job.ns.svc.cluster.local", 2},
	{"job-worker-1.job.ns.svc.cluster.local", 1},
	{"job-worker-2.job.ns.svc.cluster.local", 3},
}

// wantPlacement: ranks fill each host's slots in hostfile order.
var wantPlacement = map[string]string{
	"0": "job-worker-0", "1": "job-worker-0", "2": "job-worker-1",
	"3": "job-worker-2", "4": "job-worker-2", "5": "job-worker-2",
}

// Hostfiles written by join processes place ranks as the members' slots say,
// under real Open MPI and MPICH launchers. Each fake host is a UTS namespace
// started by a stand-in for ssh (FACTS section 3).
func TestMPIHostfilesPlaceRanks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (unshare --uts for fake hosts); CI runs as root")
	}
	s := startServe(t)
	for i, h := range fakeHosts {
		startJoin(t, s.URL, h.host, h.slots, "", fmt.Sprintf("--member-index=%d", i))
	}
	agent, err := filepath.Abs("testdata/fake-ssh.sh")
	require.NoError(t, err)

	tests := []struct {
		flavour string
		bin     string
		pkg     string
		args    func(hostfile string) []string
		rankVar string
	}{
		{"openmpi", "/usr/bin/mpirun.openmpi", "openmpi-bin", func(hf string) []string {
			return []string{"--allow-run-as-root", "--hostfile", hf, "--mca", "plm_rsh_agent", agent,
				"--mca", "orte_keep_fqdn_hostnames", "true", "-np", "6"}
		}, "OMPI_COMM_WORLD_RANK"},
		{"mpich", "/usr/bin/mpiexec.hydra", "mpich", func(hf string) []string {
			return []string{"-f", hf, "-launcher", "ssh", "-launcher-exec", agent, "-n", "6"}
		}, "PMI_RANK"},
	}
	for _, tt := range tests {
		t.Run(tt.flavour, func(t *testing.T) {
			testenv.RequireBinary(t, tt.bin, tt.pkg)
			dir := t.TempDir()
			startJoin(t, s.URL, "", 0, dir, "--register=false", "--hostfile-flavour="+tt.flavour)
			hf := filepath.Join(dir, "hostfile")
			testenv.Eventually(t, 10*time.Second, "hostfile with 3 hosts", func() error {
				if n := strings.Count(readFile(hf), "\n"); n != 3 {
					return fmt.Errorf("%d lines: %q", n, readFile(hf))
				}
				return nil
			})
			t.Logf("%s hostfile:\n%s", tt.flavour, readFile(hf))
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // Hydra can hang forever
			defer cancel()
			args := append(tt.args(hf), "sh", "-c", "echo RANK $"+tt.rankVar+" $(hostname)")
			out, err := exec.CommandContext(ctx, tt.bin, args...).CombinedOutput()
			require.NoError(t, err, "%s", out)
			got := map[string]string{}
			for _, m := range regexp.MustCompile(`RANK (\d+) ([^.\s]+)`).FindAllStringSubmatch(string(out), -1) {
				got[m[1]] = m[2]
			}
			require.Equal(t, wantPlacement, got, "placement; output:\n%s", out)
		})
	}

	t.Run("discover_hosts.sh", func(t *testing.T) {
		dir := t.TempDir()
		startJoin(t, s.URL, "", 0, dir, "--register=false", "--install-helper")
		script := filepath.Join(dir, "discover_hosts.sh")
		testenv.Eventually(t, 10*time.Second, "discovery script with 3 hosts", func() error {
			out, err := exec.Command(script).Output()
			if err != nil {
				return err
			}
			if n := strings.Count(string(out), "\n"); n != 3 {
				return fmt.Errorf("%d hosts: %q", n, out)
			}
			return nil
		})
		out, err := exec.Command(script).Output()
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		require.True(t, sort.StringsAreSorted(lines))
		require.Equal(t, []string{
			"job-worker-0.job.ns.svc.cluster.local:2",
			"job-worker-1.job.ns.svc.cluster.local:1",
			"job-worker-2.job.ns.svc.cluster.local:3",
		}, lines)
		st, err := os.Stat(script)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o555), st.Mode().Perm())
		st, err = os.Stat(filepath.Join(dir, "rdzv-sidecar"))
		require.NoError(t, err, "join --install-helper must install its own binary for launchers")
		require.Equal(t, os.FileMode(0o555), st.Mode().Perm())

		// A member without --install-helper (every pod but a launcher) gets the preStop script, not the copy.
		member := t.TempDir()
		startJoin(t, s.URL, "", 0, member, "--register=false")
		testenv.Eventually(t, 10*time.Second, "member's discovery script", func() error {
			_, err := os.Stat(filepath.Join(member, "discover_hosts.sh"))
			return err
		})
		_, err = os.Stat(filepath.Join(member, constants.LeaveScriptName))
		require.NoError(t, err, "the preStop script")
		_, err = os.Stat(filepath.Join(member, "rdzv-sidecar"))
		require.ErrorIs(t, err, os.ErrNotExist, "a member without --install-helper must not copy the binary")
	})

	t.Run("wait and hosts helpers", func(t *testing.T) {
		out, err := exec.Command(sidecarBin, "wait", "--endpoints="+s.URL, "--members=3", "--timeout=10s", "--hostfile-flavour=mpich").Output()
		require.NoError(t, err)
		require.Equal(t, "job-worker-0.job.ns.svc.cluster.local:2\njob-worker-1.job.ns.svc.cluster.local:1\njob-worker-2.job.ns.svc.cluster.local:3\n", string(out))

		start := time.Now()
		cmd := exec.Command(sidecarBin, "wait", "--endpoints="+s.URL, "--members=4", "--timeout=1s")
		out, err = cmd.CombinedOutput()
		require.Error(t, err)
		require.Less(t, time.Since(start), 5*time.Second)
		require.Contains(t, string(out), "wait for 4 members: only 3 members, 6 slots")

		out, err = exec.Command(sidecarBin, "hosts", "--endpoints="+s.URL).Output()
		require.NoError(t, err)
		require.Equal(t, "job-worker-0.job.ns.svc.cluster.local slots=2\njob-worker-1.job.ns.svc.cluster.local slots=1\njob-worker-2.job.ns.svc.cluster.local slots=3\n", string(out))
	})
}

// supervise runs a real Open MPI mpirun over two members' hostfile and stops it, every rank included, when one
// member's sidecar dies (kill -9: its lease ends, as when its node is lost), with exit status 75; a command that
// ends by itself passes its exit status on.
func TestSupervise(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (unshare --uts for fake hosts); CI runs as root")
	}
	testenv.RequireBinary(t, "/usr/bin/mpirun.openmpi", "openmpi-bin")
	s := startServe(t)
	a := startJoin(t, s.URL, "job-worker-0.job.ns.svc.cluster.local", 1, "", "--member-index=0")
	b := startJoin(t, s.URL, "job-worker-1.job.ns.svc.cluster.local", 1, "", "--member-index=1")
	dir := t.TempDir()
	startJoin(t, s.URL, "", 0, dir, "--register=false", "--hostfile-flavour=openmpi")
	hf := filepath.Join(dir, "hostfile")
	testenv.Eventually(t, 10*time.Second, "hostfile with 2 hosts", func() error {
		if n := strings.Count(readFile(hf), "\n"); n != 2 {
			return fmt.Errorf("%d lines: %q", n, readFile(hf))
		}
		return nil
	})
	agent, err := filepath.Abs("testdata/fake-ssh.sh")
	require.NoError(t, err)
	pids := filepath.Join(t.TempDir(), "pids")
	supervise := func(args ...string) *testenv.Proc {
		return testenv.Start(t, "supervise", exec.Command(sidecarBin, append([]string{"supervise", "--endpoints=" + s.URL, "--grace=2s", "--"}, args...)...))
	}

	p := supervise("/usr/bin/mpirun.openmpi", "--allow-run-as-root", "--hostfile", hf, "--mca", "plm_rsh_agent", agent,
		"--mca", "orte_keep_fqdn_hostnames", "true", "-np", "2", "sh", "-c", "echo $$ >> "+pids+"; exec sleep 600")
	testenv.Eventually(t, 30*time.Second, "both ranks running", func() error {
		if n := len(strings.Fields(readFile(pids))); n != 2 {
			return fmt.Errorf("%d ranks", n)
		}
		return nil
	})
	start := time.Now()
	a.Signal(syscall.SIGKILL)
	err = p.Wait(t, leaseTTL+15*time.Second)
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "supervise must stop mpirun:\n%s", p.Output())
	require.Equal(t, 75, ee.ExitCode(), "%s", p.Output())
	require.Contains(t, p.Output(), "job-worker-0.job.ns.svc.cluster.local left the membership")
	t.Logf("member's sidecar killed → supervise stopped mpirun (exit status 75): %s (lease TTL %s)", time.Since(start).Round(time.Millisecond), leaseTTL)
	// mpirun stops the ranks through its daemons, which may run in sessions of their own (as on real hosts).
	testenv.Eventually(t, 10*time.Second, "every rank stopped", func() error {
		for _, pid := range strings.Fields(readFile(pids)) {
			if _, err := os.Stat("/proc/" + pid); err == nil {
				cmdline, _ := os.ReadFile("/proc/" + pid + "/cmdline")
				return fmt.Errorf("rank %s still runs: %q", pid, cmdline)
			}
		}
		return nil
	})
	t.Logf("every rank stopped %s after the kill", time.Since(start).Round(time.Millisecond))

	p = supervise("sh", "-c", "exit 3")
	err = p.Wait(t, 30*time.Second)
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 3, ee.ExitCode(), "%s", p.Output())
	require.Contains(t, p.Output(), "stops sh if one of them leaves")

	// A scale-down as a pod meets it: the worker's sshd stops first (mpirun fails), its sidecar deregisters a
	// moment later (SIGTERM): within --loss-window that is a member lost, status 75.
	work := t.TempDir()
	flag, pidFile := filepath.Join(work, "sshd-stopped"), filepath.Join(work, "pid")
	p = supervise("sh", "-c", "echo $$ > "+pidFile+"; until [ -e "+flag+" ]; do sleep 0.05; done; exit 1")
	testenv.Eventually(t, 10*time.Second, "supervise started its command", func() error {
		if strings.TrimSpace(readFile(pidFile)) == "" {
			return errors.New("not yet")
		}
		return nil
	})
	require.NoError(t, os.WriteFile(flag, nil, 0o644))
	// The order a pod's containers stop in: the command has failed (supervise reaped it) before the member leaves.
	testenv.Eventually(t, 10*time.Second, "the command ended", func() error {
		if _, err := os.Stat("/proc/" + strings.TrimSpace(readFile(pidFile))); err == nil {
			return errors.New("still there")
		}
		return nil
	})
	b.Signal(syscall.SIGTERM)
	err = p.Wait(t, 30*time.Second)
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 75, ee.ExitCode(), "%s", p.Output())
	require.Contains(t, p.Output(), "sh exited with status 1 and job-worker-1.job.ns.svc.cluster.local left the membership")
}

// launch, the MPI launcher's default: started before any worker, it runs a real Open MPI mpirun only once two
// members are registered and the launcher's hostfile lists them; when one member's sidecar dies (its node lost) it
// stops mpirun, waits for the member's replacement (the job needs two), and runs mpirun again on the two once the
// hostfile lists them, passing on that run's exit status.
func TestLaunch(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (unshare --uts for fake hosts); CI runs as root")
	}
	// Every rank records itself; the second run's ranks end at once.
	s, p, pids, done := startLaunch(t, "--restarts=1")
	hf := p.hostfile
	ranks := func(n int) func() error {
		return func() error {
			if got := len(strings.Fields(readFile(pids))); got != n {
				return fmt.Errorf("%d ranks so far", got)
			}
			return nil
		}
	}

	a := startJoin(t, s.URL, "job-worker-0.job.ns.svc.cluster.local", 1, "", "--member-index=0")
	testenv.Eventually(t, 10*time.Second, "one member in the hostfile", func() error {
		if n := strings.Count(readFile(hf), "\n"); n != 1 {
			return fmt.Errorf("%d lines: %q", n, readFile(hf))
		}
		return nil
	})
	startJoin(t, s.URL, "job-worker-1.job.ns.svc.cluster.local", 1, "", "--member-index=1")
	testenv.Eventually(t, 30*time.Second, "both ranks of the first run", ranks(2))
	require.NoError(t, os.WriteFile(done, nil, 0o644))
	a.Signal(syscall.SIGKILL)
	testenv.Eventually(t, leaseTTL+15*time.Second, "the first run stopped", func() error {
		if !strings.Contains(p.Output(), "a member left during run 1; running /usr/bin/mpirun.openmpi again (restart 1 of 1)") {
			return errors.New("not yet")
		}
		return nil
	})
	startJoin(t, s.URL, "job-worker-0.job.ns.svc.cluster.local", 1, "", "--member-index=0") // the lost pod's replacement
	require.NoError(t, p.Wait(t, 30*time.Second), "the second run ends with status 0:\n%s", p.Output())
	require.NoError(t, ranks(4)(), "two ranks in the second run:\n%s", p.Output())
	require.Contains(t, p.Output(), "job-worker-0.job.ns.svc.cluster.local left the membership")
	// Every run began with both members: launch printed each run's members, never one alone.
	require.Equal(t, 2, strings.Count(p.Output(), "rdzv-sidecar launch: 2 members, 2 slots: "), "%s", p.Output())
	require.NotContains(t, p.Output(), "rdzv-sidecar launch: 1 members", "a run with one member of two")
}

// launch --rerun-on-join, the chart's default for a plain mpirun: a member that joins during a run (a scale-up)
// stops the run, and mpirun runs again on all three members; no restart is spent on it (--restarts=0).
func TestLaunchRerunOnJoin(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (unshare --uts for fake hosts); CI runs as root")
	}
	s, p, pids, done := startLaunch(t, "--restarts=0", "--rerun-on-join")
	startJoin(t, s.URL, "job-worker-0.job.ns.svc.cluster.local", 1, "", "--member-index=0")
	startJoin(t, s.URL, "job-worker-1.job.ns.svc.cluster.local", 1, "", "--member-index=1")
	testenv.Eventually(t, 30*time.Second, "both ranks of the first run", func() error {
		if got := len(strings.Fields(readFile(pids))); got != 2 {
			return fmt.Errorf("%d ranks so far", got)
		}
		return nil
	})
	require.NoError(t, os.WriteFile(done, nil, 0o644))
	startJoin(t, s.URL, "job-worker-2.job.ns.svc.cluster.local", 1, "", "--member-index=2") // the scale-up
	require.NoError(t, p.Wait(t, 30*time.Second), "the second run ends with status 0:\n%s", p.Output())
	require.Len(t, strings.Fields(readFile(pids)), 5, "two ranks, then three:\n%s", p.Output())
	require.Contains(t, p.Output(), "job-worker-2.job.ns.svc.cluster.local joined the membership")
	require.Contains(t, p.Output(), "a member joined during run 1; running /usr/bin/mpirun.openmpi again on every member")
	require.Contains(t, p.Output(), "rdzv-sidecar launch: 3 members, 3 slots: ")
}

// launchProc is a running `rdzv-sidecar launch` and the hostfile it reads.
type launchProc struct {
	*testenv.Proc
	hostfile string
}

// startLaunch starts a server, a launcher's join that writes the hostfile (not a member) and `rdzv-sidecar launch
// --members=2` with flags, over a real Open MPI mpirun whose ranks (through testdata/fake-ssh.sh) each append their
// PID to pids and sleep until the file done exists.
func startLaunch(t *testing.T, flags ...string) (s *server, p launchProc, pids, done string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (unshare --uts for fake hosts); CI runs as root")
	}
	testenv.RequireBinary(t, "/usr/bin/mpirun.openmpi", "openmpi-bin")
	s = startServe(t)
	dir := t.TempDir()
	startJoin(t, s.URL, "", 0, dir, "--register=false", "--hostfile-flavour=openmpi")
	hf := filepath.Join(dir, "hostfile")
	agent, err := filepath.Abs("testdata/fake-ssh.sh")
	require.NoError(t, err)
	work := t.TempDir()
	pids, done = filepath.Join(work, "pids"), filepath.Join(work, "done")
	args := append([]string{"launch", "--endpoints=" + s.URL, "--members=2", "--settle=500ms", "--hostfile=" + hf, "--ssh-port=0",
		"--grace=2s", "--timeout=1m"}, flags...)
	args = append(args, "--", "/usr/bin/mpirun.openmpi", "--allow-run-as-root", "--hostfile", hf, "--mca", "plm_rsh_agent", agent,
		"--mca", "orte_keep_fqdn_hostnames", "true", "sh", "-c", "echo $$ >> "+pids+"; [ -e "+done+" ] || exec sleep 600")
	return s, launchProc{testenv.Start(t, "launch", exec.Command(sidecarBin, args...)), hf}, pids, done
}

// A hung MPI job, as the chart runs it (`rdzv-sidecar launch`): two ranks of a real Open MPI mpirun train in
// lockstep (an mpi4py allreduce per step) and say each step with elastic_training.progress to their own member's
// sidecar, which reports them into the job's etcd. Rank 1 is frozen (SIGSTOP): rank 0 waits in its allreduce for
// ever, as a real job would (mpirun sees nothing wrong). The launcher's supervise finds that no rank advanced for
// --hang-timeout, names rank 1 frozen, stops mpirun, and launch runs it again (a restart), which trains to its end.
func TestLaunchStopsAHungRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (unshare --uts for fake hosts); CI runs as root")
	}
	testenv.RequireBinary(t, "/usr/bin/mpirun.openmpi", "openmpi-bin")
	testenv.RequireBinary(t, "/usr/bin/python3", "python3")
	if out, err := exec.Command("/usr/bin/python3", "-c", "import mpi4py").CombinedOutput(); err != nil {
		t.Fatalf("mpi4py (Debian's python3-mpi4py, hack/deps.sh test): %v: %s", err, out)
	}
	s := startServe(t)
	// Each member's sidecar hears its ranks on a port of its own (the fake hosts share the test's loopback; in a
	// pod it is 127.0.0.1:2383).
	ports := []int{testenv.FreePort(t), testenv.FreePort(t)}
	for i, port := range ports {
		startJoin(t, s.URL, fmt.Sprintf("job-worker-%d.job.ns.svc.cluster.local", i), 1, "", fmt.Sprintf("--member-index=%d", i),
			fmt.Sprintf("--progress-addr=127.0.0.1:%d", port))
	}
	dir := t.TempDir()
	startJoin(t, s.URL, "", 0, dir, "--register=false", "--hostfile-flavour=openmpi")
	hf := filepath.Join(dir, "hostfile")
	agent, err := filepath.Abs("testdata/fake-ssh.sh")
	require.NoError(t, err)
	script, err := filepath.Abs("testdata/mpi_progress.py")
	require.NoError(t, err)
	pids := filepath.Join(t.TempDir(), "pids")
	const timeout = 8 * time.Second
	rank := fmt.Sprintf("case $OMPI_COMM_WORLD_RANK in 0) port=%d;; *) port=%d;; esac; "+
		"ET_PROGRESS_ADDR=127.0.0.1:$port PYTHONPATH=%s exec /usr/bin/python3 %s %s 20",
		ports[0], ports[1], filepath.Join(dir, constants.PythonDirName), script, pids)
	p := testenv.Start(t, "launch", exec.Command(sidecarBin, "launch", "--endpoints="+s.URL, "--members=2", "--settle=500ms",
		"--hostfile="+hf, "--ssh-port=0", "--grace=2s", "--timeout=1m", "--restarts=1", "--hang-timeout="+timeout.String(), "--",
		"/usr/bin/mpirun.openmpi", "--allow-run-as-root", "--hostfile", hf, "--mca", "plm_rsh_agent", agent,
		"--mca", "orte_keep_fqdn_hostnames", "true", "-np", "2", "sh", "-c", rank))

	first := map[string]string{} // rank -> pid of the first run
	testenv.Eventually(t, 30*time.Second, "both ranks of the first run", func() error {
		for line := range strings.Lines(readFile(pids)) {
			if f := strings.Fields(line); len(f) == 2 {
				first[f[0]] = f[1]
			}
		}
		if len(first) != 2 {
			return fmt.Errorf("%d ranks so far: %s", len(first), p.Output())
		}
		return nil
	})
	testenv.Eventually(t, 30*time.Second, "the first run's ranks said steps", func() error {
		if !strings.Contains(p.Output(), "rank 1: step 10") {
			return errors.New("not at step 10 yet")
		}
		return nil
	})
	pid, err := strconv.Atoi(first["1"])
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	frozen := time.Now()
	testenv.Eventually(t, timeout+30*time.Second, "supervise stops the hung run", func() error {
		if !strings.Contains(p.Output(), "a hang stopped run 1; running /usr/bin/mpirun.openmpi again (restart 1 of 1)") {
			return errors.New("not yet")
		}
		return nil
	})
	found := time.Since(frozen)
	out := p.Output()
	require.Regexp(t, `rdzv-sidecar supervise: hung: no rank advanced for \d+s \(at step \d+\); stopped first: rank 1 \(job-worker-1\.job\.ns\.svc\.cluster\.local\) at step \d+, frozen \(silent \d+s\)`, out)
	require.NotContains(t, out, "rank 0 (job-worker-0", "the rank waiting in its allreduce is not the one named")
	t.Logf("rank 1 frozen → the run stopped as hung %s later (--hang-timeout %s): %s", found.Round(100*time.Millisecond), timeout,
		regexp.MustCompile(`hung: .*`).FindString(out))
	// The frozen rank and the one waiting for it are gone: mpirun's daemons stopped them.
	testenv.Eventually(t, 15*time.Second, "the first run's ranks stopped", func() error {
		for r, pid := range first {
			if _, err := os.Stat("/proc/" + pid); err == nil {
				return fmt.Errorf("rank %s (pid %s) still runs", r, pid)
			}
		}
		return nil
	})
	require.NoError(t, p.Wait(t, 60*time.Second), "the second run trains its 20 steps and ends with status 0:\n%s", p.Output())
	require.Equal(t, 4, strings.Count(readFile(pids), "\n"), "two ranks in each of two runs:\n%s", p.Output())
	require.Contains(t, p.Output(), "rank 0: 20 steps")
	require.Contains(t, p.Output(), "rank 1: 20 steps")
}

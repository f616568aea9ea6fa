package workloads

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

const mpiValues = "examples/local/mpi.yaml"

// TestMPI is the ChainerMN / Horovod-style MPI case: a launcher and two worker sets whose slots come from fake
// GPUs (group worker: 2 pods x 1 GPU, group wide: 1 pod x 2 GPUs). A real Open MPI mpirun in the launcher,
// started once the 3 workers are registered, must place exactly as many ranks on each worker pod as the
// hostfile gives it slots. Then `helm upgrade` scales the wide group to 2: the hostfile and discover_hosts.sh
// must list the new pod within a second of it being Ready, and a second mpirun round must use it. With each
// MPI of the trainer image: Open MPI (mpirun.openmpi, mpi4py) and MPICH (mpiexec.hydra), as mpi.flavour says.
func TestMPI(t *testing.T) {
	for _, flavour := range []string{constants.FlavourOpenMPI, constants.FlavourMPICH} {
		t.Run(flavour, func(t *testing.T) { testMPI(t, flavour) })
	}
}

func testMPI(t *testing.T, flavour string) {
	c, ns := startTest(t)
	const job = "mpi"
	v := jobValues(t, c, mpiValues, "")
	set(v, "mpi.flavour", flavour)
	// One mpirun round at 3 members, one at 4 after the scale-up.
	set(v, "mpi.launcher.args", []any{"3", "4"})
	// A failed launcher is the answer: no retry that would hide it.
	set(v, "mpi.launcher.backoffLimit", 0)

	start := time.Now()
	installJob(t, c, ns, job, v)
	launcher := launcherPod(t, c, ns, job)
	log := waitLauncherLog(t, c, ns, launcher, "round 1 done", 4*time.Minute)
	t.Logf("helm install -> mpirun round 1 done: %.1fs", time.Since(start).Seconds())
	workers := c.WaitPodsReady(t, ns, constants.LabelJob+"="+job+","+constants.LabelRole+"="+constants.RoleWorker, 3, time.Minute)
	want := slotsByPod(t, workers)
	// The slots are the fake GPUs each group asked for: the webhook counted them.
	for pod, gpus := range map[string]int{job + "-worker-0": 1, job + "-worker-1": 1, job + "-wide-0": 2} {
		if want[pod] != gpus {
			t.Errorf("pod %s has %d slots, want %d (its nvidia.com/gpu limit)", pod, want[pod], gpus)
		}
	}
	checkPlacement(t, log, 1, want)

	// Scale the wide group and time how soon a running pod's files list the new pod.
	newPod := job + "-wide-1"
	readyAt := watchReady(t, c, ns, newPod)
	upgraded := time.Now()
	c.HelmUpgrade(t, ns, job, c.RepoPath(jobChart), map[string]any{"workerGroups": map[string]any{"wide": map[string]any{"replicas": 2}}}, framework.ReuseValues())
	host := naming.PodFQDN(newPod, job, ns, framework.ClusterDomain)
	lag := waitFilesList(t, c, ns, job+"-worker-0", newPod, hostfileLine(flavour, host, 2), host, 2, readyAt, 2*time.Minute)
	t.Logf("helm upgrade --set workerGroups.wide.replicas=2 -> %s listed in worker-0's hostfile and discover_hosts.sh: %.1fs after the upgrade, %s",
		newPod, time.Since(upgraded).Seconds(), lag)

	log = waitLauncherLog(t, c, ns, launcher, "round 2 done", 2*time.Minute)
	workers = c.WaitPodsReady(t, ns, constants.LabelJob+"="+job+","+constants.LabelRole+"="+constants.RoleWorker, 4, time.Minute)
	want = slotsByPod(t, workers)
	if want[newPod] != 2 {
		t.Errorf("pod %s has %d slots, want 2 (its nvidia.com/gpu limit)", newPod, want[newPod])
	}
	checkPlacement(t, log, 2, want)
	t.Logf("launcher log (mpirun's --display-map and the rank lines):\n%s", log)
	c.WaitPodPhase(t, ns, launcher, corev1.PodSucceeded, time.Minute)
	waitJobComplete(t, c, ns, naming.Workload(job, constants.RoleLauncher), time.Minute)

	uninstallJob(t, c, ns, job)
}

// launcherPod waits for the launcher Job's pod and returns its name.
func launcherPod(t testing.TB, c *framework.Cluster, ns, job string) string {
	t.Helper()
	var name string
	c.WaitFor(t, time.Minute, "the launcher pod", func(ctx context.Context) (bool, error) {
		pods, err := c.LivePods(ctx, ns, groupSelector(job, constants.GroupLauncher))
		if err != nil || len(pods) != 1 {
			return false, fmt.Errorf("%d live launcher pods (%v)", len(pods), err)
		}
		name = pods[0].Name
		return true, nil
	})
	return name
}

// waitLauncherLog waits until the launcher's log contains substr and returns the log; a launcher that ends
// (mpirun failed, or the script finished without it) fails at once with its log.
func waitLauncherLog(t testing.TB, c *framework.Cluster, ns, pod, substr string, timeout time.Duration) string {
	t.Helper()
	var log string
	var ended error
	c.WaitFor(t, timeout, fmt.Sprintf("%q in the log of launcher %s", substr, pod), func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		l, err := c.TailLogs(ctx, ns, pod, trainer, 500)
		if err != nil {
			return false, err
		}
		log = l
		if strings.Contains(l, substr) {
			return true, nil
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			ended = fmt.Errorf("launcher %s ended %s before logging %q; its log:\n%s", pod, p.Status.Phase, substr, l)
			return true, nil
		}
		return false, fmt.Errorf("phase %s; log so far: %q", p.Status.Phase, l)
	})
	if ended != nil {
		t.Fatal(ended)
	}
	return log
}

// slotsByPod returns each pod's slot count as the webhook recorded it (annotation mutated: ...,slots=N).
func slotsByPod(t testing.TB, pods []corev1.Pod) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, p := range pods {
		m := p.Annotations[constants.AnnotationMutated]
		_, s, ok := strings.Cut(m, "slots=")
		n, err := strconv.Atoi(s)
		if !ok || err != nil {
			t.Fatalf("pod %s: annotation %s=%q has no slot count", p.Name, constants.AnnotationMutated, m)
		}
		out[p.Name] = n
	}
	return out
}

var rankLine = regexp.MustCompile(`(?m)^round=(\d+) rank=(\d+) size=(\d+) host=(\S+) sum=(\d+)$`)

// checkPlacement parses one mpirun round's rank lines and checks that ranks 0..size-1 ran once each and that
// every pod ran exactly as many ranks as it has slots (and no rank ran anywhere else), and that every rank got
// the right sum from an MPI allreduce across the pods.
func checkPlacement(t testing.TB, log string, round int, slots map[string]int) {
	t.Helper()
	total := 0
	for _, n := range slots {
		total += n
	}
	// The hostfile mpirun read, as the launcher printed it just before: "round N hostfile: <fqdn> slots=N,...".
	used := map[string]int{}
	if m := regexp.MustCompile(fmt.Sprintf(`(?m)^round %d hostfile: (.*)$`, round)).FindStringSubmatch(log); m != nil {
		for _, line := range strings.Split(strings.TrimSuffix(m[1], ","), ",") {
			host, n, ok := strings.Cut(line, " slots=") // Open MPI
			if !ok {
				host, n, _ = strings.Cut(line, ":") // MPICH
			}
			short, _, _ := strings.Cut(host, ".")
			used[short], _ = strconv.Atoi(n)
		}
	}
	// Or as rdzv-sidecar launch printed it before its last run: "... slots: <fqdn>:N <fqdn>:N listed in <hostfile>".
	if ms := regexp.MustCompile(`(?m)^rdzv-sidecar launch: .* slots: (.*) listed in `).FindAllStringSubmatch(log, -1); len(used) == 0 && ms != nil {
		for _, hs := range strings.Fields(ms[len(ms)-1][1]) {
			host, n, _ := strings.Cut(hs, ":")
			short, _, _ := strings.Cut(host, ".")
			used[short], _ = strconv.Atoi(n)
		}
	}
	if fmt.Sprint(used) != fmt.Sprint(slots) {
		t.Errorf("round %d: the launcher's hostfile gave slots %v, want %v (the webhook's per pod)", round, used, slots)
	}
	perPod := map[string]int{}
	seen := map[int]bool{}
	for _, m := range rankLine.FindAllStringSubmatch(log, -1) {
		if r, _ := strconv.Atoi(m[1]); r != round {
			continue
		}
		rank, _ := strconv.Atoi(m[2])
		size, _ := strconv.Atoi(m[3])
		if size != total {
			t.Errorf("round %d: rank %d on %s reports world size %d, want %d (the sum of slots)", round, rank, m[4], size, total)
		}
		if sum, _ := strconv.Atoi(m[5]); sum != total*(total-1)/2 {
			t.Errorf("round %d: rank %d on %s got %d from MPI allreduce of the ranks, want %d", round, rank, m[4], sum, total*(total-1)/2)
		}
		if seen[rank] {
			t.Errorf("round %d: rank %d printed twice", round, rank)
		}
		seen[rank] = true
		perPod[m[4]]++
	}
	if len(seen) != total {
		t.Errorf("round %d: %d ranks printed, want %d; launcher log:\n%s", round, len(seen), total, log)
	}
	var placed []string
	for pod, n := range perPod {
		placed = append(placed, fmt.Sprintf("%s=%d", pod, n))
		if _, ok := slots[pod]; !ok {
			t.Errorf("round %d: %d ranks ran on %s, which is no worker pod (workers: %v)", round, n, pod, slots)
		}
	}
	for pod, n := range slots {
		if perPod[pod] != n {
			t.Errorf("round %d: %d ranks on %s, want %d (its slots)", round, perPod[pod], pod, n)
		}
	}
	sort.Strings(placed)
	t.Logf("round %d: %d ranks placed %s (slots %v)", round, len(seen), strings.Join(placed, " "), slots)
}

// watchReady reports the moment a watch first sees pod Ready. Started before the pod exists, it is not limited
// by a poll interval.
func watchReady(t testing.TB, c *framework.Cluster, ns, pod string) <-chan time.Time {
	t.Helper()
	w, err := c.Client.CoreV1().Pods(ns).Watch(t.Context(), metav1.ListOptions{FieldSelector: "metadata.name=" + pod})
	if err != nil {
		t.Fatalf("watch pod %s: %v", pod, err)
	}
	ready := make(chan time.Time, 1)
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && framework.PodReady(p) {
				ready <- time.Now()
				return
			}
		}
	}()
	return ready
}

// waitFilesList waits until pod newPod is Ready (readyAt) and reader's hostfile and discover_hosts.sh output
// list host with slots (wantHostfile: the line in the flavour's format), and fails when the files list it more than a second after the pod became Ready.
// It returns the measured delay in words. Files may list the host before the pod is Ready: a member registers
// when its sidecar starts. A listing time is when the kubectl exec that saw it returned: an upper bound.
func waitFilesList(t testing.TB, c *framework.Cluster, ns, reader, newPod, wantHostfile, host string, slots int, readyAt <-chan time.Time, timeout time.Duration) string {
	t.Helper()
	const limit = time.Second
	wantScript := fmt.Sprintf("%s:%d", host, slots)
	script := fmt.Sprintf("cat %[1]s/%[2]s; echo ---; %[1]s/%[3]s", constants.FilesDir, constants.HostfileName, constants.DiscoverHostsName)
	var ready, listed time.Time
	var late error
	c.WaitFor(t, timeout, fmt.Sprintf("%s Ready and listed in %s's hostfile and discover_hosts.sh", newPod, reader), func(ctx context.Context) (bool, error) {
		select {
		case ready = <-readyAt:
		default:
		}
		if listed.IsZero() {
			out, err := c.Kubectl(ctx, "-n", ns, "exec", reader, "-c", trainer, "--", "/bin/sh", "-c", script)
			if err != nil {
				return false, err
			}
			hostfile, disc, _ := strings.Cut(out, "---\n")
			if !hasLine(hostfile, wantHostfile) || !hasLine(disc, wantScript) {
				if !ready.IsZero() && time.Since(ready) > limit+2*time.Second {
					late = fmt.Errorf("%s Ready %.1fs ago and still not in %s's files: hostfile %q, discover_hosts.sh %q",
						newPod, time.Since(ready).Seconds(), reader, hostfile, disc)
					return true, nil
				}
				return false, fmt.Errorf("not listed yet: hostfile %q, discover_hosts.sh %q", hostfile, disc)
			}
			listed = time.Now()
		}
		if ready.IsZero() {
			return false, fmt.Errorf("listed, but %s not Ready yet", newPod)
		}
		return true, nil
	})
	if late != nil {
		t.Fatal(late)
	}
	lag := listed.Sub(ready)
	if lag > limit {
		t.Errorf("%s's files listed %s %.2fs after it was Ready, want within %s", reader, newPod, lag.Seconds(), limit)
	}
	if lag <= 0 {
		return fmt.Sprintf("%.2fs before the pod was Ready", -lag.Seconds())
	}
	return fmt.Sprintf("%.2fs after the pod was Ready", lag.Seconds())
}

func hasLine(text, line string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

// hostfileLine is a host's line in the hostfile of an MPI flavour.
func hostfileLine(flavour, host string, slots int) string {
	if flavour == constants.FlavourOpenMPI {
		return fmt.Sprintf("%s slots=%d", host, slots)
	}
	return fmt.Sprintf("%s:%d", host, slots)
}

// TestMPIFromDefaults installs what an MPI user writes (examples/local/mpi-allreduce.yaml for Open MPI,
// examples/local/mpich-allreduce.yaml for MPICH: image, flavour, the mpirun or mpiexec command, workers) and nothing
// else: the workers run the chart's sshd, and the launcher's command, run through `rdzv-sidecar launch`, starts once
// both workers answer and places a rank on each (a real allreduce across the two nodes). Then `helm upgrade` scales
// the workers 2 -> 3 -> 2: launch stops the run at each change and runs it again on every worker there is. Last, a
// rank frozen (SIGSTOP) hangs the run: launch stops it and runs it again (hang.timeout 15 s, the one value added).
func TestMPIFromDefaults(t *testing.T) {
	c := framework.Get(t)
	c.ShapeAsGPUNode(t, framework.ExtraNodes[0]) // tainted as a managed cluster's GPU nodes are
	// The two flavours together (each in its namespace; nothing here is timed against a goal), after this function
	// returns and before its cleanup takes the taint off: no other test runs meanwhile.
	for _, tc := range []struct{ flavour, values, command string }{
		{constants.FlavourOpenMPI, "examples/local/mpi-allreduce.yaml", "mpirun.openmpi"},
		{constants.FlavourMPICH, "examples/local/mpich-allreduce.yaml", "mpiexec.hydra"},
	} {
		t.Run(tc.flavour, func(t *testing.T) {
			t.Parallel()
			c, ns := startTest(t)
			const job = "allreduce"
			v := jobValues(t, c, tc.values, "")
			set(v, "mpi.launcher.backoffLimit", 0) // a failed launcher is the answer
			// Each run lasts (an allreduce every half second for 3 minutes): the scaling happens during one.
			set(v, "env", append(envWithout(v, "ITERS"), map[string]any{"name": "ITERS", "value": "360"}))
			set(v, "hang.timeout", 15) // what a user who wants a hang found sooner than the default minute sets
			start := time.Now()
			installJob(t, c, ns, job, v)
			launcher := launcherPod(t, c, ns, job)
			workers := constants.LabelJob + "=" + job + "," + constants.LabelRole + "=" + constants.RoleWorker
			log := waitRun(t, c, ns, launcher, 1, 2, 4*time.Minute)
			t.Logf("helm install -> %s at 2 ranks: %.1fs", tc.command, time.Since(start).Seconds())
			checkPlacement(t, lastRun(log), 1, slotsByPod(t, c.WaitPodsReady(t, ns, workers, 2, time.Minute)))

			for i, n := range []int{3, 2} {
				changed := time.Now()
				scaleWorkers(t, c, ns, job, n)
				log = waitRun(t, c, ns, launcher, i+2, n, 3*time.Minute)
				why := map[int]string{3: "joined the membership", 2: "left the membership"}[n]
				if !strings.Contains(log, why) {
					t.Errorf("scale to %d: the launcher did not say a member %s:\n%s", n, why, log)
				}
				t.Logf("helm upgrade --set workers.replicas=%d -> %s again at %d ranks: %.1fs", n, tc.command, n, time.Since(changed).Seconds())
				pods := c.WaitPodsReady(t, ns, workers, n, time.Minute)
				checkPlacement(t, lastRun(log), 1, slotsByPod(t, pods))
				nodes := map[string]bool{}
				for _, p := range pods {
					nodes[p.Spec.NodeName] = true
				}
				t.Logf("%d workers on nodes %v", n, slices.Sorted(maps.Keys(nodes)))
			}

			// A hang: one rank frozen (SIGSTOP), the other waits in its allreduce for ever, and mpirun sees nothing
			// wrong. The ranks say each step (elastic_training.progress, which the ranks import through the webhook's
			// PYTHONPATH that the chart's sshd hands them); launch's supervise finds none advancing for hang.timeout,
			// names the frozen one, stops mpirun and runs it again.
			pods := c.WaitPodsReady(t, ns, workers, 2, time.Minute)
			frozen := pods[1]
			// Once the run's ranks have said steps: a run frozen before its first (every rank then waits in its
			// first allreduce and none ever spoke in this run) is not judged (docs/hangs.md, "Not done").
			c.WaitFor(t, time.Minute, "run 3 at step 10", func(context.Context) (bool, error) {
				return strings.Contains(lastRun(waitLauncherLog(t, c, ns, launcher, "rdzv-sidecar launch: ", time.Minute)), "step 10/"), nil
			})
			if out, err := c.Kubectl(t.Context(), "-n", ns, "exec", frozen.Name, "-c", trainer, "--", "sh", "-c", "kill -STOP $(pgrep -x python3)"); err != nil {
				t.Fatalf("freezing the rank in %s: %v: %s", frozen.Name, err, out)
			}
			froze := time.Now()
			log = waitRun(t, c, ns, launcher, 4, 2, 2*time.Minute)
			hung := regexp.MustCompile(`rdzv-sidecar supervise: hung: no rank advanced for \S+ \(at step \d+\); stopped first: rank \d+ \(` +
				regexp.QuoteMeta(frozen.Spec.Hostname+".") + `[^)]*\) at step \d+, frozen`).FindString(log)
			if hung == "" || !strings.Contains(log, "a hang stopped run 3") {
				t.Errorf("the launcher did not stop run 3 as hung, naming %s's rank frozen:\n%s", frozen.Name, log)
			}
			t.Logf("a rank frozen in %s -> %s again at 2 ranks: %.1fs (hang.timeout 15 s): %s", frozen.Name, tc.command, time.Since(froze).Seconds(), hung)
			t.Logf("launcher log:\n%s", log)
			uninstallJob(t, c, ns, job)
		})
	}
}

// waitRun waits until the launcher's log shows run number run of rdzv-sidecar launch, over n members, with the
// rank lines of its n ranks, and returns the log.
func waitRun(t testing.TB, c *framework.Cluster, ns, launcher string, run, n int, timeout time.Duration) string {
	t.Helper()
	var log string
	c.WaitFor(t, timeout, fmt.Sprintf("run %d of the launcher at %d ranks", run, n), func(ctx context.Context) (bool, error) {
		log = waitLauncherLog(t, c, ns, launcher, "rdzv-sidecar launch: ", timeout)
		last := lastRun(log)
		runs := len(runStart.FindAllStringIndex(log, -1))
		if runs != run || !strings.HasPrefix(last, fmt.Sprintf("rdzv-sidecar launch: %d members", n)) ||
			len(rankLine.FindAllString(last, -1)) != n {
			return false, fmt.Errorf("%d runs so far; the last:\n%s", runs, last)
		}
		return true, nil
	})
	return log
}

var runStart = regexp.MustCompile(`(?m)^rdzv-sidecar launch: \d+ members.* listed in `)

// lastRun is the launcher's log from the start of rdzv-sidecar launch's last run.
func lastRun(log string) string {
	ms := runStart.FindAllStringIndex(log, -1)
	if len(ms) == 0 {
		return log
	}
	return log[ms[len(ms)-1][0]:]
}

// envWithout is the values' env list without the variable name.
func envWithout(v map[string]any, name string) []any {
	var out []any
	for _, e := range v["env"].([]any) {
		if e.(map[string]any)["name"] != name {
			out = append(out, e)
		}
	}
	return out
}

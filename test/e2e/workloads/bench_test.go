package workloads

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// scaling is one measurement of an elastic PyTorch job on the real cluster. install, up and down are read from
// the pods' log timestamps: from `helm install` or `helm upgrade` until the last worker finished its first step at
// the new size (the poll that sees it lags by up to its interval and the log reads). joined ends at the last worker's first line at the
// new size instead: the process group formed and the state agreed (the script's first collectives), before the
// step's simulated compute (0.5 s). newAgent, newWorkers and oldWorkers split the scale-up: from `helm upgrade` until
// the new pod's torchrun agent asks to join (pod start, Python and torch imports), and the workers' own start once
// the rendezvous is complete, in the new pod (its fork server's first start among them) and in the pods restarted
// (the training script's torch import, warm or cold, and process group, the same with any rendezvous).
type scaling struct{ install, up, joined, down, newAgent, newWorkers, oldWorkers time.Duration }

func measureScaling(b *testing.B, c *framework.Cluster, vals map[string]any) scaling {
	ns := c.Namespace(b)
	const job = "bench"
	v := jobValues(b, c, pytorchValues, trainScript)
	set(v, "args", []any{"--steps=100000", "--step-seconds=0.5"})
	// torchrun's INFO log says when an agent joins a rendezvous and when it starts the workers.
	v["env"] = append(v["env"].([]any), map[string]any{"name": "LOGLEVEL", "value": "INFO"})
	for k, x := range vals { // dotted keys, as --set takes them
		set(v, k, x)
	}
	sel := groupSelector(job, "worker")
	var s scaling
	start := time.Now()
	c.HelmInstall(b, ns, job, c.RepoPath(jobChart), v)
	c.WaitWorld(b, ns, sel, trainer, 2, 1, 5*time.Minute)
	s.install, _, _, _, _ = phases(b, c, ns, sel, 2, start)
	start = time.Now()
	c.HelmUpgrade(b, ns, job, c.RepoPath(jobChart), map[string]any{"workers": map[string]any{"replicas": 3}}, framework.ReuseValues())
	c.WaitWorld(b, ns, sel, trainer, 3, 1, 5*time.Minute)
	s.up, s.joined, s.newAgent, s.newWorkers, s.oldWorkers = phases(b, c, ns, sel, 3, start)
	start = time.Now()
	c.HelmUpgrade(b, ns, job, c.RepoPath(jobChart), map[string]any{"workers": map[string]any{"replicas": 2}}, framework.ReuseValues())
	c.WaitWorld(b, ns, sel, trainer, 2, 1, 5*time.Minute)
	s.down, _, _, _, _ = phases(b, c, ns, sel, 2, start)
	c.HelmUninstall(b, ns, job, 2*time.Minute)
	return s
}

// BenchmarkScaling measures, on the real cluster and in one run, how long an elastic PyTorch job takes from
// `helm install` to its first step, and from `helm upgrade` (one worker more, one fewer) until every worker
// trains at the new world size, with the chart's rendezvous defaults (the elastic-training backend), with torch's c10d
// rendezvous at the chart's settings, and with torch's own defaults (c10d, last_call_timeout 30 s, close_timeout
// 30 s; all three at torch's monitor_interval of 0.1 s, the webhook's for a job this small), on the default trainer
// image (torch 2.14); and the chart's defaults with the workers started cold (warmStart: false, docs/warm-start.md),
// for what the warm start saves. Goal: the chart's defaults <= 10 s and <= 0.5x torch's. BENCH_SCALING_REPS
// sets the repetitions (default 2); runs alternate between the settings so machine noise hits them alike. Run it
// with `make bench-e2e`.
func BenchmarkScaling(b *testing.B) {
	reps := 2
	if r := os.Getenv("BENCH_SCALING_REPS"); r != "" {
		fmt.Sscan(r, &reps)
	}
	c := framework.Get(b)
	installWebhook(b, c)
	configs := []struct {
		name string
		vals map[string]any
	}{
		{"chart defaults", nil},
		{"defaults, cold", map[string]any{"warmStart": false}},
		{"c10d, chart's", map[string]any{"rendezvous.backend": constants.BackendC10d}},
		{"torch defaults", map[string]any{"rendezvous.backend": constants.BackendC10d, "rendezvous.lastCallTimeout": 30, "rendezvous.closeTimeout": 30}},
	}
	torch := len(configs) - 1 // the ratio's baseline
	got := make([][]scaling, len(configs))
	for i := 0; i < b.N*reps; i++ {
		for j, cfg := range configs {
			s := measureScaling(b, c, cfg.vals)
			// Printed, not logged: a benchmark's log is cut short, and each run is a figure of the spread.
			fmt.Printf("%s, run %d: install %.1fs, scale up %.1fs (joined %.1fs, new agent %.1fs, workers new %.1fs, restarted %.1fs), scale down %.1fs\n",
				cfg.name, i+1, s.install.Seconds(), s.up.Seconds(), s.joined.Seconds(), s.newAgent.Seconds(), s.newWorkers.Seconds(), s.oldWorkers.Seconds(), s.down.Seconds())
			got[j] = append(got[j], s)
		}
	}
	pick := func(j int, f func(scaling) time.Duration) time.Duration {
		var d []time.Duration
		for _, s := range got[j] {
			d = append(d, f(s))
		}
		return testenv.Median(d)
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\nelastic PyTorch on the local cluster (%s, torch %s), median of %d runs each (seconds)\n",
		framework.TrainerImages[0].Image, framework.TrainerImages[0].Torch, reps*b.N)
	fmt.Fprintf(&out, "%-32s %14s %14s %14s %14s %8s\n", "", configs[0].name, configs[1].name, configs[2].name, configs[torch].name, "ratio")
	for _, m := range []struct {
		name string
		f    func(scaling) time.Duration
	}{
		{"helm install -> first step", func(s scaling) time.Duration { return s.install }},
		{"scale up 2->3 -> all at world 3", func(s scaling) time.Duration { return s.up }},
		{"  all joined at world 3", func(s scaling) time.Duration { return s.joined }},
		{"  of which: new pod's agent up", func(s scaling) time.Duration { return s.newAgent }},
		{"  workers' start: new pod", func(s scaling) time.Duration { return s.newWorkers }},
		{"  workers' start: restarted", func(s scaling) time.Duration { return s.oldWorkers }},
		{"scale down 3->2 -> all at world 2", func(s scaling) time.Duration { return s.down }},
	} {
		a, cold, c10d, t := pick(0, m.f), pick(1, m.f), pick(2, m.f), pick(torch, m.f)
		fmt.Fprintf(&out, "%-32s %14.1f %14.1f %14.1f %14.1f %8.2f\n", m.name, a.Seconds(), cold.Seconds(), c10d.Seconds(), t.Seconds(), a.Seconds()/t.Seconds())
		if !strings.HasPrefix(m.name, " ") {
			b.ReportMetric(a.Seconds(), strings.Fields(m.name)[0]+"-"+strings.Fields(m.name)[1]+"-s")
		}
	}
	fmt.Print(out.String())
}

// phases reads the timestamped logs of the live pods after the install or upgrade begun at since: when the last worker
// finished its first step at the new world size, when the last one printed its first line at that size, when the
// new pod's agent started its rendezvous, and the longest time a worker of the new pod (newWorkers) and of the pods
// already there (oldWorkers: a restart, warm from a running fork server) took from torchrun's "Starting worker group"
// to its first line at the new world size (each waits in its process group for the others: the slowest sets both).
func phases(b *testing.B, c *framework.Cluster, ns, sel string, world int, since time.Time) (up, joined, newAgent, newWorkers, oldWorkers time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pods, err := c.LivePods(ctx, ns, sel)
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range pods {
		l, err := readPodLog(ctx, c, ns, p.Name, world, since)
		if err != nil {
			b.Fatal(err)
		}
		if p.CreationTimestamp.After(since.Add(-time.Second)) {
			if newAgent == 0 && !l.rendezvous.IsZero() {
				newAgent = l.rendezvous.Sub(since)
			}
			newWorkers = max(newWorkers, l.first.Sub(l.starting))
		} else {
			oldWorkers = max(oldWorkers, l.first.Sub(l.starting))
		}
		joined = max(joined, l.first.Sub(since))
		up = max(up, l.step.Sub(since))
	}
	return up, joined, newAgent, newWorkers, oldWorkers
}

// podLog is what a trainer's log says after since: when its agent first began a rendezvous, and, of the last start
// of its workers ("Starting worker group" with torchrun's INFO log; otherwise the warning of the restart's stop of
// the workers before, which adds the stop and the round), when it was, when a worker printed its first line at the
// world size, and its first step there.
type podLog struct{ rendezvous, starting, first, step time.Time }

func readPodLog(ctx context.Context, c *framework.Cluster, ns, pod string, world int, since time.Time) (podLog, error) {
	raw, err := c.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: trainer, Timestamps: true}).DoRaw(ctx)
	if err != nil {
		return podLog{}, fmt.Errorf("%s's log: %w", pod, err)
	}
	want := fmt.Sprintf("world_size=%d ", world)
	var l podLog
	for _, line := range strings.Split(string(raw), "\n") {
		ts, text, ok := strings.Cut(line, " ")
		t, err := time.Parse(time.RFC3339Nano, ts)
		if !ok || err != nil || t.Before(since) {
			continue
		}
		switch {
		case strings.Contains(text, "Rendezvous'ing worker group") && l.rendezvous.IsZero():
			l.rendezvous = t
		case strings.Contains(text, "Starting worker group"), strings.Contains(text, "via signal SIGTERM"), strings.Contains(text, "closing signal SIGTERM"):
			// A restart begins with the agent stopping its workers (torchrun's warning: "Closing process N via signal
			// SIGTERM" warm, "Sending process N closing signal SIGTERM" cold), then "Starting worker group" (its INFO
			// log, where LOGLEVEL shows it): the later counts.
			l.starting, l.first, l.step = t, time.Time{}, time.Time{}
		case strings.Contains(text, want) && !l.starting.IsZero():
			if l.first.IsZero() {
				l.first = t
			}
			if _, w := framework.LastStep(text); w == world && l.step.IsZero() {
				l.step = t
			}
		}
	}
	if l.starting.IsZero() || l.first.IsZero() || l.step.IsZero() {
		return l, fmt.Errorf("%s: no start of its workers followed by a step at world %d in its log", pod, world)
	}
	return l, nil
}

// BenchmarkNodeLoss measures, on the two-node cluster and in one run, what a crashed worker node costs an elastic
// PyTorch job (3 workers, worker 0 serving the rendezvous on the node that stays, the others spread): the time from
// the crash until every survivor trains at the smaller world size, and until every worker trains at the full size
// again (Kubernetes replaced the lost pods). Once with the chart's defaults (the elastic-training backend; and once
// more with its workers started cold, warmStart: false), once with torch's
// c10d rendezvous at the chart's settings (the survivors' restarter), once with torch's own behaviour (c10d,
// rendezvous.restartSurvivors false, last_call and close timeouts 30 s): its survivors wait for the collective
// timeout (gloo: 30 min), so the wait for them stops at 180 s and reports "> 180". On the default trainer image
// (torch 2.14). Goals (issue 23): smaller size within 20 s, full size within 90 s. Run it with `make bench-node-loss`.
func BenchmarkNodeLoss(b *testing.B) {
	c := framework.Get(b)
	installWebhook(b, c)
	const limit = 180 * time.Second
	img := framework.TrainerImages[0]
	type lossConfig struct {
		name string
		run  lossRun
	}
	configs := []lossConfig{
		{"chart defaults", lossRun{}},
		{"defaults, lease 2 s", lossRun{rdzv: map[string]any{"leaseTTL": 2}}},
		{"defaults, lease 5 s", lossRun{rdzv: map[string]any{"leaseTTL": 5}}},
		{"defaults, cold", lossRun{values: map[string]any{"warmStart": false}}},
		{"c10d, chart's", lossRun{rdzv: map[string]any{"backend": constants.BackendC10d}}},
		{"torch's own", lossRun{rdzv: map[string]any{"backend": constants.BackendC10d, "restartSurvivors": false, "lastCallTimeout": 30, "closeTimeout": 30},
			smallerLimit: limit}},
	}
	// BENCH_NODE_LOSS_CONFIGS (names, separated by ";") runs only those; the first of the list is always the chart's
	// defaults.
	if only := os.Getenv("BENCH_NODE_LOSS_CONFIGS"); only != "" {
		configs = slices.DeleteFunc(configs, func(c lossConfig) bool {
			return c.name != "chart defaults" && !slices.Contains(strings.Split(only, ";"), c.name)
		})
	}
	got := make([]nodeLoss, len(configs))
	for i := 0; i < b.N; i++ {
		for j, cfg := range configs {
			got[j] = workerNodeLoss(b, c, c.Namespace(b), img, crash, cfg.run)
		}
	}
	secs := func(d time.Duration) string {
		if d == 0 {
			return fmt.Sprintf("> %.0f", limit.Seconds())
		}
		return fmt.Sprintf("%.1f", d.Seconds())
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\nworker node crash, elastic PyTorch 3 workers on 2 nodes (%s, torch %s), seconds after the crash\n", img.Image, img.Torch)
	line := func(head string, cell func(j int) string) {
		fmt.Fprintf(&out, "%-48s", head)
		for j := range configs {
			fmt.Fprintf(&out, " %20s", cell(j))
		}
		out.WriteString("\n")
	}
	line("", func(j int) string { return configs[j].name })
	line(fmt.Sprintf("survivors (%d) train at the smaller size", got[0].survivors), func(j int) string { return secs(got[j].trainAgain) })
	line("  of which: their restart (stop, round, start)", func(j int) string {
		if got[j].trainAgain == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", got[j].restart.Seconds())
	})
	line("all 3 train again (lost pods replaced)", func(j int) string { return secs(got[j].replaced) })
	fmt.Print(out.String())
	b.ReportMetric(got[0].trainAgain.Seconds(), "smaller-size-s")
	b.ReportMetric(got[0].replaced.Seconds(), "full-size-s")
}

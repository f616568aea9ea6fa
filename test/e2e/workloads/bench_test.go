package workloads

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// scaling is one measurement of an elastic PyTorch job on the real cluster.
type scaling struct{ install, up, down time.Duration }

func measureScaling(b *testing.B, c *framework.Cluster, rdzv map[string]any) scaling {
	ns := c.Namespace(b)
	const job = "bench"
	v := jobValues(b, c, pytorchValues, trainScript)
	set(v, "args", []any{"--steps=100000", "--step-seconds=0.5"})
	for k, x := range rdzv {
		set(v, "rendezvous."+k, x)
	}
	sel := groupSelector(job, "worker")
	var s scaling
	start := time.Now()
	c.HelmInstall(b, ns, job, c.RepoPath(jobChart), v)
	waitWorld(b, c, ns, sel, 2, 1, 5*time.Minute)
	s.install = time.Since(start)
	start = time.Now()
	c.HelmUpgrade(b, ns, job, c.RepoPath(jobChart), map[string]any{"workers": map[string]any{"replicas": 3}}, framework.ReuseValues())
	waitWorld(b, c, ns, sel, 3, 1, 5*time.Minute)
	s.up = time.Since(start)
	start = time.Now()
	c.HelmUpgrade(b, ns, job, c.RepoPath(jobChart), map[string]any{"workers": map[string]any{"replicas": 2}}, framework.ReuseValues())
	waitWorld(b, c, ns, sel, 2, 1, 5*time.Minute)
	s.down = time.Since(start)
	c.HelmUninstall(b, ns, job, 2*time.Minute)
	return s
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// BenchmarkScaling measures, on the real cluster and in one run, how long an elastic PyTorch job takes from
// `helm install` to its first step, and from `helm upgrade` (one worker more, one fewer) until every worker
// trains at the new world size, with the chart's rendezvous defaults and with torch's own defaults
// (last_call_timeout 30 s, monitor_interval 5 s in torch 1.13). Goal: the chart's defaults <= 10 s and <= 0.5x
// torch's. BENCH_SCALING_REPS sets the repetitions (default 2); runs alternate between the two settings so
// machine noise hits both alike. Run it with `make bench-e2e`.
func BenchmarkScaling(b *testing.B) {
	reps := 2
	if r := os.Getenv("BENCH_SCALING_REPS"); r != "" {
		fmt.Sscan(r, &reps)
	}
	c := framework.Get(b)
	installWebhook(b, c)
	configs := []struct {
		name string
		rdzv map[string]any
	}{
		{"chart defaults", nil},
		{"torch defaults", map[string]any{"lastCallTimeout": 30, "monitorInterval": 5, "closeTimeout": 30}},
	}
	got := make([][]scaling, len(configs))
	for i := 0; i < b.N*reps; i++ {
		for j, cfg := range configs {
			s := measureScaling(b, c, cfg.rdzv)
			b.Logf("%s, run %d: install %.1fs, scale up %.1fs, scale down %.1fs", cfg.name, i+1, s.install.Seconds(), s.up.Seconds(), s.down.Seconds())
			got[j] = append(got[j], s)
		}
	}
	pick := func(j int, f func(scaling) time.Duration) time.Duration {
		var d []time.Duration
		for _, s := range got[j] {
			d = append(d, f(s))
		}
		return median(d)
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\nelastic PyTorch on the local cluster, median of %d runs each (seconds)\n", reps*b.N)
	fmt.Fprintf(&out, "%-32s %14s %14s %8s\n", "", configs[0].name, configs[1].name, "ratio")
	for _, m := range []struct {
		name string
		f    func(scaling) time.Duration
	}{
		{"helm install -> first step", func(s scaling) time.Duration { return s.install }},
		{"scale up 2->3 -> all at world 3", func(s scaling) time.Duration { return s.up }},
		{"scale down 3->2 -> all at world 2", func(s scaling) time.Duration { return s.down }},
	} {
		a, t := pick(0, m.f), pick(1, m.f)
		fmt.Fprintf(&out, "%-32s %14.1f %14.1f %8.2f\n", m.name, a.Seconds(), t.Seconds(), a.Seconds()/t.Seconds())
		b.ReportMetric(a.Seconds(), strings.Fields(m.name)[0]+"-"+strings.Fields(m.name)[1]+"-s")
	}
	fmt.Print(out.String())
}

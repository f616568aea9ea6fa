package sidecar_test

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

// BenchmarkCheckpointNodeLoss (`make bench-checkpoint-loss`, root, the trainer root filesystems): what a node's
// loss costs a job's work, for in-memory checkpoints against torch's documented way, side by side in one run. Three
// agents of real torchrun (torch 2.14 and 2.6, the elastic-training backend, a joining sidecar each, as on three
// nodes) train the integration test's model plus a replicated tensor of BENCH_CHECKPOINT_SIZES_MIB (default 64),
// steps of BENCH_STEP_SECONDS (0.3 s of sleep) and at least BENCH_LOSS_STEP (150) steps before one node's agent and
// sidecar are killed (its node vanishes). Ways: elastic_training.checkpoint.save every step (memory, replicated by
// the sidecars), and dcp.save every step and every 100 steps to a directory all three share (the job volume's
// stand-in: local disk, faster than any network volume torch's way would use). The survivors form a round at world
// 2 and load. Printed per way: seconds from the loss to the first step done at world 2, steps redone (those done
// before the loss and done again), and the work lost, that time plus the redone steps at the step time measured
// before the loss. Nothing fails on a figure: the goal (1 step redone) is printed PASS or MISS.
func BenchmarkCheckpointNodeLoss(b *testing.B) {
	sizes := testenv.Knob(b, "BENCH_CHECKPOINT_SIZES_MIB", []int{64}, testenv.Ints)
	stepSleep := testenv.Knob(b, "BENCH_STEP_SECONDS", "0.3", testenv.Str)
	lossStep := testenv.Knob(b, "BENCH_LOSS_STEP", 150, strconv.Atoi)
	ways := []struct {
		name  string
		env   []string
		every int
	}{
		{"elastic_training.checkpoint", nil, 1},
		{"dcp.save to disk, every step", []string{"CKPT_WAY=dcp", "CKPT_EVERY=1"}, 1},
		{"dcp.save to disk, every 100", []string{"CKPT_WAY=dcp", "CKPT_EVERY=100"}, 100},
	}
	for _, suite := range []string{testenv.SuiteForky, testenv.SuiteTrixie} {
		tr := newTrainer(b, suite)
		for _, mib := range sizes {
			for _, way := range ways {
				b.Run(fmt.Sprintf("%s/%dMiB/%s", suite, mib, way.name), func(b *testing.B) {
					r := nodeLoss(b, tr, mib, stepSleep, lossStep, append(slices.Clip(way.env), "CKPT_DISK="+b.TempDir()))
					goal := "PASS"
					if r.redone > 1 {
						goal = "MISS"
					}
					fmt.Printf("torch %s, %d MiB, %-30s loss -> training again %5.1f s, steps redone %3d (goal <= 1: %s), work lost %5.1f s (step %.2f s)\n",
						tr.version, mib, way.name+":", r.again.Seconds(), r.redone, goal, r.lost().Seconds(), r.step.Seconds())
					b.ReportMetric(r.again.Seconds(), "s-to-train-again")
					b.ReportMetric(float64(r.redone), "steps-redone")
					b.ReportMetric(r.lost().Seconds(), "s-work-lost")
				})
			}
		}
	}
}

// lossResult is one node loss: the time to the first step at the smaller world, the steps redone, the step time.
type lossResult struct {
	again  time.Duration
	redone int
	step   time.Duration
}

func (r lossResult) lost() time.Duration { return r.again + time.Duration(r.redone)*r.step }

var stepLineRe = regexp.MustCompile(`STEP step=(\d+) world=(\d+) rank=\d+ t=([\d.]+)`)

type stepLine struct {
	step, world int
	at          time.Time
}

func steps(out string) []stepLine {
	var s []stepLine
	for _, m := range stepLineRe.FindAllStringSubmatch(out, -1) {
		step, _ := strconv.Atoi(m[1])
		world, _ := strconv.Atoi(m[2])
		sec, _ := strconv.ParseFloat(m[3], 64)
		s = append(s, stepLine{step, world, time.UnixMilli(int64(sec * 1000))})
	}
	return s
}

func nodeLoss(b *testing.B, tr trainer, mib int, stepSleep string, lossStep int, env []string) lossResult {
	o := newOwnRdzv(b, tr, "bench-loss", "2:3", append([]string{"TRAIN_STEPS=100000", "STEP_SLEEP=" + stepSleep,
		fmt.Sprintf("BENCH_STATE_MIB=%d", mib)}, env...)...)
	o.ckptMemory = fmt.Sprintf("%dMi", 4*mib+64) // its own saves and a peer's copy, two steps of each, and room
	port := testenv.FreePort(b)
	ns := []node{o.startCkpt(b, 0, port, false), o.startCkpt(b, 1, port, false), o.startCkpt(b, 2, port, false)}
	last := func(n node) int {
		s := steps(n.agent.Output())
		if len(s) == 0 {
			return 0
		}
		return s[len(s)-1].step
	}
	testenv.Eventually(b, 10*time.Minute, fmt.Sprintf("every pod at step %d", lossStep), func() error {
		for _, n := range ns {
			if s := last(n); s < lossStep {
				return fmt.Errorf("%s at step %d", n.agent.Name, s)
			}
		}
		return nil
	})
	a, c := ns[0], ns[2]
	before := len(a.agent.Output())
	var times []time.Duration
	s := steps(a.agent.Output())
	for i := max(1, len(s)-20); i < len(s); i++ {
		times = append(times, s[i].at.Sub(s[i-1].at))
	}
	slices.Sort(times)
	c.join.Kill()
	c.agent.Kill()
	killed := time.Now()
	done := max(last(a), last(ns[1]), last(c)) // the job's work at the loss (the ranks are a step apart at most)
	restored, _, _ := waitRestored(b, a, "2", before)
	if restored == 0 {
		// Nothing restored: say why, from what the sidecars warned of.
		for _, n := range ns {
			for line := range strings.Lines(n.join.Output()) {
				if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
					b.Logf("%s's sidecar: %s", n.agent.Name, strings.TrimSpace(line))
				}
			}
		}
	}
	var again stepLine
	testenv.Eventually(b, 5*time.Minute, "a step at world 2", func() error {
		for _, l := range steps(a.agent.Output()[before:]) {
			if l.world == 2 {
				again = l
				return nil
			}
		}
		return fmt.Errorf("none yet")
	})
	return lossResult{again: again.at.Sub(killed), redone: max(0, done-restored), step: times[len(times)/2]}
}

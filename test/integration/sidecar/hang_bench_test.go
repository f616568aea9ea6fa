package sidecar_test

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

// BenchmarkHangRecovery (`make bench-hang`): a worker of a two-agent job frozen with SIGSTOP (alive, its pod's lease
// renewed, the other rank blocked in its next all_reduce; gloo, steps of 0.2 s), and the seconds from the freeze until
// both agents train again: on the elastic-training backend at the default hang timeout (the larger of 60 s and ten
// median steps: 60 s here) and on torch's own c10d backend through the same sidecar's store (torch finds it when
// gloo's collective times out: 30 minutes), in the same run, bounded at BENCH_HANG_BOUND_SECONDS (default 180).
// BENCH_HANG_SUITE picks the trainer root filesystem (default forky, torch 2.14). Timing never fails it.
func BenchmarkHangRecovery(b *testing.B) {
	bound := 180 * time.Second
	if v := os.Getenv("BENCH_HANG_BOUND_SECONDS"); v != "" {
		n, err := time.ParseDuration(v + "s")
		if err != nil {
			b.Fatalf("BENCH_HANG_BOUND_SECONDS=%q: %v", v, err)
		}
		bound = n
	}
	suite := testenv.SuiteForky
	if v := os.Getenv("BENCH_HANG_SUITE"); v != "" {
		suite = v
	}
	tr := newTrainer(b, suite)
	fmt.Printf("   torch %s; a worker frozen with SIGSTOP, 2 agents, gloo, 0.2 s steps; bound %s\n", tr.version, bound)
	own, ownOK := hangRecovery(b, tr, constants.BackendElasticTraining, bound)
	torch, torchOK := hangRecovery(b, tr, constants.BackendC10d, bound)
	show := func(d time.Duration, ok bool) string {
		if !ok {
			return fmt.Sprintf("not recovered within %s", bound)
		}
		return fmt.Sprintf("training again %.1f s after the freeze", d.Seconds())
	}
	fmt.Printf("   elastic-training backend, default hang timeout: %s\n", show(own, ownOK))
	fmt.Printf("   torch's c10d backend (its own timeouts):         %s\n", show(torch, torchOK))
	if ownOK {
		b.ReportMetric(own.Seconds(), "own-s")
	}
	if torchOK {
		b.ReportMetric(torch.Seconds(), "torch-s")
	}
}

// hangRecovery runs the job on backend, freezes one worker once both train, and returns how long until both agents'
// workers train again (false: not within bound).
func hangRecovery(b *testing.B, tr trainer, backend string, bound time.Duration) (time.Duration, bool) {
	b.Helper()
	run := "bench-hang-" + backend
	o := newOwnRdzv(b, tr, run, "2")
	if backend == constants.BackendC10d {
		o.args = testenv.TorchrunArgs(constants.BackendC10d, o.s.C10d, run, "2", "--rdzv_conf=join_timeout=60")
	}
	o.args = append(slices.DeleteFunc(slices.Clone(o.args), func(a string) bool { return a == "--max_restarts=5" }), "--max_restarts=0")
	a, c, before, frozen := o.freezeOne(b, run)
	for time.Since(frozen) < bound {
		again := true
		for i, n := range []node{a, c} {
			if _, worlds, _ := workers(n.agent.Output(), before[i]); len(worlds) == 0 || len(stepRe.FindAllString(n.agent.Output()[before[i]:], -1)) == 0 {
				again = false
			}
		}
		if again {
			return time.Since(frozen), true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return bound, false
}

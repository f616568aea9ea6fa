// Package checkpoint_test measures what in-memory checkpoints cost a training loop (docs/checkpoints.md), against
// torch's documented ways in the same run: `make bench-checkpoint`.
//
//   - BenchmarkCheckpointSave: two ranks of real torchrun (torch 2.14 and 2.6, the trainer root filesystems), a
//     replicated state of 64 MiB and 512 MiB (BENCH_CHECKPOINT_SIZES_MIB: more, e.g. 64,512,2048), steps of 1 s of
//     compute (BENCH_STEP_SECONDS; a save's background write overlaps the next step's): the time a save holds the
//     loop, median of 5 steps, for elastic_training.checkpoint.save into a memory-backed directory, and
//     dcp.save, dcp.async_save and rank 0's torch.save into a directory on disk (the job volume's stand-in: local disk,
//     faster than any network volume). Goal: the stall <= 10 % of dcp.save's (PASS/MISS printed; timing never fails).
package checkpoint_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

var benchLine = regexp.MustCompile(`BENCH way=(\S+) bytes=(\d+) torch=(\S+) world=\d+ stall_ms_median=([\d.]+) stall_ms_max=([\d.]+)`)

func BenchmarkCheckpointSave(b *testing.B) {
	sizes := testenv.Knob(b, "BENCH_CHECKPOINT_SIZES_MIB", []int{64, 512}, testenv.Ints)
	script, err := filepath.Abs("testdata/save_bench.py")
	if err != nil {
		b.Fatal(err)
	}
	python := filepath.Join(testenv.RepoRoot(), "internal", "trainerpy", "python")
	for _, suite := range []string{testenv.SuiteForky, testenv.SuiteTrixie} {
		root := testenv.Rootfs(b, suite)
		for _, mib := range sizes {
			b.Run(fmt.Sprintf("%s/%dMiB", suite, mib), func(b *testing.B) {
				mem, err := os.MkdirTemp("/dev/shm", "bench-checkpoint-")
				if err != nil {
					b.Fatal(err)
				}
				defer os.RemoveAll(mem)
				disk := b.TempDir()
				port := testenv.FreePort(b)
				cmd := testenv.InRootfs(root, "/usr/bin/torchrun", "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
					fmt.Sprintf("--rdzv-endpoint=127.0.0.1:%d", port), "--local-addr=127.0.0.1", script)
				cmd.Env = testenv.TorchEnv("PYTHONPATH="+python, fmt.Sprintf("BENCH_STATE_BYTES=%d", mib<<20),
					"BENCH_MEM_DIR="+mem, "BENCH_DISK_DIR="+disk)
				p := testenv.Start(b, "torchrun", cmd)
				if err := p.Wait(b, 20*time.Minute); err != nil {
					b.Fatalf("torchrun: %v\n%s", err, p.Output())
				}
				stall := map[string]float64{}
				torch := ""
				for _, m := range benchLine.FindAllStringSubmatch(p.Output(), -1) {
					stall[m[1]], _ = strconv.ParseFloat(m[4], 64)
					torch = m[3]
					fmt.Printf("torch %s, %d MiB: %-28s stall %8.1f ms median, %8.1f ms max\n", m[3], mib, m[1], stall[m[1]], mustFloat(m[5]))
				}
				ours, base := stall["elastic_training.checkpoint"], stall["dcp.save"]
				if base == 0 {
					b.Fatalf("no dcp.save figure:\n%s", p.Output())
				}
				verdict := "PASS"
				if ours > base/10 {
					verdict = "MISS"
				}
				fmt.Printf("torch %s, %d MiB: elastic_training.checkpoint's stall is %.1f %% of dcp.save's to disk (goal <= 10 %%): %s\n", torch, mib, 100*ours/base, verdict)
				b.ReportMetric(ours, "stall-ms")
				b.ReportMetric(ours/base, "stall/dcp.save")
			})
		}
	}
}

func mustFloat(s string) float64 {
	f, _ := strconv.ParseFloat(s, 64)
	return f
}

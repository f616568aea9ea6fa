// Package progress benchmarks what elastic_training.progress costs a training loop per step: the trainer's Python
// (standard library only: the host's python3) sends to a reader of the sidecar's kind (internal/progress parsing
// every datagram), against an empty Python function call in the same run.
package progress

import (
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/elastic-training/elastic-training/internal/progress"
)

const calls = 200_000

// BenchmarkProgressCall: on pod networking (UDP on loopback) and on host networking (a Unix datagram socket, as
// the webhook sets ET_PROGRESS_ADDR=unix:<path> there).
func BenchmarkProgressCall(b *testing.B) {
	b.Run("udp", func(b *testing.B) {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer pc.Close()
		benchProgress(b, pc, pc.LocalAddr().String())
	})
	b.Run("unixgram", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), "progress.sock")
		pc, err := net.ListenPacket("unixgram", path)
		if err != nil {
			b.Fatal(err)
		}
		defer pc.Close()
		benchProgress(b, pc, "unix:"+path)
	})
}

func benchProgress(b *testing.B, pc net.PacketConn, addr string) {
	var heard, bad atomic.Int64
	go func() {
		buf := make([]byte, progress.MaxUpdate+1)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if _, err := progress.ParseUpdate(buf[:n]); err != nil {
				bad.Add(1)
			}
			heard.Add(1)
		}
	}()
	pkg, err := filepath.Abs("../../../internal/trainerpy/python")
	if err != nil {
		b.Fatal(err)
	}
	script := fmt.Sprintf(`
import os, sys, time
sys.path.insert(0, %q)
os.environ["ET_PROGRESS_ADDR"], os.environ["RANK"] = %q, "3"
import elastic_training
def noop(step, total=None):
    pass
for name, f in (("noop", noop), ("progress", elastic_training.progress)):
    t = time.perf_counter()
    for i in range(%d):
        f(i, %d)
    print(name, (time.perf_counter() - t) / %d * 1e6)
`, pkg, addr, calls, calls, calls)
	for range b.N {
		heard.Store(0)
		out, err := exec.Command("python3", "-c", script).CombinedOutput()
		if err != nil {
			b.Fatalf("python3: %v\n%s", err, out)
		}
		us := map[string]float64{}
		for _, l := range strings.Split(string(bytes.TrimSpace(out)), "\n") {
			f := strings.Fields(l)
			if len(f) == 2 {
				us[f[0]], _ = strconv.ParseFloat(f[1], 64)
			}
		}
		b.ReportMetric(us["progress"], "us/progress-call")
		b.ReportMetric(us["noop"], "us/empty-call")
		fmt.Printf("elastic_training.progress to %s: %.1f us a call (an empty Python call: %.2f us, ratio %.0f); the reader heard %d of %d (%d refused)\n",
			pc.LocalAddr().Network(), us["progress"], us["noop"], us["progress"]/max(us["noop"], 1e-9), heard.Load(), calls, bad.Load())
	}
}

package sidecar_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

// The sidecar's etcd APIs vs Debian's etcd 3.4 --enable-v2.

// BenchmarkV2Ops: sequential v2 requests as python-etcd sends them (form PUT
// with a TTL, then GET), sidecar vs etcd 3.4, both with default durability.
func BenchmarkV2Ops(b *testing.B) {
	n := 2000 * b.N
	fmt.Printf("== etcd v2 API request latency (%d sequential PUT ttl=10 + GET pairs over one keep-alive connection)\n", n)
	measure := func(s *server) time.Duration {
		c := &http.Client{}
		t0 := time.Now()
		for i := range n {
			key := fmt.Sprintf("%s/v2/keys/bench/k%d", s.clientURL, i%50)
			req, _ := http.NewRequest("PUT", key, strings.NewReader("value=v&ttl=10"))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			resp, err := c.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			resp, err = c.Get(key)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return time.Since(t0) / time.Duration(n)
	}
	ss, sr := startSidecar(b), startEtcd34(b)
	defer ss.Stop(grace)
	defer sr.Stop(grace)
	side, ref := measure(ss), measure(sr)
	fmt.Printf("   sidecar %s per PUT+GET | etcd 3.4 %s per PUT+GET | ratio %.2f\n\n",
		side.Round(time.Microsecond), ref.Round(time.Microsecond), side.Seconds()/ref.Seconds())
	b.ReportMetric(side.Seconds()*1e6, "sidecar-us")
	b.ReportMetric(ref.Seconds()*1e6, "etcd34-us")
	b.ReportMetric(side.Seconds()/ref.Seconds(), "ratio")
}

// backends are torch's rendezvous backends that the sidecar serves as etcd
// 3.4 would (c10d: store_test.go).
var backends = []string{"etcd-v2", "etcd"}

// BenchmarkRendezvousOnly: the probe's rendezvous on long-lived servers,
// with a fresh run id per repetition.
func BenchmarkRendezvousOnly(b *testing.B) {
	fmt.Println("== first rendezvous of 4 torch agents, rendezvous only (real torch handlers + python-etcd, imports excluded; slowest agent)")
	for _, backend := range backends {
		b.Run(backend, func(b *testing.B) {
			reps := knob(b, "PROBE_REPS", 9, count) * b.N
			times := map[*server][]time.Duration{}
			ss, sr := startSidecar(b), startEtcd34(b)
			for r := range reps {
				for _, s := range alternate(r, ss, sr) {
					times[s] = append(times[s], probeRendezvous(b, s, backend, fmt.Sprintf("probe-%s-%d", backend, r)))
				}
			}
			ss.Stop(grace)
			sr.Stop(grace)
			compare(b, backend, "%6.3fs", times[ss], times[sr])
		})
	}
	fmt.Println()
}

// probeRendezvous runs 4 probe agents (testdata/rdzv_probe.py) that import
// torch first, then starts them together and returns the slowest agent's
// next_rendezvous() time.
func probeRendezvous(b *testing.B, s *server, backend, runID string) time.Duration {
	b.Helper()
	script, err := filepath.Abs("testdata/rdzv_probe.py")
	if err != nil {
		b.Fatal(err)
	}
	goFile := filepath.Join(b.TempDir(), runID+".go")
	var ps []*testenv.Proc
	for i := range 4 {
		ps = append(ps, startTorch(b, fmt.Sprintf("%s-probe%d", runID, i), nil, "/usr/bin/python3", script, backend,
			strings.TrimPrefix(s.clientURL, "http://"), runID, "4", goFile))
	}
	for _, p := range ps {
		testenv.WaitOutput(b, p, "READY", 120*time.Second)
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	var worst time.Duration
	for _, p := range ps {
		testenv.WaitOutput(b, p, "RDZV ", 300*time.Second)
		out := p.Output()
		var secs float64
		if _, err := fmt.Sscanf(out[strings.Index(out, "RDZV "):], "RDZV %f", &secs); err != nil {
			b.Fatalf("%s: %s", p.Name, out)
		}
		if d := time.Duration(secs * float64(time.Second)); d > worst {
			worst = d
		}
	}
	if err := os.WriteFile(goFile+".done", nil, 0o644); err != nil {
		b.Fatal(err)
	}
	for _, p := range ps {
		select {
		case <-p.Done():
		case <-time.After(30 * time.Second):
			p.Stop(grace)
		}
	}
	return worst
}

// BenchmarkTorchrun: first rendezvous of real torchrun agents, on a fresh
// server of each kind per repetition.
func BenchmarkTorchrun(b *testing.B) {
	fmt.Println("== first rendezvous of 4 torchrun agents (--nnodes=4, agent start → every worker done with all_reduce)")
	for _, backend := range backends {
		b.Run(backend, func(b *testing.B) {
			reps := knob(b, "REPS", 3, count) * b.N
			times := map[string][]time.Duration{}
			for r := range reps {
				for _, which := range alternate(r, "sidecar", "etcd34") {
					var s *server
					if which == "sidecar" {
						s = startSidecar(b)
					} else {
						s = startEtcd34(b)
					}
					d := firstRendezvous(b, strings.TrimPrefix(s.clientURL, "http://"), backend, fmt.Sprintf("bench-%d", r))
					s.Stop(grace)
					times[which] = append(times[which], d)
				}
			}
			compare(b, backend, "%6.2fs", times["sidecar"], times["etcd34"])
		})
	}
	fmt.Println()
}

// compare prints and reports the medians of the sidecar's times and etcd
// 3.4's, each formatted with secFormat, and their ratio.
func compare(b *testing.B, backend, secFormat string, side, ref []time.Duration) {
	ms, mr := testenv.Median(side), testenv.Median(ref)
	fmt.Printf("   %-8s sidecar median "+secFormat+" %v | etcd 3.4 median "+secFormat+" %v | ratio %.2f (goal ≤ 1.0)\n",
		backend, ms.Seconds(), secs(side), mr.Seconds(), secs(ref), ms.Seconds()/mr.Seconds())
	b.ReportMetric(ms.Seconds(), "sidecar-s")
	b.ReportMetric(mr.Seconds(), "etcd34-s")
	b.ReportMetric(ms.Seconds()/mr.Seconds(), "ratio")
}

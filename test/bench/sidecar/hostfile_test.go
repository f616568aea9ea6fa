package sidecar_test

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/elastic-training/elastic-training/internal/hostfile"
	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

// The members and their hostfile: no baseline but the goals.

// BenchmarkHostfileLatency: a `join --register=false --files-dir` process
// keeps a hostfile; each change registers or deregisters one member exactly
// as `join` does (lease + put, revoke) and waits for the file to change.
func BenchmarkHostfileLatency(b *testing.B) {
	changes := knob(b, "CHANGES", 200, count) * b.N
	fmt.Printf("== hostfile rewrite latency after a join or leave (%d changes, separate join process writing the files)\n", changes)
	files := b.TempDir()
	s := startSidecar(b)
	defer s.Stop(grace)
	jhealth := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(b))
	j := testenv.Start(b, "join", exec.Command(sidecarBin, "join", "--endpoints="+s.clientURL,
		"--register=false", "--files-dir="+files, "--health-addr="+jhealth))
	defer j.Stop(grace)
	testenv.WaitHTTP(b, j, "http://"+jhealth+"/readyz", http.StatusOK, 60*time.Second)
	cli := v3client(b, s.clientURL)
	ctx := b.Context()
	// Three permanent members so the file always exists.
	for i := range 3 {
		m := membership.Member{Host: fmt.Sprintf("base-%d.job.ns.svc", i), Slots: 1, Group: "worker", Index: i}
		if _, err := cli.Put(ctx, membership.Key("/elastic-training/members/", m.Host), membership.Encode(m)); err != nil {
			b.Fatal(err)
		}
	}
	hf := filepath.Join(files, "hostfile")
	waitFile(b, hf, func(s string) bool { return strings.Count(s, "\n") == 3 }, 10*time.Second)
	var lat []time.Duration
	var lease clientv3.LeaseID
	m := membership.Member{Host: "moving.job.ns.svc", Slots: 2, Group: "worker", Index: 9}
	for i := range changes {
		t0 := time.Now()
		join := i%2 == 0
		if join {
			g, err := cli.Grant(ctx, 5)
			if err != nil {
				b.Fatal(err)
			}
			lease = g.ID
			_, err = cli.Put(ctx, membership.Key("/elastic-training/members/", m.Host), membership.Encode(m), clientv3.WithLease(lease))
			if err != nil {
				b.Fatal(err)
			}
		} else if _, err := cli.Revoke(ctx, lease); err != nil {
			b.Fatal(err)
		}
		waitFile(b, hf, func(s string) bool { return strings.Contains(s, m.Host) == join }, 10*time.Second)
		lat = append(lat, time.Since(t0))
	}
	fmt.Printf("   p50 %s  p99 %s  max %s (goal p99 ≤ 200ms)\n\n", pct(lat, 0.5).Round(10*time.Microsecond),
		pct(lat, 0.99).Round(10*time.Microsecond), pct(lat, 1).Round(10*time.Microsecond))
	b.ReportMetric(ms(pct(lat, 0.5)), "p50-ms")
	b.ReportMetric(ms(pct(lat, 0.99)), "p99-ms")
	b.ReportMetric(ms(pct(lat, 1)), "max-ms")
}

// BenchmarkScale registers N members, each with its own lease kept alive (as
// N join processes would), in a serve that also writes the files in-process.
func BenchmarkScale(b *testing.B) {
	n := knob(b, "MEMBERS", 1000, count)
	fmt.Printf("== %d registered members\n", n)
	members := make([]membership.Member, n)
	for i := range members {
		members[i] = membership.Member{Host: fmt.Sprintf("job-worker-%d.job.default.svc.cluster.local", i), Slots: 8, Group: "worker", Index: i}
	}
	render := renderTime(b, members)
	fmt.Printf("   hostfile render (Open MPI, %d hosts): %s per render (goal ≤ 10ms)\n", n, render)

	files := b.TempDir()
	s := startSidecar(b, "--files-dir="+files, "--register=false")
	defer s.Stop(grace)
	time.Sleep(2 * time.Second) // settle after start
	pid := s.Cmd.Process.Pid
	idle := rssMiB(b, pid)
	cli := v3client(b, s.clientURL)
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	errs := make(chan error, len(members))
	for _, m := range members {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs <- register(ctx, cli, m)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	hf := filepath.Join(files, "hostfile")
	t0 := time.Now()
	waitFile(b, hf, func(s string) bool { return strings.Count(s, "\n") == n }, 60*time.Second)
	written := time.Since(t0)
	fmt.Printf("   hostfile with all %d members written %s after the last registration\n", n, written.Round(time.Millisecond))
	// Keep-alives run for a while so the server's steady state is measured.
	time.Sleep(12 * time.Second)
	full, peak := rssMiB(b, pid), statusMiB(b, pid, "VmHWM")
	fmt.Printf("   serve RSS: idle %.1f MiB, with %d members kept alive %.1f MiB, peak (VmHWM) %.1f MiB (goal ≤ 64 MiB)\n",
		idle, n, full, peak)
	b.ReportMetric(ms(render), "render-ms")
	b.ReportMetric(ms(written), "written-ms")
	b.ReportMetric(full, "rss-MiB")
	b.ReportMetric(peak, "peak-rss-MiB")
}

// renderTime is the mean time of one Open MPI hostfile render of members,
// over renders for about a second (as testing.Benchmark measures it, whatever
// -benchtime says).
func renderTime(b *testing.B, members []membership.Member) time.Duration {
	n := 0
	t0 := time.Now()
	for time.Since(t0) < time.Second {
		if _, err := hostfile.Render(hostfile.OpenMPI, members); err != nil {
			b.Fatal(err)
		}
		n++
	}
	return time.Since(t0) / time.Duration(n)
}

// register registers m as `join` does, with a lease that ctx keeps alive.
func register(ctx context.Context, cli *clientv3.Client, m membership.Member) error {
	g, err := cli.Grant(ctx, 10)
	if err != nil {
		return err
	}
	if _, err := cli.Put(ctx, membership.Key("/elastic-training/members/", m.Host), membership.Encode(m), clientv3.WithLease(g.ID)); err != nil {
		return err
	}
	ka, err := cli.KeepAlive(ctx, g.ID)
	if err != nil {
		return err
	}
	go func() {
		for range ka {
		}
	}()
	return nil
}

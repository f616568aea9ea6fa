package sidecar_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/etcdclient"
	"github.com/elastic-training/elastic-training/internal/hostfile"
	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/sidecar"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/testenv/etcdtest"
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
	cli := etcdtest.Client(b, s.clientURL)
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

// BenchmarkScale: N members, each registered and kept by its own
// sidecar.Join (what every pod's `rdzv-sidecar join` runs: its own etcd
// client, lease, membership watch and hostfile), run in this process because
// N join processes would not fit here, against one serve that also writes
// the files. It measures the time until every hostfile lists all N, how long
// one change (a member leaves, then joins again) takes to reach every
// hostfile, and serve's (the embedded etcd's) RSS. N is 500 by default: with
// 1,000 the joiners, each rewriting a file of N hosts at every change on this
// one machine (on a cluster each on its own node), did not list everyone
// within 5 minutes.
func BenchmarkScale(b *testing.B) {
	n := knob(b, "MEMBERS", 500, count)
	changes := knob(b, "MEMBER_CHANGES", 40, count)
	raiseNoFile(b)
	fmt.Printf("== %d members, each registered by its own join (in this process), each keeping its own hostfile\n", n)
	members := make([]membership.Member, n)
	for i := range members {
		members[i] = membership.Member{Host: fmt.Sprintf("job-worker-%d.job.default.svc.cluster.local", i), Slots: 8, Group: "worker", Index: i}
	}
	render := renderTime(b, members)
	fmt.Printf("   hostfile render (Open MPI, %d hosts): %s per render (goal ≤ 10ms)\n", n, render)

	s := startSidecar(b, "--files-dir="+b.TempDir(), "--register=false")
	b.Cleanup(func() { s.Stop(grace) }) // after the joiners' cleanups: they deregister from it
	time.Sleep(2 * time.Second)         // settle after start
	pid := s.Cmd.Process.Pid
	idle := rssMiB(b, pid)
	joins := make([]*joiner, n)
	t0 := time.Now()
	for i, m := range members {
		joins[i] = startJoin(b, s.clientURL, m)
	}
	waitHostfiles(b, joins, func(c string) bool { return strings.Count(c, "\n") == n }, 5*time.Minute)
	listed := time.Since(t0)
	fmt.Printf("   every hostfile lists all %d members %s after the first join started\n", n, listed.Round(time.Millisecond))

	// One member leaves (its join stops and deregisters), then joins again:
	// each is one change, timed until the last hostfile has it.
	var lat []time.Duration
	for c := range changes {
		k := (c * 37) % n
		host := members[k].Host
		others := slices.Concat(joins[:k], joins[k+1:])
		t := time.Now()
		joins[k].stop()
		waitHostfiles(b, others, func(c string) bool { return !strings.Contains(c, host+" ") }, time.Minute)
		lat = append(lat, time.Since(t))
		t = time.Now()
		joins[k] = startJoin(b, s.clientURL, members[k])
		waitHostfiles(b, joins, func(c string) bool { return strings.Contains(c, host+" ") }, time.Minute)
		lat = append(lat, time.Since(t))
	}
	fmt.Printf("   one change reaching all %d hostfiles (%d changes): p50 %s p99 %s max %s\n", n, len(lat),
		pct(lat, 0.5).Round(time.Millisecond), pct(lat, 0.99).Round(time.Millisecond), pct(lat, 1).Round(time.Millisecond))
	full, peak := rssMiB(b, pid), statusMiB(b, pid, "VmHWM")
	fmt.Printf("   serve RSS: idle %.1f MiB, with %d members kept alive %.1f MiB, peak (VmHWM) %.1f MiB (the serve container's memory limit: 512 MiB)\n",
		idle, n, full, peak)
	for _, j := range joins {
		j.stop()
	}
	b.ReportMetric(ms(render), "render-ms")
	b.ReportMetric(listed.Seconds(), "listed-s")
	b.ReportMetric(ms(pct(lat, 0.99)), "change-p99-ms")
	b.ReportMetric(full, "rss-MiB")
	b.ReportMetric(peak, "peak-rss-MiB")
}

// joiner is one running sidecar.Join and the hostfile it keeps.
type joiner struct {
	hostfile string
	stop     func() // ends it; on return it has deregistered
	seen     os.FileInfo
}

func startJoin(b *testing.B, endpoints string, m membership.Member) *joiner {
	b.Helper()
	dir := b.TempDir()
	ctx, cancel := context.WithCancel(b.Context())
	done := make(chan error, 1)
	go func() {
		done <- sidecar.Join(ctx, sidecar.JoinConfig{
			Options: sidecar.Options{Log: slog.New(slog.DiscardHandler), Member: sidecar.MemberConfig{
				Prefix: constants.MembersPrefix, Register: true, Member: m, LeaseTTL: 5 * time.Second,
				FilesDir: dir, Flavour: hostfile.OpenMPI}},
			Client: etcdclient.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second},
		})
	}()
	stop := sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("join %s: %v", m.Host, err)
		}
	})
	b.Cleanup(stop)
	return &joiner{hostfile: filepath.Join(dir, constants.HostfileName), stop: stop}
}

// waitHostfiles waits until ok holds for every joiner's hostfile. A file is
// read again only once its size or modification time changed (the files are
// replaced whole), so that a thousand of them can be polled every 10 ms.
func waitHostfiles(b *testing.B, js []*joiner, ok func(string) bool, timeout time.Duration) {
	b.Helper()
	pending := slices.Clone(js)
	for _, j := range pending {
		j.seen = nil
	}
	err := testenv.Poll(b.Context(), timeout, 10*time.Millisecond, func(context.Context) (bool, error) {
		pending = slices.DeleteFunc(pending, func(j *joiner) bool {
			fi, err := os.Stat(j.hostfile)
			if err != nil || (j.seen != nil && fi.Size() == j.seen.Size() && fi.ModTime().Equal(j.seen.ModTime())) {
				return false
			}
			j.seen = fi
			c, _ := os.ReadFile(j.hostfile)
			return ok(string(c))
		})
		return len(pending) == 0, nil
	})
	if err != nil {
		b.Fatalf("%d of %d hostfiles not as expected after %s (first: %s)", len(pending), len(js), timeout, pending[0].hostfile)
	}
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

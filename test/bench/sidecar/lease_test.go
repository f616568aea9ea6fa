package sidecar_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/membership/etcdmembers"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/testenv/etcdtest"
)

// BenchmarkLeaseTTL answers what a member lease's TTL costs when a node is lost, and whether a shorter one holds
// under load (issue 51). For each TTL: a serving sidecar and BENCH_SIDECAR_LEASE_MEMBERS (8) join sidecars, real
// processes, each in a CPU cgroup weighted as the kubelet weights the webhook's requests for them (50m serving, 10m
// the others), beside busy loops (two per core: a trainer and its data loaders) in a cgroup weighted as a trainer that
// requests every core; the machine is saturated the whole run. Every lease lost in the first
// BENCH_SIDECAR_LEASE_SECONDS (60) is a false node loss (in a job: every worker restarted, twice, as the member leaves
// and comes back). Then BENCH_SIDECAR_LEASE_STOPS (6) times a member is frozen (SIGSTOP: a node that stops answering,
// without the connection reset a killed process sends) and the time until its key is gone is what the lost node costs
// the survivors before their round re-forms. The join renews its lease every TTL/3, on the etcd client's 0.5 s ticks;
// the server checks for expired leases every 0.5 s. Run it with `make bench-lease`.
func BenchmarkLeaseTTL(b *testing.B) {
	members := knob(b, "LEASE_MEMBERS", 8, count)
	window := time.Duration(knob(b, "LEASE_SECONDS", 60, count)) * time.Second
	stops := knob(b, "LEASE_STOPS", 6, count)
	ttls := []int{2, 3, 5}
	cores := numCPU()
	hogs := testenv.CPUCgroup(b, int64(cores)*1000)
	for i := range 2 * cores {
		testenv.Start(b, fmt.Sprintf("busy%d", i), inCgroup(hogs, "/bin/sh", "-c", "while :; do :; done"))
	}
	type row struct {
		ttl    int
		lost   int
		under  time.Duration
		detect []time.Duration
	}
	var rows []row
	for range b.N {
		for _, ttl := range ttls {
			lost, under, detect := leaseRun(b, ttl, members, window, stops)
			rows = append(rows, row{ttl, lost, under, detect})
		}
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\nmember leases under load: %d join sidecars (10m CPU each) and serve (50m) beside %d busy loops weighted as a trainer requesting %d cores, this machine's %d cores saturated\n",
		members, 2*cores, cores, cores)
	fmt.Fprintf(&out, "%-5s  %-32s  %-36s\n", "TTL", "leases lost under load", "frozen member -> its key gone (s)")
	fmt.Fprintf(&out, "%-5s  %-32s  %-36s\n", "", "(false node losses)", "min / median / max")
	for _, r := range rows {
		slices.Sort(r.detect)
		fmt.Fprintf(&out, "%-5s  %-32s  %.1f / %.1f / %.1f\n", fmt.Sprintf("%ds", r.ttl),
			fmt.Sprintf("%d in %.0f member-minutes", r.lost, r.under.Minutes()),
			r.detect[0].Seconds(), r.detect[len(r.detect)/2].Seconds(), r.detect[len(r.detect)-1].Seconds())
	}
	fmt.Print(out.String())
}

// leaseRun runs one TTL's job: the leases lost in window, and the detection time of each of stops frozen members.
// The member-time under load counts every member, the frozen ones included.
func leaseRun(b *testing.B, ttl, members int, window time.Duration, stops int) (int, time.Duration, []time.Duration) {
	b.Helper()
	s := startSidecarIn(b, testenv.CPUCgroup(b, 50))
	defer s.Stop(grace)
	cli := etcdtest.Client(b, s.clientURL)
	ctx := b.Context()
	wr, err := cli.Get(ctx, "/", clientv3.WithLimit(1))
	if err != nil {
		b.Fatal(err)
	}
	events := cli.Watch(ctx, constants.MembersPrefix, clientv3.WithPrefix(), clientv3.WithRev(wr.Header.Revision+1))
	var joins []*testenv.Proc
	hosts := make([]string, members)
	for i := range members {
		hosts[i] = fmt.Sprintf("w%d.lease-ttl-%ds.ns.svc", i, ttl)
		health := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(b))
		p := testenv.Start(b, "join "+hosts[i], inCgroup(testenv.CPUCgroup(b, 10), sidecarBin, "join",
			"--endpoints="+s.clientURL, "--health-addr="+health, "--member-host="+hosts[i], "--member-slots=1",
			fmt.Sprintf("--lease-ttl=%ds", ttl)))
		defer p.Stop(grace)
		testenv.WaitHTTP(b, p, "http://"+health+"/readyz", http.StatusOK, 60*time.Second)
		joins = append(joins, p)
	}
	// await reads the members' events until want(event) has held for every host in hosts, or fails after limit;
	// every other DELETE is a lease lost under load.
	lost := 0
	await := func(hosts []string, put bool, limit time.Duration) time.Time {
		left := map[string]bool{}
		for _, h := range hosts {
			left[membership.Key(constants.MembersPrefix, h)] = true
		}
		deadline := time.After(limit)
		for {
			select {
			case wr, ok := <-events:
				if !ok || wr.Err() != nil {
					b.Fatalf("watch of the members ended: %v", wr.Err())
				}
				for _, ev := range wr.Events {
					key, isPut := string(ev.Kv.Key), ev.Type == clientv3.EventTypePut
					switch {
					case left[key] && isPut == put:
						delete(left, key)
					case !isPut:
						lost++
						b.Logf("TTL %ds: %s lost its lease under load", ttl, key)
					}
				}
				if len(hosts) > 0 && len(left) == 0 {
					return time.Now()
				}
			case <-deadline:
				if len(hosts) == 0 {
					return time.Now()
				}
				b.Fatalf("no %s of %v within %s", map[bool]string{true: "put", false: "delete"}[put], left, limit)
			}
		}
	}
	await(hosts, true, 30*time.Second) // the registrations: the watch started before the first
	t0 := time.Now()
	await(nil, false, window) // the load: nothing should happen
	var detect []time.Duration
	for k := range stops {
		i := k % members
		// Not a wait for anything: the freeze lands at a different point of the member's renewal cycle each time (a
		// crash comes at any point of it), which nothing outside the member can observe to wait on.
		time.Sleep(time.Duration(k) * 170 * time.Millisecond)
		frozen := time.Now()
		joins[i].Signal(syscall.SIGSTOP)
		gone := await(hosts[i:i+1], false, time.Duration(ttl)*time.Second+30*time.Second)
		detect = append(detect, gone.Sub(frozen))
		joins[i].Signal(syscall.SIGCONT)
		await(hosts[i:i+1], true, time.Duration(ttl)*time.Second+30*time.Second) // registered again
	}
	return lost, time.Duration(members) * time.Since(t0), detect
}

// BenchmarkLeaseRenewals answers what a short member lease costs the serving sidecar at the scale of real jobs
// (issue 51): BENCH_SIDECAR_RENEWAL_MEMBERS (1,024) members, each with its own etcd client and registration as every
// pod's join has (its lease renewed every TTL/3 on the client's 0.5 s ticks), are kept at each TTL in turn. The
// serving sidecar runs in a CPU cgroup weighted as the webhook's request for it (50m). Its CPU over
// BENCH_SIDECAR_RENEWAL_SECONDS (20) of steady state is printed against the 5 s lease's, same run; then, for as long
// again, busy loops weighted as a trainer that requests every core saturate the machine, and every lease lost
// meanwhile (a member registered again) is a false node loss. The members run in this process (a thousand join
// processes would not fit here), outside those cgroups, so that what starves is the server, as on a node whose
// trainer uses every core. Run it with `make bench-lease`.
func BenchmarkLeaseRenewals(b *testing.B) {
	n := knob(b, "RENEWAL_MEMBERS", 1024, count)
	window := time.Duration(knob(b, "RENEWAL_SECONDS", 20, count)) * time.Second
	raiseNoFile(b)
	ttls := []int{2, 3, 5}
	type result struct {
		idle, loaded float64 // serve's CPU, cores
		lost         int
	}
	got := map[int]result{}
	for range b.N {
		for _, ttl := range ttls {
			idle, loaded, lost := renewalRun(b, n, time.Duration(ttl)*time.Second, window)
			got[ttl] = result{idle, loaded, lost}
		}
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\nthe serving sidecar (50m) while %d members keep their leases (each its own client), %s each\n", n, window)
	fmt.Fprintf(&out, "%-5s  %-18s  %-12s  %-26s  %s\n", "TTL", "serve CPU (cores)", "against 5 s", "saturated: serve got", "leases lost when saturated")
	for _, ttl := range ttls {
		r := got[ttl]
		fmt.Fprintf(&out, "%-5s  %-18.3f  %-12s  %-26s  %d\n", fmt.Sprintf("%ds", ttl), r.idle, fmt.Sprintf("%.2fx", r.idle/got[5].idle),
			fmt.Sprintf("%.3f cores", r.loaded), r.lost)
		b.ReportMetric(r.idle, fmt.Sprintf("cores-ttl-%ds", ttl))
		b.ReportMetric(float64(r.lost), fmt.Sprintf("lost-ttl-%ds", ttl))
	}
	fmt.Print(out.String())
}

// renewalRun starts a serving sidecar that watches the membership (as a serving pod's does), registers n members
// at ttl, and returns the server's CPU (cores) over window once every member is registered, then its CPU over
// window with the machine saturated, and the leases lost then.
func renewalRun(b *testing.B, n int, ttl, window time.Duration) (idle, loaded float64, lost int) {
	b.Helper()
	files := b.TempDir()
	s := startSidecarIn(b, testenv.CPUCgroup(b, 50), "--files-dir="+files, "--register=false")
	defer s.Stop(grace)
	ctx, cancel := context.WithCancel(b.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var registered atomic.Int64
	for i := range n {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.clientURL}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			b.Fatal(err)
		}
		reg := &etcdmembers.Registration{Client: cli, Prefix: constants.MembersPrefix, TTL: ttl, Log: slog.New(slog.DiscardHandler),
			Member:       membership.Member{Host: fmt.Sprintf("job-worker-%d.job.default.svc.cluster.local", i), Slots: 1, Group: "worker", Index: i},
			OnRegistered: func() { registered.Add(1) }}
		wg.Go(func() {
			defer cli.Close()
			if err := reg.Run(ctx); err != nil && ctx.Err() == nil {
				b.Errorf("member %d: %v", i, err)
			}
		})
	}
	err := testenv.Poll(b.Context(), 5*time.Minute, 100*time.Millisecond, func(context.Context) (bool, error) {
		return registered.Load() >= int64(n), nil
	})
	if err != nil {
		b.Fatalf("%d of %d members registered at TTL %s: %v", registered.Load(), n, ttl, err)
	}
	// Steady state: the server's own membership watch has listed every member (its hostfile has them all), so what
	// follows is renewals only.
	hostfile := filepath.Join(files, constants.HostfileName)
	err = testenv.Poll(b.Context(), time.Minute, 100*time.Millisecond, func(context.Context) (bool, error) {
		c, _ := os.ReadFile(hostfile)
		return strings.Count(string(c), "\n") == n, nil
	})
	if err != nil {
		b.Fatalf("serve's hostfile never listed all %d members: %v", n, err)
	}
	pid := s.Cmd.Process.Pid
	cpu := func() float64 {
		before, err := testenv.CPUSeconds(pid)
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		time.Sleep(window)
		after, err := testenv.CPUSeconds(pid)
		if err != nil {
			b.Fatal(err)
		}
		return (after - before) / time.Since(t0).Seconds()
	}
	idle = cpu()
	if got := registered.Load(); got != int64(n) {
		b.Errorf("TTL %s: %d leases lost on an idle machine", ttl, got-int64(n))
	}
	cores := numCPU()
	hogs := testenv.CPUCgroup(b, int64(cores)*1000)
	for i := range 2 * cores {
		p := testenv.Start(b, fmt.Sprintf("busy%d", i), inCgroup(hogs, "/bin/sh", "-c", "while :; do :; done"))
		defer p.Stop(0)
	}
	before := registered.Load()
	loaded = cpu()
	return idle, loaded, int(registered.Load() - before)
}

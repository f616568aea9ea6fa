package sidecar_test

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/elastic-training/elastic-training/internal/tcpstore"
	"github.com/elastic-training/elastic-training/internal/tcpstore/tcpstoretest"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

// torch's c10d store: the sidecar's TCPStore server (rdzv-sidecar serve
// --c10d-addr) vs torch's own, the classic server (tcpstoretest.StartTorch,
// the conformance test's, in the trainer root filesystem).

// The two c10d stores.
var storeKinds = []string{"sidecar", "torch"}

// store is a running c10d store of one of storeKinds.
type store struct {
	*testenv.Proc        // the serving process
	addr          string // host:port
}

func startStore(b *testing.B, kind string) *store {
	b.Helper()
	if kind == "sidecar" {
		s := startSidecar(b)
		return &store{Proc: s.Proc, addr: s.c10d}
	}
	// InRootfs execs every step: the process is python's.
	addr, p := tcpstoretest.StartTorchWith(b, func(args ...string) *exec.Cmd { return torchCmd(b, "/usr/bin/python3", args...) })
	return &store{Proc: p, addr: addr}
}

// BenchmarkC10dTorchrun: first rendezvous and scale-up of real torchrun
// agents, on a fresh store of each kind per repetition.
func BenchmarkC10dTorchrun(b *testing.B) {
	fmt.Println("== c10d rendezvous of real torchrun agents (--rdzv-backend=c10d, is_host=false): sidecar's store vs torch's TCPStore server")
	findTorch(b) // prints the torch version
	reps := knob(b, "REPS", 3, count) * b.N
	first := map[string][]time.Duration{}
	scale := map[string][]time.Duration{}
	for r := range reps {
		for _, kind := range alternate(r, storeKinds...) {
			s := startStore(b, kind)
			first[kind] = append(first[kind], firstRendezvous(b, s.addr, "c10d", fmt.Sprintf("first-%d", r)))
			scale[kind] = append(scale[kind], scaleUp(b, s.addr, fmt.Sprintf("scale-%d", r)))
			s.Stop(grace)
		}
	}
	for _, m := range []struct {
		what, metric string
		ds           map[string][]time.Duration
	}{
		{"first rendezvous (4 agents: start → every worker done with all_reduce)", "first", first},
		{"scale-up 2→3 (--nnodes=2:3: third agent's start → every worker at world 3)", "scale-up", scale},
	} {
		side, torch := testenv.Median(m.ds["sidecar"]), testenv.Median(m.ds["torch"])
		fmt.Printf("   %s\n      sidecar median %6.2fs %v | torch's store median %6.2fs %v | ratio %.2f\n",
			m.what, side.Seconds(), secs(m.ds["sidecar"]), torch.Seconds(), secs(m.ds["torch"]), side.Seconds()/torch.Seconds())
		b.ReportMetric(side.Seconds(), m.metric+"-sidecar-s")
		b.ReportMetric(torch.Seconds(), m.metric+"-torch-s")
		b.ReportMetric(side.Seconds()/torch.Seconds(), m.metric+"-ratio")
	}
	fmt.Println()
}

// scaleUp starts 2 agents with --nnodes=2:3 through endpoint and, once both
// workers train at world 2, a third agent: it returns the time from the
// third agent's start until every worker has trained at world 3. The
// settings are the integration test's (test/integration/sidecar,
// TestTorchrunElasticGrowShrink).
func scaleUp(b *testing.B, endpoint, runID string) time.Duration {
	b.Helper()
	args := append(testenv.TorchrunArgs("c10d", endpoint, runID, "2:3", "--rdzv_conf=last_call_timeout=2", "--max_restarts=5"), trainScript())
	env := []string{"TRAIN_STEPS=100000", "STEP_SLEEP=0.3"}
	var ps []*testenv.Proc
	startAgent := func() {
		ps = append(ps, startTorch(b, fmt.Sprintf("%s-agent%d", runID, len(ps)), env, "/usr/bin/torchrun", args...))
	}
	defer func() {
		var wg sync.WaitGroup
		for _, p := range ps {
			wg.Go(func() { p.Stop(grace) })
		}
		wg.Wait()
	}()
	startAgent()
	startAgent()
	for _, p := range ps {
		testenv.WaitOutput(b, p, "world=2 ", 5*time.Minute)
	}
	t0 := time.Now()
	startAgent()
	for _, p := range ps {
		testenv.WaitOutput(b, p, "world=3 ", 5*time.Minute)
	}
	return time.Since(t0)
}

// BenchmarkC10dLoad: the store load at each N (a sub-benchmark each),
// against one long-lived store of each kind, one after the other
// (alternating which goes first).
func BenchmarkC10dLoad(b *testing.B) {
	raiseNoFile(b)
	points := knob(b, "C10D_CONNS", []int{64, 256, 1024}, counts)
	d := knob(b, "C10D_TIME", 5*time.Second, time.ParseDuration)
	pin := knob(b, "C10D_PIN", true, strconv.ParseBool)
	fmt.Printf("== c10d store load: N connections (one goroutine each, closed loop: set+get own key, add shared counter, "+
		"wait for an existing key; %s per point): sidecar's store vs torch's classic TCPStore server\n", d)
	findTorch(b) // prints the torch version
	stores := map[string]*store{}
	for _, kind := range storeKinds {
		stores[kind] = startStore(b, kind)
		defer stores[kind].Stop(grace)
	}
	cpus := numCPU()
	defer unpin(b, pin, cpus)
	for i, n := range points {
		b.Run(fmt.Sprintf("conns=%d", n), func(b *testing.B) {
			res := map[string]loadResult{}
			for _, kind := range alternate(i, storeKinds...) {
				time.Sleep(time.Second) // the previous point's connections closed
				where := pinLoad(b, pin, stores[kind].Cmd.Process.Pid, cpus)
				if i == 0 {
					fmt.Printf("   %s: %s\n", kind, where)
				}
				res[kind] = storeLoad(stores[kind].addr, n, d)
			}
			s, t := res["sidecar"], res["torch"]
			if s.err != nil {
				b.Fatalf("sidecar's store, %d connections: %v", n, s.err)
			}
			b.ReportMetric(s.opsPerSec, "sidecar-ops/s")
			b.ReportMetric(ms(s.p99), "sidecar-p99-ms")
			line := fmt.Sprintf("   N=%-5d sidecar %s", n, s)
			if t.err != nil {
				fmt.Printf("%s | torch's server failed: %v\n", line, t.err)
				return
			}
			tr, lr := s.opsPerSec/t.opsPerSec, s.p99.Seconds()/t.p99.Seconds()
			fmt.Printf("%s | torch %s | throughput %.2fx %s (goal ≥ 1.0x), p99 %.2fx %s (goal ≤ 1.0x)\n",
				line, t, tr, goal(tr >= 1), lr, goal(lr <= 1))
			b.ReportMetric(t.opsPerSec, "torch-ops/s")
			b.ReportMetric(ms(t.p99), "torch-p99-ms")
			b.ReportMetric(tr, "throughput-ratio")
			b.ReportMetric(lr, "p99-ratio")
		})
	}
	fmt.Println()
}

// counts parses comma-separated positive whole numbers.
func counts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := count(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// BenchmarkC10dRSS: each store's RSS before and after n idle connections, on
// a fresh store.
func BenchmarkC10dRSS(b *testing.B) {
	raiseNoFile(b)
	n := knob(b, "IDLE_CONNS", 1000, count)
	fmt.Printf("== c10d store RSS with %d idle connections (each VALIDATE, then one PING answered)\n", n)
	findTorch(b) // prints the torch version
	for _, kind := range storeKinds {
		s := startStore(b, kind)
		pid := s.Cmd.Process.Pid
		time.Sleep(2 * time.Second) // settle after start
		before := rssMiB(b, pid)
		cs, err := dialMany(s.addr, n)
		if err != nil {
			s.Stop(grace)
			if kind == "sidecar" {
				b.Fatalf("sidecar's store: %v", err)
			}
			fmt.Printf("   torch's server failed: %v\n", err)
			continue
		}
		time.Sleep(2 * time.Second)
		after := rssMiB(b, pid)
		closeAll(cs)
		s.Stop(grace)
		per := (after - before) * 1000 / float64(n)
		line := fmt.Sprintf("   %-7s RSS %6.1f MiB before, %6.1f MiB with %d connections: %5.1f MiB per 1,000",
			kind, before, after, n, per)
		if kind == "sidecar" {
			line += fmt.Sprintf(" %s (goal ≤ 64 MiB)", goal(per <= 64))
		}
		fmt.Println(line)
		b.ReportMetric(per, kind+"-MiB/1000conns")
	}
	fmt.Println()
}

// taskset puts every thread of process pid on cpus (taskset's list syntax).
func taskset(b *testing.B, cpus string, pid int) {
	b.Helper()
	if out, err := exec.Command("taskset", "-a", "-pc", cpus, strconv.Itoa(pid)).CombinedOutput(); err != nil {
		b.Fatalf("taskset -a -pc %s %d: %v: %s", cpus, pid, err, out)
	}
}

// unpin gives this process every one of n CPUs again (what pinLoad took
// away).
func unpin(b *testing.B, pin bool, n int) {
	if pin && n >= 2 {
		taskset(b, fmt.Sprintf("0-%d", n-1), os.Getpid())
	}
}

// pinLoad puts the process pid (every thread of it) on the last of n CPUs
// and this process on the others; it returns a description for the report.
// n is counted before any pinning (nproc counts the CPUs a process may use).
func pinLoad(b *testing.B, pin bool, pid, n int) string {
	if !pin || n < 2 {
		return "not pinned"
	}
	last := strconv.Itoa(n - 1)
	others := fmt.Sprintf("0-%d", n-2)
	taskset(b, last, pid)
	taskset(b, others, os.Getpid())
	return fmt.Sprintf("server on CPU %s, load client on CPUs %s", last, others)
}

// raiseNoFile raises the open-files limit to 65536 (or at least to the hard
// limit), for this process and, as it is set explicitly, the servers it
// starts: 1,024 connections need as many descriptors on both ends.
func raiseNoFile(b *testing.B) {
	b.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
	want := max(lim.Max, 65536)
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: want}) != nil {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: lim.Max, Max: lim.Max}); err != nil {
			b.Fatal(err)
		}
	}
}

// dialMany opens n connections, 32 at a time; on any failure it closes
// those it opened and says how many it got.
func dialMany(addr string, n int) ([]*tcpstoretest.Client, error) {
	cs := make([]*tcpstoretest.Client, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			cs[i], errs[i] = tcpstoretest.Dial(addr)
		})
	}
	wg.Wait()
	if err := firstErr(errs); err != nil {
		ok := closeAll(cs)
		return nil, fmt.Errorf("%d of %d connections failed (first: %w)", n-ok, n, err)
	}
	return cs, nil
}

// closeAll closes every connection and returns how many there were.
func closeAll(cs []*tcpstoretest.Client) int {
	n := 0
	for _, c := range cs {
		if c != nil {
			c.Close()
			n++
		}
	}
	return n
}

func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// The load's keys: the one every WAIT finds, the counter every ADD
// increments; and the value each connection SETs (and GETs) under its own key.
const (
	readyKey   = "bench/ready"
	counterKey = "bench/counter"
)

var loadValue = []byte(strings.Repeat("v", 128))

type loadResult struct {
	opsPerSec float64
	p50, p99  time.Duration
	err       error
}

// storeLoad runs n connections for d, each in a closed loop of rounds: SET
// of its own key (no reply), GET of it, ADD to a counter all share and WAIT
// for a key that exists. Every request is an op; the latency is that of
// each request with a reply (for the GET, the time since its own send).
func storeLoad(addr string, n int, d time.Duration) loadResult {
	cs, err := dialMany(addr, n)
	if err != nil {
		return loadResult{err: err}
	}
	defer closeAll(cs)
	// The key every WAIT finds: stored once this GET is answered.
	if err := cs[0].Send(&tcpstore.Request{Op: tcpstore.OpSet, Key: readyKey, Value: []byte("1")}); err != nil {
		return loadResult{err: err}
	}
	if err := cs[0].Do(&tcpstore.Request{Op: tcpstore.OpGet, Key: readyKey}); err != nil {
		return loadResult{err: err}
	}
	lats := make([][]time.Duration, n)
	rounds := make([]int, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for i, c := range cs {
		wg.Go(func() {
			c.Conn().SetDeadline(end.Add(60 * time.Second))
			key := fmt.Sprintf("bench/load/%d", i)
			set := &tcpstore.Request{Op: tcpstore.OpSet, Key: key, Value: loadValue}
			timed := []*tcpstore.Request{{Op: tcpstore.OpGet, Key: key},
				{Op: tcpstore.OpAdd, Key: counterKey, Delta: 1}, {Op: tcpstore.OpWait, Keys: []string{readyKey}}}
			for time.Now().Before(end) {
				if errs[i] = c.Send(set); errs[i] != nil {
					return
				}
				for _, q := range timed {
					t0 := time.Now()
					if errs[i] = c.Do(q); errs[i] != nil {
						return
					}
					lats[i] = append(lats[i], time.Since(t0))
				}
				rounds[i]++
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := firstErr(errs); err != nil {
		return loadResult{err: err}
	}
	ops := 0
	for _, r := range rounds {
		ops += 4 * r
	}
	all := slices.Concat(lats...)
	return loadResult{opsPerSec: float64(ops) / elapsed.Seconds(), p50: pct(all, 0.5), p99: pct(all, 0.99)}
}

func (r loadResult) String() string {
	return fmt.Sprintf("%6.0f ops/s p50 %6.2fms p99 %6.2fms", r.opsPerSec, ms(r.p50), ms(r.p99))
}

// BenchmarkC10dClients: many concurrent clients, each in a bounded loop (one
// ADD a second, as a heartbeat would), and one live client in a closed loop
// whose every request is timed; on a fresh store of each kind.
func BenchmarkC10dClients(b *testing.B) {
	raiseNoFile(b)
	n := knob(b, "C10D_CLIENTS", 16384, count)
	d := knob(b, "C10D_TIME", 5*time.Second, time.ParseDuration) * 2
	fmt.Printf("== c10d store with %d concurrent clients: %d in a bounded loop (an ADD a second each), one live client "+
		"in a closed loop (SET, GET, WAIT for its key) timed for %s\n", n, n-1, d)
	findTorch(b) // prints the torch version
	for _, kind := range storeKinds {
		s := startStore(b, kind)
		r := manyClients(s, n, d)
		peak := statusMiB(b, s.Cmd.Process.Pid, "VmHWM")
		s.Stop(grace)
		if r.err != nil {
			if kind == "sidecar" {
				b.Fatalf("sidecar's store, %d clients: %v", n, r.err)
			}
			fmt.Printf("   torch   failed: %v\n", r.err)
			continue
		}
		line := fmt.Sprintf("   %-7s live client p50 %6.2fms p99 %6.2fms (%d requests), background %6.0f ops/s, server peak RSS %6.1f MiB",
			kind, ms(r.p50), ms(r.p99), r.live, r.background, peak)
		if kind == "sidecar" {
			line += fmt.Sprintf(" | p99 %s (goal < 10 ms), RSS %s (goal < 512 MiB)", goal(r.p99 < 10*time.Millisecond), goal(peak < 512))
		}
		fmt.Println(line)
		b.ReportMetric(ms(r.p99), kind+"-p99-ms")
		b.ReportMetric(peak, kind+"-peak-rss-MiB")
	}
	fmt.Println()
}

type clientsResult struct {
	p50, p99   time.Duration
	live       int
	background float64 // the bounded loops' requests a second
	err        error
}

// manyClients opens n connections to s; n-1 send an ADD a second (spread
// over the second) while the last runs SET, GET, WAIT of its own key for d.
func manyClients(s *store, n int, d time.Duration) clientsResult {
	cs, err := dialMany(s.addr, n)
	if err != nil {
		return clientsResult{err: err}
	}
	defer closeAll(cs)
	live, rest := cs[n-1], cs[:n-1]
	// A request the store never answers fails the run instead of hanging it.
	for _, c := range cs {
		c.Conn().SetDeadline(time.Now().Add(d + time.Minute))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bg int
	var bgErr error
	// started says when every loop has made its first request (or ended).
	var started sync.WaitGroup
	started.Add(len(rest))
	t00 := time.Now()
	for i, c := range rest {
		wg.Go(func() {
			count := 0
			first := sync.OnceFunc(started.Done)
			defer first()
			defer func() { mu.Lock(); bg += count; mu.Unlock() }()
			q := &tcpstore.Request{Op: tcpstore.OpAdd, Key: fmt.Sprintf("bench/heartbeat/%d", i), Delta: 1}
			t := time.NewTicker(time.Second)
			defer t.Stop()
			select { // spread the loops over the second
			case <-time.After(time.Duration(i) * time.Second / time.Duration(len(rest))):
			case <-stop:
				return
			}
			for {
				if err := c.Do(q); err != nil {
					mu.Lock()
					bgErr = err
					mu.Unlock()
					return
				}
				count++
				first()
				select {
				case <-t.C:
				case <-stop:
					return
				}
			}
		})
	}
	started.Wait()
	t0 := time.Now()
	var lats []time.Duration
	key := "bench/live"
	set := &tcpstore.Request{Op: tcpstore.OpSet, Key: key, Value: loadValue}
	timed := []*tcpstore.Request{{Op: tcpstore.OpGet, Key: key}, {Op: tcpstore.OpWait, Keys: []string{key}}}
	var liveErr error
	for time.Since(t0) < d && liveErr == nil {
		if liveErr = live.Send(set); liveErr != nil {
			break
		}
		for _, q := range timed {
			t := time.Now()
			if liveErr = live.Do(q); liveErr != nil {
				break
			}
			lats = append(lats, time.Since(t))
		}
	}
	close(stop)
	wg.Wait()
	if liveErr != nil {
		return clientsResult{err: fmt.Errorf("live client: %w", liveErr)}
	}
	if bgErr != nil {
		return clientsResult{err: fmt.Errorf("a background client: %w", bgErr)}
	}
	return clientsResult{p50: pct(lats, 0.5), p99: pct(lats, 0.99), live: len(lats), background: float64(bg) / time.Since(t00).Seconds()}
}

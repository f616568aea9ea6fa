package main

// torch's c10d store: the sidecar's TCPStore server (rdzv-sidecar serve
// --c10d-addr) against torch's own, the classic server (Debian's torch has
// no libuv; test/integration/tcpstore/testdata/torch_server.py, the conformance test's, in the trainer root filesystem), both
// measured in the same run:
//
//   - c10d-torchrun: real torchrun agents on --rdzv-backend=c10d with
//     is_host=false (as the webhook sets it): first rendezvous of 4 agents
//     and a scale-up 2 → 3;
//   - c10d-load: N connections of a Go client, each one goroutine in a
//     closed loop: throughput and p99 latency;
//   - c10d-rss: the server's RSS per 1,000 idle connections.

import (
	"bufio"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/elastic-training/elastic-training/internal/tcpstore"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

var (
	torchStore = flag.String("torch-store", "test/integration/tcpstore/testdata/torch_server.py", "torch's own TCPStore server (the c10d baseline; the conformance test's)")
	c10dConns  = flag.String("c10d-conns", "64,256,1024", "client connections of the c10d store load points, comma-separated")
	c10dTime   = flag.Duration("c10d-time", 5*time.Second, "duration of each c10d store load point")
	idleConns  = flag.Int("idle-conns", 1000, "idle connections for the c10d store's RSS")
	pin        = flag.Bool("c10d-pin", true, "c10d store load: the server on the last CPU, this load client on the others (taskset), so that neither takes the other's CPU: torch's server is one thread, ours as many as it gets")
)

// taskset puts every thread of process pid on cpus (taskset's list syntax).
func taskset(cpus string, pid int) {
	if out, err := exec.Command("taskset", "-a", "-pc", cpus, strconv.Itoa(pid)).CombinedOutput(); err != nil {
		check(fmt.Errorf("taskset -a -pc %s %d: %v: %s", cpus, pid, err, out))
	}
}

// unpin gives this process every one of n CPUs again (what pinLoad took away).
func unpin(n int) {
	if *pin && n >= 2 {
		taskset(fmt.Sprintf("0-%d", n-1), os.Getpid())
	}
}

// pinLoad puts the process pid (every thread of it) on the last of n CPUs
// and this process on the others; it returns a description for the report.
// n is counted before any pinning (nproc counts the CPUs a process may use).
func pinLoad(pid, n int) string {
	if !*pin || n < 2 {
		return "not pinned"
	}
	last := strconv.Itoa(n - 1)
	others := fmt.Sprintf("0-%d", n-2)
	taskset(last, pid)
	taskset(others, os.Getpid())
	return fmt.Sprintf("server on CPU %s, load client on CPUs %s", last, others)
}

// The two c10d stores.
var storeKinds = []string{"sidecar", "torch"}

// store is a running c10d store of one of storeKinds.
type store struct {
	addr string // host:port
	pid  int    // the serving process
	stop func()
}

func startStore(dir, kind string) *store {
	check(os.MkdirAll(dir, 0o755))
	if kind == "sidecar" {
		s := startSidecar(dir)
		return &store{addr: s.c10d, pid: s.p.cmd.Process.Pid, stop: s.p.stop}
	}
	script, err := filepath.Abs(*torchStore)
	check(err)
	port := freePort()
	log := filepath.Join(dir, "torch-store.log")
	// InRootfs execs every step: the command's PID is python's.
	p := startTorch(log, "/usr/bin/python3", []string{script, strconv.Itoa(port)})
	waitLog(p, log, "READY", 2*time.Minute)
	return &store{addr: fmt.Sprintf("127.0.0.1:%d", port), pid: p.cmd.Process.Pid, stop: p.stop}
}

// waitLog waits until p's log at path contains s, polling every 20 ms; p
// exiting first is an error.
func waitLog(p *proc, path, s string, timeout time.Duration) {
	pollFile(path, func(out string) bool {
		if strings.Contains(out, s) {
			return true
		}
		select {
		case <-p.done:
			check(fmt.Errorf("%s exited before printing %q:\n%s", path, s, out))
		default:
		}
		return false
	}, timeout, 20*time.Millisecond)
}

// raiseNoFile raises the open-files limit to 65536 (or at least to the hard
// limit), for this process and, as it is set explicitly, the servers it
// starts: 1,024 connections need as many descriptors on both ends.
func raiseNoFile() {
	var lim syscall.Rlimit
	check(syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	want := max(lim.Max, 65536)
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: want}) != nil {
		check(syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: lim.Max, Max: lim.Max}))
	}
}

func goal(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// benchC10dTorchrun: first rendezvous and scale-up of real torchrun agents,
// on a fresh store of each kind per repetition.
func benchC10dTorchrun(tmp string) {
	fmt.Println("== c10d rendezvous of real torchrun agents (--rdzv-backend=c10d, is_host=false): sidecar's store vs torch's TCPStore server")
	trainerRoot() // prints the torch version
	first := map[string][]time.Duration{}
	scale := map[string][]time.Duration{}
	for r := range *reps {
		// Alternate the order so a warming page cache favours neither.
		kinds := slices.Clone(storeKinds)
		if r%2 == 1 {
			slices.Reverse(kinds)
		}
		for _, kind := range kinds {
			dir := filepath.Join(tmp, fmt.Sprintf("c10d-%s-%d", kind, r))
			s := startStore(dir, kind)
			first[kind] = append(first[kind], firstRendezvous(dir, s.addr, "c10d", fmt.Sprintf("first-%d", r)))
			scale[kind] = append(scale[kind], scaleUp(dir, s.addr, fmt.Sprintf("scale-%d", r)))
			s.stop()
		}
	}
	for _, m := range []struct {
		what string
		ds   map[string][]time.Duration
	}{
		{"first rendezvous (4 agents: start → every worker done with all_reduce)", first},
		{"scale-up 2→3 (--nnodes=2:3: third agent's start → every worker at world 3)", scale},
	} {
		ms, mt := median(m.ds["sidecar"]), median(m.ds["torch"])
		fmt.Printf("   %s\n      sidecar median %6.2fs %v | torch's store median %6.2fs %v | ratio %.2f\n",
			m.what, ms.Seconds(), secs(m.ds["sidecar"]), mt.Seconds(), secs(m.ds["torch"]), ms.Seconds()/mt.Seconds())
	}
	fmt.Println()
}

// scaleUp starts 2 agents with --nnodes=2:3 through endpoint and, once both
// workers train at world 2, a third agent: it returns the time from the
// third agent's start until every worker has trained at world 3. The
// settings are the integration test's (test/integration/sidecar,
// TestTorchrunElasticGrowShrink).
func scaleUp(dir, endpoint, runID string) time.Duration {
	args := agentArgs("c10d", endpoint, runID, "2:3", "last_call_timeout=2", "--max_restarts=5")
	env := testenv.TorchEnv("TRAIN_STEPS=100000", "STEP_SLEEP=0.3")
	var ps []*proc
	var logs []string
	startAgent := func() {
		log := filepath.Join(dir, fmt.Sprintf("%s-agent%d.log", runID, len(ps)))
		ps = append(ps, startCmd(log, testenv.InRootfs(trainerRoot(), "/usr/bin/torchrun", args...), env))
		logs = append(logs, log)
	}
	defer func() {
		var wg sync.WaitGroup
		for _, p := range ps {
			wg.Go(p.stop)
		}
		wg.Wait()
	}()
	startAgent()
	startAgent()
	for i := range 2 {
		waitLog(ps[i], logs[i], "world=2 ", 5*time.Minute)
	}
	t0 := time.Now()
	startAgent()
	for i := range 3 {
		waitLog(ps[i], logs[i], "world=3 ", 5*time.Minute)
	}
	return time.Since(t0)
}

// storeClient is one raw TCPStore connection, speaking torch's protocol
// with internal/tcpstore's encoder.
type storeClient struct {
	nc  net.Conn
	r   *bufio.Reader
	buf []byte
}

// dialStore connects to addr and sends VALIDATE (which has no reply) and a
// PING, whose reply shows that the server has taken the connection.
func dialStore(addr string) (*storeClient, error) {
	nc, err := net.DialTimeout("tcp", addr, 30*time.Second)
	if err != nil {
		return nil, err
	}
	c := &storeClient{nc: nc, r: bufio.NewReaderSize(nc, 512)}
	nc.SetDeadline(time.Now().Add(60 * time.Second))
	err = c.send(&tcpstore.Request{Op: tcpstore.OpValidate, Magic: tcpstore.Magic})
	if err == nil {
		err = c.send(&tcpstore.Request{Op: tcpstore.OpPing, Nonce: 0x5eed})
	}
	if err == nil {
		err = c.reply(tcpstore.OpPing)
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	return c, nil
}

func (c *storeClient) send(q *tcpstore.Request) error {
	c.buf = tcpstore.AppendRequest(c.buf[:0], q)
	_, err := c.nc.Write(c.buf)
	return err
}

// reply reads and checks the reply to a request of op.
func (c *storeClient) reply(op tcpstore.Op) error {
	var b [8]byte
	switch op {
	case tcpstore.OpGet: // u64 length, the value
		if _, err := io.ReadFull(c.r, b[:8]); err != nil {
			return err
		}
		_, err := c.r.Discard(int(binary.LittleEndian.Uint64(b[:8])))
		return err
	case tcpstore.OpAdd: // i64 the new value
		_, err := io.ReadFull(c.r, b[:8])
		return err
	case tcpstore.OpWait: // u8 STOP_WAITING (0)
		if _, err := io.ReadFull(c.r, b[:1]); err != nil {
			return err
		}
		if b[0] != 0 {
			return fmt.Errorf("WAIT answered %d", b[0])
		}
	case tcpstore.OpPing: // the nonce
		if _, err := io.ReadFull(c.r, b[:4]); err != nil {
			return err
		}
		if n := binary.LittleEndian.Uint32(b[:4]); n != 0x5eed {
			return fmt.Errorf("PING answered 0x%x", n)
		}
	}
	return nil
}

// do sends q and reads its reply.
func (c *storeClient) do(q *tcpstore.Request) error {
	if err := c.send(q); err != nil {
		return err
	}
	return c.reply(q.Op)
}

// dialMany opens n connections, 32 at a time; on any failure it closes
// those it opened and says how many it got.
func dialMany(addr string, n int) ([]*storeClient, error) {
	cs := make([]*storeClient, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			cs[i], errs[i] = dialStore(addr)
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
func closeAll(cs []*storeClient) int {
	n := 0
	for _, c := range cs {
		if c != nil {
			c.nc.Close()
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
	if err := cs[0].send(&tcpstore.Request{Op: tcpstore.OpSet, Key: readyKey, Value: []byte("1")}); err != nil {
		return loadResult{err: err}
	}
	if err := cs[0].do(&tcpstore.Request{Op: tcpstore.OpGet, Key: readyKey}); err != nil {
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
			c.nc.SetDeadline(end.Add(60 * time.Second))
			key := fmt.Sprintf("bench/load/%d", i)
			set := &tcpstore.Request{Op: tcpstore.OpSet, Key: key, Value: loadValue}
			timed := []*tcpstore.Request{{Op: tcpstore.OpGet, Key: key},
				{Op: tcpstore.OpAdd, Key: counterKey, Delta: 1}, {Op: tcpstore.OpWait, Keys: []string{readyKey}}}
			for time.Now().Before(end) {
				if errs[i] = c.send(set); errs[i] != nil {
					return
				}
				for _, q := range timed {
					t0 := time.Now()
					if errs[i] = c.do(q); errs[i] != nil {
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

func ms(d time.Duration) float64 { return d.Seconds() * 1000 }

// benchC10dLoad: the store load at each N, against one long-lived store of
// each kind, one after the other (alternating which goes first).
func benchC10dLoad(tmp string) {
	raiseNoFile()
	fmt.Printf("== c10d store load: N connections (one goroutine each, closed loop: set+get own key, add shared counter, "+
		"wait for an existing key; %s per point): sidecar's store vs torch's classic TCPStore server\n", *c10dTime)
	trainerRoot() // prints the torch version
	stores := map[string]*store{}
	for _, kind := range storeKinds {
		stores[kind] = startStore(filepath.Join(tmp, "load-"+kind), kind)
		defer stores[kind].stop()
	}
	cpus := numCPU()
	defer unpin(cpus)
	for i, f := range strings.Split(*c10dConns, ",") {
		n, err := strconv.Atoi(f)
		check(err)
		kinds := slices.Clone(storeKinds)
		if i%2 == 1 {
			slices.Reverse(kinds)
		}
		res := map[string]loadResult{}
		for _, kind := range kinds {
			time.Sleep(time.Second) // the previous point's connections closed
			where := pinLoad(stores[kind].pid, cpus)
			if i == 0 {
				fmt.Printf("   %s: %s\n", kind, where)
			}
			res[kind] = storeLoad(stores[kind].addr, n, *c10dTime)
		}
		s, t := res["sidecar"], res["torch"]
		if s.err != nil {
			check(fmt.Errorf("sidecar's store, %d connections: %w", n, s.err))
		}
		line := fmt.Sprintf("   N=%-5d sidecar %s", n, s)
		if t.err != nil {
			fmt.Printf("%s | torch's server failed: %v\n", line, t.err)
			continue
		}
		tr, lr := s.opsPerSec/t.opsPerSec, s.p99.Seconds()/t.p99.Seconds()
		fmt.Printf("%s | torch %s | throughput %.2fx %s (goal ≥ 1.0x), p99 %.2fx %s (goal ≤ 1.0x)\n",
			line, t, tr, goal(tr >= 1), lr, goal(lr <= 1))
	}
	fmt.Println()
}

// benchC10dRSS: each store's RSS before and after n idle connections, on a
// fresh store.
func benchC10dRSS(tmp string) {
	raiseNoFile()
	n := *idleConns
	fmt.Printf("== c10d store RSS with %d idle connections (each VALIDATE, then one PING answered)\n", n)
	trainerRoot() // prints the torch version
	for _, kind := range storeKinds {
		s := startStore(filepath.Join(tmp, "rss-"+kind), kind)
		time.Sleep(2 * time.Second) // settle after start
		before := rssMiB(s.pid)
		cs, err := dialMany(s.addr, n)
		if err != nil {
			s.stop()
			if kind == "sidecar" {
				check(fmt.Errorf("sidecar's store: %w", err))
			}
			fmt.Printf("   torch's server failed: %v\n", err)
			continue
		}
		time.Sleep(2 * time.Second)
		after := rssMiB(s.pid)
		closeAll(cs)
		s.stop()
		per := (after - before) * 1000 / float64(n)
		line := fmt.Sprintf("   %-7s RSS %6.1f MiB before, %6.1f MiB with %d connections: %5.1f MiB per 1,000",
			kind, before, after, n, per)
		if kind == "sidecar" {
			line += fmt.Sprintf(" %s (goal ≤ 64 MiB)", goal(per <= 64))
		}
		fmt.Println(line)
	}
	fmt.Println()
}

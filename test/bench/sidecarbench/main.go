// Command sidecarbench measures rdzv-sidecar against a baseline measured in
// the same run (`make bench-sidecar`):
//
//  1. first rendezvous of 4 real torchrun agents (--nnodes=4) through the
//     sidecar vs through Debian's etcd 3.4 --enable-v2, both torch backends;
//     torch runs from the trainer root filesystem that
//     test/e2e/cluster/rootfs.sh builds (forky: torch 2.14), never the host's;
//  2. latency from a membership change (join/leave) to the rewritten
//     hostfile, p50/p99 over many changes;
//  3. with 1,000 registered members: hostfile render time, and the serve
//     process's RSS (plus idle RSS);
//  4. torch's c10d store (c10d.go): the sidecar's TCPStore server vs torch's
//     own, with real torchrun agents (first rendezvous, scale-up) and with a
//     Go client's load (throughput, p99 latency, RSS per 1,000 connections).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/elastic-training/elastic-training/internal/hostfile"
	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

var (
	sidecar   = flag.String("sidecar", "bin/rdzv-sidecar", "rdzv-sidecar binary")
	etcd34    = flag.String("etcd", "/usr/bin/etcd", "etcd 3.4 binary (baseline)")
	train     = flag.String("train", "test/integration/sidecar/testdata/train.py", "training script for torchrun")
	reps      = flag.Int("reps", 3, "rendezvous repetitions per server and backend")
	changes   = flag.Int("changes", 200, "membership changes for the hostfile latency")
	members   = flag.Int("members", 1000, "registered members for the size test")
	parts     = flag.String("parts", "v2ops,probe,torchrun,latency,scale,c10d-torchrun,c10d-load,c10d-rss", "which measurements to run, comma-separated")
	probe     = flag.String("probe", "test/bench/sidecarbench/testdata/rdzv_probe.py", "rendezvous-only probe")
	probeReps = flag.Int("probe-reps", 9, "repetitions of the rendezvous-only measurement")
	suite     = flag.String("suite", testenv.SuiteForky, "trainer root filesystem ($ET_CACHE/rootfs/<suite>, test/e2e/cluster/rootfs.sh) that runs torch")
)

// trainerRoot is the root filesystem of -suite, found (and its torch version
// printed) by the first measurement that runs torch.
var trainerRoot = sync.OnceValue(func() string {
	root, err := testenv.RootfsDir(*suite, testenv.RootfsWait, func(f string, a ...any) { fmt.Printf("   "+f+"\n", a...) })
	check(err)
	v, err := testenv.RootfsTorchVersion(root)
	check(err)
	fmt.Printf("   torch %s (%s)\n", v, root)
	return root
})

func main() {
	flag.Parse()
	tmp, err := os.MkdirTemp("", "sidecarbench-")
	check(err)
	defer os.RemoveAll(tmp)
	fmt.Printf("rdzv-sidecar benchmarks (%s, %d CPUs)\n\n", time.Now().UTC().Format(time.RFC3339), numCPU())
	run := map[string]func(string){"v2ops": benchV2Ops, "probe": benchRendezvousOnly, "torchrun": benchRendezvous,
		"latency": benchHostfileLatency, "scale": benchScale,
		"c10d-torchrun": benchC10dTorchrun, "c10d-load": benchC10dLoad, "c10d-rss": benchC10dRSS}
	for _, p := range strings.Split(*parts, ",") {
		f, ok := run[p]
		if !ok {
			check(fmt.Errorf("unknown part %q", p))
		}
		f(tmp)
	}
}

func numCPU() int {
	out, _ := exec.Command("nproc").Output()
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidecarbench:", err)
		os.Exit(1)
	}
}

func freePort() int {
	port, err := testenv.PickFreePort()
	check(err)
	return port
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	out  *os.File
}

func start(logPath string, name string, args []string, env []string) *proc {
	return startCmd(logPath, exec.Command(name, args...), env)
}

// startTorch runs name (a path in the trainer root filesystem) there.
func startTorch(logPath string, name string, args []string) *proc {
	return startCmd(logPath, testenv.InRootfs(trainerRoot(), name, args...), testenv.TorchEnv())
}

func startCmd(logPath string, cmd *exec.Cmd, env []string) *proc {
	f, err := os.Create(logPath)
	check(err)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	check(cmd.Start())
	p := &proc{cmd: cmd, done: make(chan struct{}), out: f}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	return p
}

// stop sends SIGTERM to the process group and, after 15 s, SIGKILL to the
// group and every process that was below it (torchrun starts its workers in
// sessions of their own).
func (p *proc) stop() {
	below := testenv.Descendants(p.cmd.Process.Pid)
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		for _, pid := range below {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		<-p.done
	}
}

// waitOK waits up to a minute for url to answer 200 OK.
func waitOK(url string) {
	if err := testenv.PollHTTP(context.Background(), 60*time.Second, 20*time.Millisecond, url, http.StatusOK); err != nil {
		check(fmt.Errorf("%s did not come up: %w", url, err))
	}
}

// server is either the sidecar or etcd 3.4.
type server struct {
	p         *proc
	clientURL string
	health    string
	c10d      string // the sidecar's c10d store, host:port
}

func startSidecar(dir string, extra ...string) *server {
	client := fmt.Sprintf("http://127.0.0.1:%d", freePort())
	health := fmt.Sprintf("127.0.0.1:%d", freePort())
	c10d := fmt.Sprintf("127.0.0.1:%d", freePort())
	args := append([]string{"serve", "--data-dir=" + filepath.Join(dir, "data"), "--listen-client-urls=" + client,
		"--advertise-client-urls=" + client, fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", freePort()),
		"--health-addr=" + health, "--c10d-addr=" + c10d}, extra...)
	p := start(filepath.Join(dir, "serve.log"), *sidecar, args, os.Environ())
	waitOK("http://" + health + "/readyz")
	return &server{p: p, clientURL: client, health: health, c10d: c10d}
}

func startEtcd34(dir string) *server {
	client := fmt.Sprintf("http://127.0.0.1:%d", freePort())
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort())
	// With fsync, unlike testenv.Etcd34: both servers run with their default durability.
	args := testenv.Etcd34Args(filepath.Join(dir, "data"), client, peer)
	p := start(filepath.Join(dir, "etcd.log"), *etcd34, args, os.Environ())
	waitOK(client + "/v2/keys/")
	return &server{p: p, clientURL: client}
}

// agentArgs are torchrun's arguments for one agent of the run runID through
// endpoint (host:port), then extra and the training script. On c10d the
// store is the server's: no agent hosts one (is_host=false, as the webhook
// sets it, joined to conf).
func agentArgs(backend, endpoint, runID, nnodes, conf string, extra ...string) []string {
	if backend == "c10d" {
		conf = strings.TrimPrefix(conf+",is_host=false", ",")
	}
	args := []string{"--nnodes=" + nnodes, "--nproc_per_node=1", "--rdzv_backend=" + backend,
		"--rdzv_endpoint=" + endpoint, "--rdzv_id=" + runID, "--monitor_interval=1"}
	if conf != "" {
		args = append(args, "--rdzv_conf="+conf)
	}
	script, err := filepath.Abs(*train)
	check(err)
	return append(append(args, extra...), script)
}

// firstRendezvous starts 4 agents at once through endpoint (host:port) and
// returns the time until every worker printed its all_reduce RESULT (world
// formed and used).
func firstRendezvous(dir, endpoint, backend, runID string) time.Duration {
	trainerRoot() // before the clock starts
	t0 := time.Now()
	var ps []*proc
	for i := range 4 {
		ps = append(ps, startTorch(filepath.Join(dir, fmt.Sprintf("%s-agent%d.log", runID, i)), "/usr/bin/torchrun",
			agentArgs(backend, endpoint, runID, "4", "")))
	}
	var last time.Duration
	for i, p := range ps {
		select {
		case <-p.done:
		case <-time.After(300 * time.Second):
			p.stop()
		}
		if p.cmd.ProcessState.ExitCode() != 0 {
			b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%s-agent%d.log", runID, i)))
			check(fmt.Errorf("agent %d of %s failed:\n%s", i, runID, b))
		}
		if d := time.Since(t0); d > last {
			last = d
		}
	}
	return last
}

func benchRendezvous(tmp string) {
	fmt.Println("== first rendezvous of 4 torchrun agents (--nnodes=4, agent start → every worker done with all_reduce)")
	for _, backend := range []string{"etcd-v2", "etcd"} {
		var side, ref []time.Duration
		for r := range *reps {
			// Alternate the order so a warming page cache favours neither.
			order := []string{"sidecar", "etcd34"}
			if r%2 == 1 {
				order = []string{"etcd34", "sidecar"}
			}
			for _, which := range order {
				dir := filepath.Join(tmp, fmt.Sprintf("rdzv-%s-%s-%d", backend, which, r))
				check(os.MkdirAll(dir, 0o755))
				var s *server
				if which == "sidecar" {
					s = startSidecar(dir)
				} else {
					s = startEtcd34(dir)
				}
				d := firstRendezvous(dir, strings.TrimPrefix(s.clientURL, "http://"), backend, fmt.Sprintf("bench-%d", r))
				s.p.stop()
				if which == "sidecar" {
					side = append(side, d)
				} else {
					ref = append(ref, d)
				}
			}
		}
		ms, mr := median(side), median(ref)
		fmt.Printf("   %-8s sidecar median %6.2fs %v | etcd 3.4 median %6.2fs %v | ratio %.2f (goal ≤ 1.0)\n",
			backend, ms.Seconds(), secs(side), mr.Seconds(), secs(ref), ms.Seconds()/mr.Seconds())
	}
	fmt.Println()
}

// probeRendezvous runs 4 probe agents that import torch first, then starts
// them together and returns the slowest agent's next_rendezvous() time.
func probeRendezvous(dir string, s *server, backend, runID string) time.Duration {
	script, err := filepath.Abs(*probe)
	check(err)
	goFile := filepath.Join(dir, runID+".go")
	var ps []*proc
	var logs []string
	for i := range 4 {
		log := filepath.Join(dir, fmt.Sprintf("%s-probe%d.log", runID, i))
		logs = append(logs, log)
		ps = append(ps, startTorch(log, "/usr/bin/python3", []string{script, backend,
			strings.TrimPrefix(s.clientURL, "http://"), runID, "4", goFile}))
	}
	for _, l := range logs {
		waitFile(l, func(s string) bool { return strings.Contains(s, "READY") }, 120*time.Second)
	}
	check(os.WriteFile(goFile, nil, 0o644))
	var worst time.Duration
	for i, l := range logs {
		var out string
		waitFile(l, func(s string) bool { out = s; return strings.Contains(s, "RDZV ") || strings.Contains(s, "Error") }, 300*time.Second)
		var secs float64
		if _, err := fmt.Sscanf(out[strings.Index(out, "RDZV "):], "RDZV %f", &secs); err != nil {
			check(fmt.Errorf("probe %d (%s): %s", i, runID, out))
		}
		if d := time.Duration(secs * float64(time.Second)); d > worst {
			worst = d
		}
	}
	check(os.WriteFile(goFile+".done", nil, 0o644))
	for _, p := range ps {
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			p.stop()
		}
	}
	return worst
}

func benchRendezvousOnly(tmp string) {
	fmt.Println("== first rendezvous of 4 torch agents, rendezvous only (real torch handlers + python-etcd, imports excluded; slowest agent)")
	for _, backend := range []string{"etcd-v2", "etcd"} {
		var side, ref []time.Duration
		dirS, dirR := filepath.Join(tmp, "probe-sidecar-"+backend), filepath.Join(tmp, "probe-etcd34-"+backend)
		check(os.MkdirAll(dirS, 0o755))
		check(os.MkdirAll(dirR, 0o755))
		ss, sr := startSidecar(dirS), startEtcd34(dirR)
		for r := range *probeReps {
			// Fresh run ids on long-lived servers; alternate which goes first.
			order := []string{"sidecar", "etcd34"}
			if r%2 == 1 {
				order = []string{"etcd34", "sidecar"}
			}
			for _, which := range order {
				id := fmt.Sprintf("probe-%s-%d", backend, r)
				if which == "sidecar" {
					side = append(side, probeRendezvous(dirS, ss, backend, id))
				} else {
					ref = append(ref, probeRendezvous(dirR, sr, backend, id))
				}
			}
		}
		ss.p.stop()
		sr.p.stop()
		ms, mr := median(side), median(ref)
		fmt.Printf("   %-8s sidecar median %6.3fs %v | etcd 3.4 median %6.3fs %v | ratio %.2f (goal ≤ 1.0)\n",
			backend, ms.Seconds(), secs(side), mr.Seconds(), secs(ref), ms.Seconds()/mr.Seconds())
	}
	fmt.Println()
}

// benchV2Ops: sequential v2 requests as python-etcd sends them (form PUT
// with a TTL, then GET), sidecar vs etcd 3.4, both with default durability.
func benchV2Ops(tmp string) {
	const n = 2000
	fmt.Printf("== etcd v2 API request latency (%d sequential PUT ttl=10 + GET pairs over one keep-alive connection)\n", n)
	measure := func(s *server) time.Duration {
		c := &http.Client{}
		t0 := time.Now()
		for i := range n {
			key := fmt.Sprintf("%s/v2/keys/bench/k%d", s.clientURL, i%50)
			req, _ := http.NewRequest("PUT", key, strings.NewReader("value=v&ttl=10"))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			resp, err := c.Do(req)
			check(err)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			resp, err = c.Get(key)
			check(err)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return time.Since(t0) / n
	}
	dirS, dirR := filepath.Join(tmp, "v2ops-sidecar"), filepath.Join(tmp, "v2ops-etcd34")
	check(os.MkdirAll(dirS, 0o755))
	check(os.MkdirAll(dirR, 0o755))
	ss, sr := startSidecar(dirS), startEtcd34(dirR)
	defer ss.p.stop()
	defer sr.p.stop()
	side, ref := measure(ss), measure(sr)
	fmt.Printf("   sidecar %s per PUT+GET | etcd 3.4 %s per PUT+GET | ratio %.2f\n\n",
		side.Round(time.Microsecond), ref.Round(time.Microsecond), side.Seconds()/ref.Seconds())
}

func secs(ds []time.Duration) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = fmt.Sprintf("%.3f", d.Seconds())
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}

func client(url string) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	check(err)
	return cli
}

// benchHostfileLatency: a `join --register=false --files-dir` process keeps a
// hostfile; each change registers or deregisters one member exactly as
// `join` does (lease + put, revoke) and waits for the file to change.
func benchHostfileLatency(tmp string) {
	fmt.Printf("== hostfile rewrite latency after a join or leave (%d changes, separate join process writing the files)\n", *changes)
	dir := filepath.Join(tmp, "latency")
	files := filepath.Join(dir, "files")
	check(os.MkdirAll(files, 0o755))
	s := startSidecar(dir)
	defer s.p.stop()
	jhealth := fmt.Sprintf("127.0.0.1:%d", freePort())
	j := start(filepath.Join(dir, "join.log"), *sidecar, []string{"join", "--endpoints=" + s.clientURL,
		"--register=false", "--files-dir=" + files, "--health-addr=" + jhealth}, os.Environ())
	defer j.stop()
	waitOK("http://" + jhealth + "/readyz")
	cli := client(s.clientURL)
	defer cli.Close()
	ctx := context.Background()
	// Three permanent members so the file always exists.
	for i := range 3 {
		m := membership.Member{Host: fmt.Sprintf("base-%d.job.ns.svc", i), Slots: 1, Group: "worker", Index: i}
		_, err := cli.Put(ctx, membership.Key("/elastic-training/members/", m.Host), membership.Encode(m))
		check(err)
	}
	hf := filepath.Join(files, "hostfile")
	waitFile(hf, func(s string) bool { return strings.Count(s, "\n") == 3 }, 10*time.Second)
	var lat []time.Duration
	var lease clientv3.LeaseID
	m := membership.Member{Host: "moving.job.ns.svc", Slots: 2, Group: "worker", Index: 9}
	for i := range *changes {
		t0 := time.Now()
		join := i%2 == 0
		if join {
			g, err := cli.Grant(ctx, 5)
			check(err)
			lease = g.ID
			_, err = cli.Put(ctx, membership.Key("/elastic-training/members/", m.Host), membership.Encode(m), clientv3.WithLease(lease))
			check(err)
		} else {
			_, err := cli.Revoke(ctx, lease)
			check(err)
		}
		waitFile(hf, func(s string) bool { return strings.Contains(s, m.Host) == join }, 10*time.Second)
		lat = append(lat, time.Since(t0))
	}
	fmt.Printf("   p50 %s  p99 %s  max %s (goal p99 ≤ 200ms)\n\n", pct(lat, 0.5).Round(10*time.Microsecond),
		pct(lat, 0.99).Round(10*time.Microsecond), pct(lat, 1).Round(10*time.Microsecond))
}

// waitFile waits until ok holds for path's content, polling every 200 µs (the hostfile latency is measured
// with it).
func waitFile(path string, ok func(string) bool, timeout time.Duration) {
	pollFile(path, ok, timeout, 200*time.Microsecond)
}

// pollFile is waitFile polling every interval.
func pollFile(path string, ok func(string) bool, timeout, interval time.Duration) {
	err := testenv.Poll(context.Background(), timeout, interval, func(context.Context) (bool, error) {
		b, _ := os.ReadFile(path)
		return ok(string(b)), nil
	})
	if err != nil {
		check(fmt.Errorf("%s did not reach the expected content: %w", path, err))
	}
}

func rssMiB(pid int) float64 { return statusMiB(pid, "VmRSS:") }

func statusMiB(pid int, field string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	check(err)
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.Atoi(f[1])
			return float64(kb) / 1024
		}
	}
	return 0
}

// benchScale registers N members, each with its own lease kept alive (as N
// join processes would), in a serve that also writes the files in-process.
func benchScale(tmp string) {
	n := *members
	fmt.Printf("== %d registered members\n", n)
	ms := make([]membership.Member, n)
	for i := range ms {
		ms[i] = membership.Member{Host: fmt.Sprintf("job-worker-%d.job.default.svc.cluster.local", i), Slots: 8, Group: "worker", Index: i}
	}
	r := testing.Benchmark(func(b *testing.B) {
		for b.Loop() {
			if _, err := hostfile.Render(hostfile.OpenMPI, ms); err != nil {
				b.Fatal(err)
			}
		}
	})
	render := time.Duration(r.NsPerOp())
	fmt.Printf("   hostfile render (Open MPI, %d hosts): %s per render (goal ≤ 10ms)\n", n, render)

	dir := filepath.Join(tmp, "scale")
	files := filepath.Join(dir, "files")
	check(os.MkdirAll(files, 0o755))
	s := startSidecar(dir, "--files-dir="+files, "--register=false")
	defer s.p.stop()
	time.Sleep(2 * time.Second) // settle after start
	idle := rssMiB(s.p.cmd.Process.Pid)
	cli := client(s.clientURL)
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for _, m := range ms {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			g, err := cli.Grant(ctx, 10)
			check(err)
			_, err = cli.Put(ctx, membership.Key("/elastic-training/members/", m.Host), membership.Encode(m), clientv3.WithLease(g.ID))
			check(err)
			ka, err := cli.KeepAlive(ctx, g.ID)
			check(err)
			go func() {
				for range ka {
				}
			}()
		}()
	}
	wg.Wait()
	hf := filepath.Join(files, "hostfile")
	t0 := time.Now()
	waitFile(hf, func(s string) bool { return strings.Count(s, "\n") == n }, 60*time.Second)
	fmt.Printf("   hostfile with all %d members written %s after the last registration\n", n, time.Since(t0).Round(time.Millisecond))
	// Keep-alives run for a while so the server's steady state is measured.
	time.Sleep(12 * time.Second)
	full := rssMiB(s.p.cmd.Process.Pid)
	fmt.Printf("   serve RSS: idle %.1f MiB, with %d members kept alive %.1f MiB, peak (VmHWM) %.1f MiB (goal ≤ 64 MiB)\n",
		idle, n, full, statusMiB(s.p.cmd.Process.Pid, "VmHWM:"))
}

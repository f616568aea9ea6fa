// Package sidecar_test measures rdzv-sidecar against a baseline measured in
// the same run, one benchmark per measurement. `make bench-sidecar` runs
// those of a small job, `make bench-scale` those of a large one
// (RendezvousScale, C10dJoinRace, Scale, C10dClients):
//
//	go test -count=1 -timeout 150m -run '^$' -bench . -benchtime 1x ./test/bench/sidecar
//
// and -bench picks some: 'V2Ops|HostfileLatency'; '^BenchmarkTorchrun$'
// (without BenchmarkC10dTorchrun); 'RendezvousOnly/etcd-v2' (one backend).
//
//   - BenchmarkV2Ops: etcd v2 API request latency, 2,000 sequential PUT
//     ttl=10 + GET pairs as python-etcd sends them, over one keep-alive
//     connection: the sidecar vs Debian's etcd 3.4 --enable-v2, both with
//     their default durability;
//   - BenchmarkRendezvousOnly: first rendezvous of 4 torch agents through the
//     sidecar vs through etcd 3.4, the rendezvous only (testdata/rdzv_probe.py:
//     torch's real handlers and python-etcd, imports excluded; the slowest
//     agent), one sub-benchmark per backend (etcd-v2, etcd);
//   - BenchmarkTorchrun: first rendezvous of 4 real torchrun agents
//     (--nnodes=4, agent start → every worker done with all_reduce) through
//     the sidecar vs through etcd 3.4, one sub-benchmark per backend;
//   - BenchmarkHostfileLatency: latency from a membership change (a join or
//     a leave) to the hostfile that a separate join process rewrites,
//     p50/p99 over many changes (goal p99 ≤ 200 ms);
//   - BenchmarkScale: 500 members, each registered and kept by its own
//     sidecar.Join with its own hostfile: hostfile render time (goal ≤
//     10 ms), the time until every hostfile lists all of them, the p99 of one
//     change (a leave, a join) reaching every hostfile, and serve's RSS,
//     idle and with them;
//   - BenchmarkRendezvousScale (scale_test.go): N of torch's own
//     DynamicRendezvousHandler (testdata/scale_agents.py, many a process,
//     driven as torchrun's agent drives them) through the sidecar vs torch's
//     TCPStore server (c10d) and etcd 3.4 (etcd-v2): the first round, one
//     node joining, the same node leaving through the preStop script, and
//     the steady keep-alives' operations, CPU and RSS; with the chart's
//     settings as the webhook renders them for N, and with torch's;
//   - BenchmarkElasticTrainingBackendScale (backend_test.go): the elastic-training backend
//     (elastic-training) vs torch's c10d handler, both on the sidecar's
//     store, N = 64 to 4,096 participants of scale_agents.py, N+1 members
//     registered first: the same steps and figures as RendezvousScale, and
//     issue 37's goals;
//   - torch's c10d store: the sidecar's TCPStore server (serve --c10d-addr)
//     vs torch's own, the classic server (tcpstoretest.StartTorch: Debian's
//     torch has no libuv). BenchmarkC10dTorchrun: real torchrun agents on
//     --rdzv-backend=c10d with is_host=false (as the webhook sets it), first
//     rendezvous of 4 agents and a scale-up 2 → 3; BenchmarkC10dLoad: N
//     connections of a Go client, each one goroutine in a closed loop,
//     throughput and p99 latency (goals ≥ 1.0x and ≤ 1.0x), one
//     sub-benchmark per N; BenchmarkC10dRSS: the store's RSS per 1,000 idle
//     connections (goal ≤ 64 MiB); BenchmarkC10dClients: 16,384 concurrent
//     clients in bounded loops and a live client's p99 (goal < 10 ms), the
//     store's peak RSS (goal < 512 MiB); BenchmarkC10dJoinRace
//     (race_test.go): torch's join race (every node adds itself to one key
//     by COMPARE_SET, retrying at once) with Go clients, the store's share
//     of a large job's first round, N = 256, 512, 1,024.
//
// Each prints what it measured, its ratios to the baseline and PASS or MISS
// against its goals (timing never fails a benchmark; errors do), and reports
// its main figures as benchmark metrics. TestMain builds rdzv-sidecar once.
// torch, python-etcd and Python run from a trainer root filesystem
// (testenv.Rootfs; `make rootfs` builds it), not the host's, which needs
// root: every benchmark but V2Ops, HostfileLatency and Scale runs torch (the
// c10d ones for torch's store, their baseline). etcd 3.4 is Debian's
// /usr/bin/etcd (etcd-server). On a machine without Go or that root
// filesystem but with more cores and a python with torch, a compiled
// benchmark runs RendezvousScale, C10dJoinRace, Scale and C10dClients with
// BENCH_SIDECAR_BIN and BENCH_SIDECAR_PYTHON (docs/scale.md says how).
//
// Settings, from the environment (default):
//
//	BENCH_SIDECAR_REPS        repetitions per server and backend of Torchrun and C10dTorchrun (3)
//	BENCH_SIDECAR_PROBE_REPS  repetitions per server and backend of RendezvousOnly (9)
//	BENCH_SIDECAR_CHANGES     membership changes of HostfileLatency (200)
//	BENCH_SIDECAR_MEMBERS     registered members of Scale (500)
//	BENCH_SIDECAR_MEMBER_CHANGES  Scale: members that leave and join again, one at a time (40)
//	BENCH_SIDECAR_SCALE_NODES     RendezvousScale: sizes, comma-separated (64,256,1024)
//	BENCH_SIDECAR_SCALE_BACKENDS  RendezvousScale: c10d, etcd-v2 (both)
//	BENCH_SIDECAR_SCALE_SETTINGS  RendezvousScale: chart (as the webhook renders them for N), torch, before
//	                          (keep_alive_interval 2 at any size, as the chart had it) (chart,torch)
//	BENCH_SIDECAR_SCALE_PER_PROC  RendezvousScale: participants per Python process (128)
//	BENCH_SIDECAR_SCALE_WINDOW    RendezvousScale: steady keep-alives measured for (20s)
//	BENCH_SIDECAR_SCALE_TIMEOUT   RendezvousScale: a first round not formed by then is reported as such (5m)
//	BENCH_SIDECAR_BACKEND_NODES       ElasticTrainingBackendScale: sizes, comma-separated (64,256,1024,4096)
//	BENCH_SIDECAR_BACKEND_BASELINE_TIMEOUT  ElasticTrainingBackendScale: c10d's rounds not formed by then are reported as such (2m)
//	BENCH_SIDECAR_C10D_CLIENTS    C10dClients: concurrent clients (16384)
//	BENCH_SIDECAR_RACE_NODES      C10dJoinRace: sizes, comma-separated (256,512,1024)
//	BENCH_SIDECAR_RACE_TIMEOUT    C10dJoinRace: a race not done by then is reported as such (3m)
//	BENCH_SIDECAR_C10D_CONNS  client connections of C10dLoad's points, comma-separated (64,256,1024)
//	BENCH_SIDECAR_C10D_TIME   duration of each C10dLoad point (5s)
//	BENCH_SIDECAR_C10D_PIN    C10dLoad: the store on the last CPU, the load client on the others (taskset),
//	                          so that neither takes the other's CPU: torch's server is one thread, ours
//	                          as many as it gets (true)
//	BENCH_SIDECAR_IDLE_CONNS  idle connections of C10dRSS (1000)
//	BENCH_SIDECAR_SUITE       trainer root filesystem that runs torch (forky: torch 2.14)
//	BENCH_SIDECAR_PYTHON      a python3 with torch on this machine that runs the Python programs instead of
//	                          that root filesystem (torchrun still needs it), e.g. on a machine of more cores
//	BENCH_SIDECAR_BIN         a built rdzv-sidecar, for a machine without Go (none: TestMain builds it)
//
// The repetition counts are per benchmark iteration: -benchtime 1x runs
// each measurement once.
package sidecar_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

// sidecarBin is rdzv-sidecar, built by TestMain.
var sidecarBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if flag.Lookup("test.bench").Value.String() == "" {
		os.Exit(m.Run()) // no benchmark to run (go test ./...): nothing to build
	}
	fmt.Printf("rdzv-sidecar benchmarks (%s, %d CPUs)\n\n", time.Now().UTC().Format(time.RFC3339), numCPU())
	// A machine without Go (one of more cores) runs a compiled benchmark
	// with the rdzv-sidecar built beside it.
	if sidecarBin = os.Getenv("BENCH_SIDECAR_BIN"); sidecarBin != "" {
		os.Exit(m.Run())
	}
	os.Exit(testenv.MainWithCommand(m, "./cmd/rdzv-sidecar", &sidecarBin))
}

// numCPU is how many CPUs this process may use, as nproc counts them.
func numCPU() int {
	out, _ := exec.Command("nproc").Output()
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

// knob is the setting BENCH_SIDECAR_<name> read with parse; def when it is
// unset or empty.
func knob[T any](b *testing.B, name string, def T, parse func(string) (T, error)) T {
	b.Helper()
	return testenv.Knob(b, "BENCH_SIDECAR_"+name, def, parse)
}

// count parses a positive whole number.
func count(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err == nil && n <= 0 {
		err = errors.New("want a positive number")
	}
	return n, err
}

// torchRoot is the root filesystem that runs torch, found (and its torch
// version printed) by the first benchmark that runs torch; torchFound says
// that this happened (torchRoot stays empty with BENCH_SIDECAR_PYTHON).
var (
	torchRoot  string
	torchFound bool
)

// hostPython is BENCH_SIDECAR_PYTHON: a python3 with torch (and python-etcd
// for etcd-v2) on this machine that runs the benchmarks' Python programs
// instead of the trainer root filesystem, e.g. on a machine of more cores
// where that is not built. Programs other than python (torchrun) need the
// root filesystem.
func hostPython(b *testing.B) string {
	return knob(b, "PYTHON", "", func(s string) (string, error) { return exec.LookPath(s) })
}

// findTorch finds torch once and prints its version, before any clock starts.
func findTorch(b *testing.B) {
	b.Helper()
	if torchFound {
		return
	}
	if py := hostPython(b); py != "" {
		out, err := exec.Command(py, "-c", "import torch; print(torch.__version__)").CombinedOutput()
		if err != nil {
			b.Fatalf("BENCH_SIDECAR_PYTHON=%s: import torch: %v\n%s", py, err, out)
		}
		fmt.Printf("   torch %s (%s)\n", strings.TrimSpace(string(out)), py)
	} else {
		suite := knob(b, "SUITE", testenv.SuiteForky, func(s string) (string, error) { return s, nil })
		torchRoot = testenv.Rootfs(b, suite)
		v, err := testenv.RootfsTorchVersion(torchRoot)
		if err != nil {
			b.Fatal(err)
		}
		fmt.Printf("   torch %s (%s)\n", v, torchRoot)
	}
	torchFound = true
}

// torchCmd runs name (a path in the trainer root filesystem) there, or
// with BENCH_SIDECAR_PYTHON, /usr/bin/python3 as that python.
func torchCmd(b *testing.B, name string, args ...string) *exec.Cmd {
	b.Helper()
	findTorch(b)
	if py := hostPython(b); py != "" {
		if name != "/usr/bin/python3" {
			b.Fatalf("BENCH_SIDECAR_PYTHON runs Python programs only; %s needs the trainer root filesystem", name)
		}
		return exec.Command(py, args...)
	}
	return testenv.InRootfs(torchRoot, name, args...)
}

// startTorch runs name with torchCmd and testenv.TorchEnv(env...).
func startTorch(b *testing.B, procName string, env []string, name string, args ...string) *testenv.Proc {
	b.Helper()
	cmd := torchCmd(b, name, args...)
	cmd.Env = testenv.TorchEnv(env...)
	return testenv.Start(b, procName, cmd)
}

// grace is how long a stopped process has between SIGTERM and SIGKILL.
const grace = 15 * time.Second

// server is either the sidecar (serve) or etcd 3.4.
type server struct {
	*testenv.Proc
	clientURL string
	c10d      string // the sidecar's c10d store, host:port
}

func startSidecar(b *testing.B, extra ...string) *server {
	b.Helper()
	return startSidecarIn(b, "", extra...)
}

// startSidecarIn is startSidecar with serve in the cgroup whose cgroup.procs file is procs ("": this one's).
func startSidecarIn(b *testing.B, procs string, extra ...string) *server {
	b.Helper()
	client := fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(b))
	health := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(b))
	c10d := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(b))
	args := append([]string{"serve", "--data-dir=" + filepath.Join(b.TempDir(), "data"), "--listen-client-urls=" + client,
		"--advertise-client-urls=" + client, fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", testenv.FreePort(b)),
		"--health-addr=" + health, "--c10d-addr=" + c10d}, extra...)
	p := testenv.Start(b, "serve", inCgroup(procs, sidecarBin, args...))
	testenv.WaitHTTP(b, p, "http://"+health+"/readyz", http.StatusOK, 60*time.Second)
	return &server{Proc: p, clientURL: client, c10d: c10d}
}

// inCgroup is the command that runs name with args in the cgroup whose cgroup.procs file is procs ("": this one's),
// joined before it starts, so that everything it starts is counted there too.
func inCgroup(procs, name string, args ...string) *exec.Cmd {
	if procs == "" {
		return exec.Command(name, args...)
	}
	return exec.Command("/bin/sh", append([]string{"-c", `echo $$ > "$0" && exec "$@"`, procs, name}, args...)...)
}

func startEtcd34(b *testing.B) *server {
	b.Helper()
	// With fsync, unlike testenv.Etcd34: both servers run with their default durability.
	p, client := testenv.StartEtcd34(b, filepath.Join(b.TempDir(), "data"))
	return &server{Proc: p, clientURL: client}
}

// trainScript is what the agents run: the integration tests' training script.
func trainScript() string {
	return filepath.Join(testenv.RepoRoot(), "test/integration/sidecar/testdata/train.py")
}

// firstRendezvous starts 4 agents at once through endpoint (host:port) and
// returns the time until every worker printed its all_reduce RESULT (world
// formed and used) and its agent exited.
func firstRendezvous(b *testing.B, endpoint, backend, runID string) time.Duration {
	b.Helper()
	findTorch(b) // before the clock starts
	t0 := time.Now()
	var ps []*testenv.Proc
	for i := range 4 {
		ps = append(ps, startTorch(b, fmt.Sprintf("%s-agent%d", runID, i), nil, "/usr/bin/torchrun",
			append(testenv.TorchrunArgs(backend, endpoint, runID, "4"), trainScript())...))
	}
	var last time.Duration
	for _, p := range ps {
		if err := p.Wait(b, 300*time.Second); err != nil {
			b.Fatalf("%s failed: %v\n%s", p.Name, err, p.Output())
		}
		if d := time.Since(t0); d > last {
			last = d
		}
	}
	return last
}

// alternate is what the repetition rep measures, in order: pair as it is on
// even repetitions, reversed on odd ones, so that a warming page cache
// favours neither.
func alternate[T any](rep int, pair ...T) []T {
	s := slices.Clone(pair)
	if rep%2 == 1 {
		slices.Reverse(s)
	}
	return s
}

func secs(ds []time.Duration) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = fmt.Sprintf("%.3f", d.Seconds())
	}
	return out
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}

func ms(d time.Duration) float64 { return d.Seconds() * 1000 }

func goal(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// waitFile waits until ok holds for path's content, polling every 200 µs
// (the hostfile latency is measured with it).
func waitFile(b *testing.B, path string, ok func(string) bool, timeout time.Duration) {
	b.Helper()
	err := testenv.Poll(b.Context(), timeout, 200*time.Microsecond, func(context.Context) (bool, error) {
		c, _ := os.ReadFile(path)
		return ok(string(c)), nil
	})
	if err != nil {
		b.Fatalf("%s did not reach the expected content: %v", path, err)
	}
}

func rssMiB(b *testing.B, pid int) float64 { return statusMiB(b, pid, "VmRSS") }

// statusMiB is field (e.g. "VmRSS") of /proc/<pid>/status in MiB.
func statusMiB(b *testing.B, pid int, field string) float64 {
	b.Helper()
	n, err := testenv.StatusBytes(pid, field)
	if err != nil {
		b.Fatal(err)
	}
	return float64(n) / (1 << 20)
}

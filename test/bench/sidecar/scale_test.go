package sidecar_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/mutate"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

// The rendezvous at the scale of real jobs: N of torch's own
// DynamicRendezvousHandler participants (testdata/scale_agents.py, many per
// process, driven as torchrun's agent drives them) through the sidecar and,
// in the same run, through the baseline: torch's TCPStore server (c10d) or
// etcd 3.4 (etcd-v2).

// scaleSettings are the rendezvous settings of a run of n nodes (max
// nodes n+1): the chart's as the webhook renders them for that size
// (internal/mutate), the chart's before they grew with the job ("before":
// keep_alive_interval 2 at any size), or torch's own (torch 2.14's
// create_handler and torchrun defaults).
type scaleSettings struct {
	name     string
	conf     string  // --rdzv-conf
	monitor  float64 // torchrun's --monitor-interval, seconds
	lastCall time.Duration
}

func settingsFor(name string, n int) (scaleSettings, bool) {
	const chart = "last_call_timeout=2,keep_alive_max_attempt=3,join_timeout=1800,keep_alive_interval="
	switch name {
	case "chart":
		d := mutate.DefaultConfig().Defaults
		return scaleSettings{name, chart + strconv.Itoa(mutate.KeepAliveInterval(d.KeepAliveInterval, n+1)), mutate.MonitorInterval(d.MonitorInterval, n+1), 2 * time.Second}, true
	case "before":
		return scaleSettings{name, chart + "2", 1, 2 * time.Second}, true
	case "torch":
		return scaleSettings{name, "join_timeout=1800", 0.1, 30 * time.Second}, true
	}
	return scaleSettings{}, false
}

// baselineOf is the server each backend is compared with.
var baselineOf = map[string]string{"c10d": "torch", "etcd-v2": "etcd-3.4"}

// scaleResult is one run of one server.
type scaleResult struct {
	// Whether each round formed within the timeout, and if not, how many
	// participants had completed it then.
	formed, joined, left      bool
	inRound, joinedBy, leftBy int
	// inState is, for a round that did not form, the most participants
	// that any of them saw in torch's state then: how far it got.
	inState            int
	first, join, leave time.Duration
	reads, writes      float64 // state reads and compare-and-set writes a second, steady keep-alives
	lost               float64 // share of the writes that lost the compare-and-set
	serverCPU          float64 // the server's CPU, cores, steady keep-alives
	clientCPU          float64 // the participants' processes' CPU, cores
	serverRSS          float64 // MiB at the window's end
}

// BenchmarkRendezvousScale: a sub-benchmark per backend, settings and N;
// each runs the sidecar and its baseline, alternating which goes first.
func BenchmarkRendezvousScale(b *testing.B) {
	raiseNoFile(b)
	sizes := knob(b, "SCALE_NODES", []int{64, 256, 1024}, counts)
	perProc := knob(b, "SCALE_PER_PROC", 128, count)
	window := knob(b, "SCALE_WINDOW", 20*time.Second, time.ParseDuration)
	timeout := knob(b, "SCALE_TIMEOUT", 5*time.Minute, time.ParseDuration)
	backends := knob(b, "SCALE_BACKENDS", []string{"c10d", "etcd-v2"}, words)
	settings := knob(b, "SCALE_SETTINGS", []string{"chart", "torch"}, words)
	fmt.Printf("== rendezvous at scale: N torch DynamicRendezvousHandler participants (%d per process, is_host=false on c10d), "+
		"the sidecar vs its baseline; steady keep-alives measured for %s\n", perProc, window)
	fmt.Printf("   first: go → every participant done with round 1 (nnodes N:N+1, so it includes last_call); join: one " +
		"more node's start → all N+1 in a new round; leave: the preStop script (leave_rendezvous.py) takes it out, " +
		"it is killed and the survivors restart → all N in a new round\n")
	findTorch(b)
	i := 0
	for _, backend := range backends {
		for _, set := range settings {
			for _, n := range sizes {
				st, ok := settingsFor(set, n)
				if !ok {
					b.Fatalf("BENCH_SIDECAR_SCALE_SETTINGS: %q is none of chart, before, torch", set)
				}
				b.Run(fmt.Sprintf("%s/%s/nodes=%d", backend, set, n), func(b *testing.B) {
					res := map[string]scaleResult{}
					// Each run's figures as soon as it ends: a run of 1,024
					// nodes can take minutes.
					for _, kind := range alternate(i, "sidecar", baselineOf[backend]) {
						res[kind] = scaleRun(b, backend, kind, st, n, perProc, window, timeout)
						fmt.Printf("   %-7s %-6s N=%-5d | %-8s: %s\n", backend, st.name, n, kind, res[kind])
					}
					i++
					reportScale(b, backend, st.name, n, res["sidecar"], res[baselineOf[backend]])
				})
			}
		}
	}
	fmt.Println()
}

func words(s string) ([]string, error) { return strings.Split(s, ","), nil }

func reportScale(b *testing.B, backend, set string, n int, s, t scaleResult) {
	if set == "chart" && n >= 1024 {
		fmt.Printf("   %-7s %-6s N=%-5d | round of %d within 30 s with the chart's defaults: %s\n", "", "", n, n, goal(s.formed && s.first <= 30*time.Second))
	}
	if !s.left || !t.left {
		return
	}
	worst := max(ratio(s.first, t.first), ratio(s.join, t.join), ratio(s.leave, t.leave))
	fmt.Printf("   %-7s %-6s N=%-5d | ratios  : first %.2f join %.2f leave %.2f | server CPU %.2f RSS %.2f | %s (goal: each ≤ 1.10, the spread of two runs)\n",
		"", "", n, ratio(s.first, t.first), ratio(s.join, t.join), ratio(s.leave, t.leave), s.serverCPU/t.serverCPU,
		s.serverRSS/t.serverRSS, goal(worst <= 1.10))
	for name, v := range map[string]float64{"first-s": s.first.Seconds(), "join-s": s.join.Seconds(), "leave-s": s.leave.Seconds(),
		"server-cpu": s.serverCPU, "server-rss-MiB": s.serverRSS} {
		b.ReportMetric(v, "sidecar-"+name)
	}
	b.ReportMetric(ratio(s.first, t.first), "first-ratio")
	b.ReportMetric(ratio(s.join, t.join), "join-ratio")
	b.ReportMetric(ratio(s.leave, t.leave), "leave-ratio")
}

func ratio(a, b time.Duration) float64 { return a.Seconds() / b.Seconds() }

func (r scaleResult) String() string {
	switch {
	case !r.formed:
		return fmt.Sprintf("first round NOT FORMED within %s (%d participants done, %d in torch's state)", r.first, r.inRound, r.inState)
	case !r.joined:
		return fmt.Sprintf("first %7.2fs, after one node joined NOT FORMED within %s (%d participants done, %d in torch's state)",
			r.first.Seconds(), r.join, r.joinedBy, r.inState)
	case !r.left:
		return fmt.Sprintf("first %7.2fs join %7.2fs, after it left NOT FORMED within %s (%d participants done, %d in torch's state)",
			r.first.Seconds(), r.join.Seconds(), r.leave, r.leftBy, r.inState)
	}
	return fmt.Sprintf("first %7.2fs join %7.2fs leave %7.2fs | steady: %6.0f reads/s %6.0f writes/s (%2.0f%% lost the CAS) "+
		"server %.2f cores %6.1f MiB, participants %.2f cores", r.first.Seconds(), r.join.Seconds(), r.leave.Seconds(),
		r.reads, r.writes, 100*r.lost, r.serverCPU, r.serverRSS, r.clientCPU)
}

// scaleServer starts the server kind for backend and returns its process,
// the endpoint torch is given (host:port) and the participants' environment.
// The elastic-training backend's server is the sidecar with n+1 members registered
// (backend_test.go), and its participants find the backend where it installed it.
func scaleServer(b *testing.B, backend, kind string, n int) (*testenv.Proc, string, []string) {
	switch {
	case backend == constants.BackendElasticTraining:
		s, pythonPath := startOwnSidecar(b, n+1)
		return s.Proc, s.c10d, []string{"PYTHONPATH=" + pythonPath}
	case backend == "c10d":
		s := startStore(b, map[string]string{"sidecar": "sidecar", "torch": "torch"}[kind])
		return s.Proc, s.addr, nil
	case kind == "sidecar":
		s := startSidecar(b)
		return s.Proc, strings.TrimPrefix(s.clientURL, "http://"), nil
	default:
		s := startEtcd34(b)
		return s.Proc, strings.TrimPrefix(s.clientURL, "http://"), nil
	}
}

// participants is one scale_agents.py process.
type participants struct {
	*testenv.Proc
	ctrl string
}

func startParticipants(b *testing.B, backend, endpoint, runID, nnodes string, env []string, st scaleSettings, count, first int, ctrl string) *participants {
	script := filepath.Join(testenv.RepoRoot(), "test/bench/sidecar/testdata/scale_agents.py")
	p := startTorch(b, fmt.Sprintf("%s-agents%d", runID, first), env, "/usr/bin/python3", script, backend, endpoint, runID, nnodes,
		strconv.Itoa(count), strconv.Itoa(first), ctrl, strconv.FormatFloat(st.monitor, 'f', -1, 64), st.conf)
	return &participants{Proc: p, ctrl: ctrl}
}

// event is one participant's completed round.
type event struct {
	round, world int
	at           time.Time
}

// lastEvents is each participant's last completed round after since; it
// fails the benchmark on any participant's error.
func lastEvents(b *testing.B, ps []*participants, since time.Time) map[string]event {
	out := map[string]event{}
	for _, p := range ps {
		sc := bufio.NewScanner(strings.NewReader(p.Output()))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) > 0 && f[0] == "ERR" {
				b.Fatalf("%s: %s", p.Name, sc.Text())
			}
			if len(f) != 6 || f[0] != "EV" {
				continue
			}
			round, _ := strconv.Atoi(f[2])
			world, _ := strconv.Atoi(f[4])
			sec, _ := strconv.ParseFloat(f[5], 64)
			at := time.Unix(0, int64(sec*1e9))
			if at.After(since) {
				out[f[1]] = event{round: round, world: world, at: at}
			}
		}
	}
	return out
}

// waitRound waits until want participants have completed a round of world
// after since, and returns the time from since to the last of them; after
// timeout it returns how many had and false.
func waitRound(b *testing.B, ps []*participants, want, world int, since time.Time, timeout time.Duration) (time.Duration, int, bool) {
	b.Helper()
	var last time.Time
	n := 0
	err := testenv.Poll(b.Context(), timeout, 100*time.Millisecond, func(context.Context) (bool, error) {
		for _, p := range ps {
			select {
			case <-p.Done():
				b.Fatalf("%s exited: %v\n%s", p.Name, p.Err(), tail(p.Output(), 3000))
			default:
			}
		}
		last, n = time.Time{}, 0
		for _, e := range lastEvents(b, ps, since) {
			if e.world == world {
				n++
				if e.at.After(last) {
					last = e.at
				}
			}
		}
		return n >= want, nil
	})
	if err != nil {
		return timeout, n, false
	}
	return last.Sub(since), n, true
}

func tail(s string, n int) string { return s[max(0, len(s)-n):] }

func touch(b *testing.B, dir, name string) {
	b.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
		b.Fatal(err)
	}
}

// opsTotal sums the participants' state reads, writes and lost writes, and
// gives the most participants any of them saw in torch's state.
func opsTotal(b *testing.B, ps []*participants) (reads, writes, lost float64, inState int) {
	for _, p := range ps {
		c, err := os.ReadFile(filepath.Join(p.ctrl, fmt.Sprintf("ops-%d", p.Cmd.Process.Pid)))
		if err != nil {
			b.Fatalf("%s's operation counts: %v", p.Name, err)
		}
		var r, w, l float64
		var seen int
		if _, err := fmt.Sscan(string(c), &r, &w, &l, &seen); err != nil {
			b.Fatalf("%s's operation counts %q: %v", p.Name, c, err)
		}
		reads, writes, lost, inState = reads+r, writes+w, lost+l, max(inState, seen)
	}
	return reads, writes, lost, inState
}

func cpuOf(b *testing.B, ps ...*testenv.Proc) float64 {
	sum := 0.0
	for _, p := range ps {
		s, err := testenv.CPUSeconds(p.Cmd.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		sum += s
	}
	return sum
}

// scaleRun measures one server: the first round of n, steady keep-alives
// for window, a node joining and the same node leaving.
func scaleRun(b *testing.B, backend, kind string, st scaleSettings, n, perProc int, window, timeout time.Duration) scaleResult {
	b.Helper()
	server, endpoint, env := scaleServer(b, backend, kind, n)
	defer server.Stop(grace)
	runID := fmt.Sprintf("scale-%s-%d", kind, n)
	nnodes := fmt.Sprintf("%d:%d", n, n+1)
	ctrl := b.TempDir()
	var ps []*participants
	defer func() {
		touch(b, ctrl, "stop")
		for _, p := range ps {
			p.Kill()
		}
	}()
	for first := 0; first < n; first += perProc {
		ps = append(ps, startParticipants(b, backend, endpoint, runID, nnodes, env, st, min(perProc, n-first), first, ctrl))
	}
	for _, p := range ps {
		testenv.WaitOutput(b, p.Proc, "READY", 5*time.Minute)
	}
	var r scaleResult
	t0 := time.Now()
	touch(b, ctrl, "go")
	var formed bool
	if r.first, r.inRound, formed = waitRound(b, ps, n, n, t0, timeout); !formed {
		_, _, _, r.inState = opsTotal(b, ps)
		return r
	}
	r.formed = true

	// Steady keep-alives: a fixed settle after the round (the heartbeat
	// threads start as each participant completes it), then the window: a rate
	// over a fixed time, not a wait for a condition.
	time.Sleep(5 * time.Second)
	procs := []*testenv.Proc{}
	for _, p := range ps {
		procs = append(procs, p.Proc)
	}
	r0, w0, l0, _ := opsTotal(b, ps)
	s0, c0, tw := cpuOf(b, server), cpuOf(b, procs...), time.Now()
	time.Sleep(window)
	r1, w1, l1, _ := opsTotal(b, ps)
	s1, c1, el := cpuOf(b, server), cpuOf(b, procs...), time.Since(tw).Seconds()
	r.reads, r.writes = (r1-r0)/el, (w1-w0)/el
	if w1 > w0 {
		r.lost = (l1 - l0) / (w1 - w0)
	}
	r.serverCPU, r.clientCPU = (s1-s0)/el, (c1-c0)/el
	r.serverRSS = rssMiB(b, server.Cmd.Process.Pid)

	// One node joins: its own process (its own pid, as the preStop script
	// finds an agent by pid) and control directory.
	jctrl := b.TempDir()
	joiner := startParticipants(b, backend, endpoint, runID, nnodes, env, st, 1, n, jctrl)
	testenv.WaitOutput(b, joiner.Proc, "READY", 5*time.Minute)
	all := append(ps, joiner)
	t1 := time.Now()
	touch(b, jctrl, "go")
	if r.join, r.joinedBy, r.joined = waitRound(b, all, n+1, n+1, t1, timeout); !r.joined {
		_, _, _, r.inState = opsTotal(b, all)
		return r
	}

	// It leaves as a pod does: the preStop script, then SIGKILL; the
	// survivors' workers fail and the agents restart. (The elastic-training backend
	// tells them to restart at the preStop script's word: their workers'
	// failure would come after.)
	t2 := time.Now()
	leave := leaveRendezvous(b, backend, endpoint, runID, nnodes, fmt.Sprintf("node-%d", n), st, joiner)
	joiner.Kill()
	if backend != constants.BackendElasticTraining {
		touch(b, ctrl, "restart-1")
	}
	if r.leave, r.leftBy, r.left = waitRound(b, ps, n, n, t2, timeout); !r.left {
		_, _, _, r.inState = opsTotal(b, ps)
	}
	if !strings.Contains(leave, "left the rendezvous before stopping") {
		b.Fatalf("the preStop script did not take node-%d out of the rendezvous:\n%s", n, leave)
	}
	return r
}

// leaveRendezvous runs the trainer's preStop script (internal/prestop) for
// the joiner's agent, with the environment the webhook gives a trainer.
func leaveRendezvous(b *testing.B, backend, endpoint, runID, nnodes, addr string, st scaleSettings, p *participants) string {
	b.Helper()
	dir, torchHalf := filepath.Join(testenv.RepoRoot(), "internal/prestop"), filepath.Join(testenv.RepoRoot(), "internal/torchbackends/torchleave")
	conf := st.conf
	if backend == "c10d" {
		conf += ",is_host=false"
	}
	code := fmt.Sprintf("import sys; sys.path[:0] = [%q, %q]; import leave_rendezvous as l; l.leave_rendezvous({%d})", dir, torchHalf, p.Cmd.Process.Pid)
	cmd := torchCmd(b, "/usr/bin/python3", "-c", code)
	cmd.Env = testenv.TorchEnv("PET_RDZV_BACKEND="+backend, "PET_RDZV_ENDPOINT="+endpoint, "PET_RDZV_ID="+runID,
		"PET_NNODES="+nnodes, "PET_LOCAL_ADDR="+addr,
		"PET_RDZV_CONF="+conf, "ET_LEAVE_LOG=-")
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("preStop script: %v\n%s", err, out)
	}
	return string(out)
}

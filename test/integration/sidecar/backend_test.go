package sidecar_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/torchview"
	"github.com/elastic-training/elastic-training/internal/trainerpy"
)

// ownRdzv is a serving sidecar that installs the backend and follows the
// membership, and agents on loopback addresses of their own (127.0.0.N:
// distinct member hosts that the workers can reach), each a member through a
// joining sidecar of its own, as each pod has one.
type ownRdzv struct {
	tr    trainer
	s     *server
	files string
	args  []string // torchrun's, without --local_addr and the script
	env   []string
	// ckptMemory is each pod's --checkpoint-memory (startCkpt; "": 64Mi).
	ckptMemory string
}

func newOwnRdzv(t testing.TB, tr trainer, runID, nnodes string, env ...string) *ownRdzv {
	t.Helper()
	return newOwnRdzvServe(t, tr, runID, nnodes, nil, env...)
}

// newOwnRdzvServe is newOwnRdzv with serve's flags serveArgs added.
func newOwnRdzvServe(t testing.TB, tr trainer, runID, nnodes string, serveArgs []string, env ...string) *ownRdzv {
	t.Helper()
	files := t.TempDir()
	o := &ownRdzv{tr: tr, files: files}
	o.s = startServe(t, append([]string{"--register=false", ownBackend, "--files-dir=" + files}, serveArgs...)...)
	o.args = testenv.TorchrunArgs(trainerpy.Backend, o.s.C10d, runID, nnodes, "--max_restarts=5", "--rdzv_conf=last_call_timeout=1")
	o.env = torchrunEnv(append([]string{"PYTHONPATH=" + filepath.Join(files, trainerpy.Dir)}, env...)...)
	return o
}

// ownBackend is what the webhook tells a serving sidecar of a job on the elastic-training backend: torch's own backends'
// handlers (the view of their pickled state, the survivors' restarter) stay off.
var ownBackend = "--backend=" + constants.BackendElasticTraining

// node is agent i with its joining sidecar.
type node struct {
	agent, join *testenv.Proc
	host        string
}

func (o *ownRdzv) start(t testing.TB, i int) node {
	t.Helper()
	return o.startAs(t, i, fmt.Sprintf("127.0.0.%d", i+1))
}

// startAs is start with member host host and env added to the agent's.
func (o *ownRdzv) startAs(t testing.TB, i int, host string, env ...string) node {
	t.Helper()
	join := startJoin(t, o.s.URL, host, 1, "", fmt.Sprintf("--member-index=%d", i))
	args := append(append([]string{"--local_addr=" + host}, o.args...), trainScript(t))
	agent := o.tr.startAgent(t, fmt.Sprintf("agent-%d", i), append(slices.Clip(o.env), env...), args...)
	return node{agent: agent, join: join, host: host}
}

// Two agents of torch 2.14 and 2.6 form a round through the sidecar's own
// rendezvous (the entry point found on PYTHONPATH), all_reduce, and exit 0.
func TestElasticTrainingBackendTwoAgents(t *testing.T) {
	forEachTorch(t, func(t *testing.T, tr trainer) {
		o := newOwnRdzv(t, tr, "own-two", "2")
		a, b := o.start(t, 0), o.start(t, 1)
		requireTwoWorkerResults(t, a.agent, b.agent)
		require.Regexp(t, `torch rendezvous round 1 of run own-two complete: 2 nodes" .*backend=elastic-training`, o.s.Output())
		require.Contains(t, a.agent.Output(), "RESULT rank=0 ", "ranks follow the member index")
		require.Contains(t, b.agent.Output(), "RESULT rank=1 ")
		require.NotContains(t, o.s.Output(), "/torch.rendezvous.", "torch's own rendezvous played no part")
		metrics := httpGet(t, "http://"+o.s.Health+"/metrics")
		require.NotContains(t, metrics, "elastic_training_sidecar_survivor_restarts_total", "the survivors' restarter of torch's c10d backend is wired")
		require.Contains(t, metrics, "elastic_training_sidecar_rendezvous_rounds_total", "the view of the rounds is not wired")
	})
}

// The workers reach their rank 0 by the pod's IP (ET_POD_IP, which the
// webhook gives the trainer from the downward API), not by its member host:
// in a pod the host is its DNS name, which resolves to two addresses while a
// lost pod's replacement starts beside the old one still Terminating on a
// node cut off, and a worker that picks the old one waits minutes for TCP.
// Here the hosts resolve to nothing at all (.invalid): workers told one as
// MASTER_ADDR never reach their store (they retry the name until the test
// gives up).
func TestElasticTrainingBackendMasterAddrIsThePodIP(t *testing.T) {
	forEachTorch(t, func(t *testing.T, tr trainer) {
		o := newOwnRdzv(t, tr, "own-ip", "2")
		var n [2]node
		for i := range n {
			n[i] = o.startAs(t, i, fmt.Sprintf("own-%d.elastic-training.invalid", i), fmt.Sprintf("%s=127.0.0.%d", constants.EnvMemberIP, i+1))
		}
		requireTwoWorkerResults(t, n[0].agent, n[1].agent)
		require.Contains(t, n[0].agent.Output(), "RESULT rank=0 ")
		for _, a := range n {
			require.Regexp(t, `master_addr=127\.0\.0\.1\s`, a.agent.Output(), "the workers were told rank 0's IP")
		}
	})
}

// An elastic run --nnodes=2:3 on the elastic-training backend: a third agent joins
// (world 3), then its node vanishes (agent and sidecar killed: its
// registration ends with its lease) and the survivors train on at world 2.
func TestElasticTrainingBackendGrowAndLoseANode(t *testing.T) {
	forEachTorch(t, func(t *testing.T, tr trainer) {
		o := newOwnRdzv(t, tr, "own-elastic", "2:3", "TRAIN_STEPS=100000", "STEP_SLEEP=0.3")
		a, b := o.start(t, 0), o.start(t, 1)
		waitWorldAfter(t, a.agent, "world 2", "2", 0)
		waitWorldAfter(t, b.agent, "world 2", "2", 0)

		start := time.Now()
		c := o.start(t, 2)
		at3 := waitWorldAfter(t, a.agent, "world 3 after a third agent started", "3", 0)
		t.Logf("torch %s elastic-training backend: scale-up 2→3 took %s (from the new agent's start)", tr.version, time.Since(start).Round(100*time.Millisecond))
		waitWorldAfter(t, c.agent, "world 3 on the new agent", "3", 0)

		start = time.Now()
		c.join.Kill()
		c.agent.Kill()
		waitWorldAfter(t, a.agent, "world 2 after the third node vanished", "2", at3)
		t.Logf("torch %s elastic-training backend: node lost 3→2 took %s (lease TTL 2 s)", tr.version, time.Since(start).Round(100*time.Millisecond))
		require.Regexp(t, `torch rendezvous round 3 of run own-elastic complete: 2 nodes" .*backend=elastic-training`, o.s.Output())
		for _, n := range []node{a, b} {
			n.agent.Signal(syscall.SIGKILL)
		}
	})
}

// A scale-down on the elastic-training backend: the stopping pod's preStop script sets
// its member's leave key, the survivors re-form at once, and the agent's
// SIGTERM closes nothing, on torch 2.6 too (whose own handler closes the
// whole rendezvous then): no SIGKILL.
func TestElasticTrainingBackendLeaveBeforeStop(t *testing.T) {
	forEachTorch(t, func(t *testing.T, tr trainer) {
		o := newOwnRdzv(t, tr, "own-leave", "2:3", "TRAIN_STEPS=100000", "STEP_SLEEP=0.3")
		a, b, c := o.start(t, 0), o.start(t, 1), o.start(t, 2)
		var at3 int
		for _, n := range []node{a, b, c} {
			i := waitWorldAfter(t, n.agent, "world 3 on "+n.agent.Name, "3", 0)
			if n == a {
				at3 = i
			}
		}
		start := time.Now()
		out := runLeave(t, tr, o.files, "PET_RDZV_BACKEND="+trainerpy.Backend, "PET_RDZV_ENDPOINT="+o.s.C10d, "PET_RDZV_ID=own-leave",
			"PET_NNODES=2:3", "PET_LOCAL_ADDR="+c.host, "ET_LEAVE_AGENT_PID="+strconv.Itoa(c.agent.Cmd.Process.Pid))
		t.Logf("preStop script took %s: %s", time.Since(start).Round(10*time.Millisecond), strings.TrimSpace(out))
		require.Contains(t, out, `msg="left the rendezvous before stopping"`)
		require.NotContains(t, out, "SIGKILL")
		c.agent.Signal(syscall.SIGTERM)
		waitWorldAfter(t, a.agent, "world 2 after the preStop and SIGTERM", "2", at3)
		t.Logf("torch %s elastic-training backend: preStop + SIGTERM -> survivors at world 2: %s", tr.version, time.Since(start).Round(100*time.Millisecond))
		c.agent.Wait(t, 60*time.Second) // torchrun exits 1 on SIGTERM (torch's SignalException), whatever the backend
		rounds := strings.Count(o.s.Output(), "torch rendezvous round")
		c.join.Signal(syscall.SIGTERM) // then its pod's sidecar, as Kubernetes stops a native sidecar last
		require.NoError(t, c.join.Wait(t, 30*time.Second), "the sidecar deregisters and exits:\n%s", c.join.Output())
		// The serving sidecar hears of the departure (the listeners run right after this line): it must change nothing.
		testenv.WaitOutput(t, o.s.Proc, `left=`+c.host, 30*time.Second)
		var v torchview.View
		require.NoError(t, json.Unmarshal([]byte(httpGet(t, "http://"+o.s.Health+"/rendezvous")), &v))
		require.True(t, v.Complete, "/rendezvous after the member left: %+v", v)
		require.Equal(t, 2, v.WorldSize)
		require.Equal(t, rounds, strings.Count(o.s.Output(), "torch rendezvous round"), "no new round for a member already out")
		require.NotContains(t, a.agent.Output()+b.agent.Output()+c.agent.Output(), "RendezvousClosedError")
		require.Equal(t, "2", lastWorld(a.agent.Output()), "the survivors train on at world 2")
	})
}

// lastWorld is the last world size p's workers reported.
func lastWorld(out string) string {
	ws := worldSizes(out)
	if len(ws) == 0 {
		return ""
	}
	return ws[len(ws)-1]
}

// waitWorldAfter waits until p's workers report world want past offset after
// in its output, and returns where.
func waitWorldAfter(t *testing.T, p interface{ Output() string }, phase, want string, after int) int {
	t.Helper()
	var at int
	testenv.Eventually(t, 150*time.Second, phase, func() error {
		out := p.Output()
		i := strings.LastIndex(out, "world="+want+" ")
		if i < after || i < 0 {
			return fmt.Errorf("no world=%s step yet; sizes so far %v", want, worldSizes(out))
		}
		at = i
		return nil
	})
	return at
}

// At a job's install the trainers start with their pods' sidecars (the startup probe's /startz), before the store
// serves and before their pods are members: each agent's store connection waits in its own sidecar's proxy (up to
// --c10d-wait), torch's store client connects again until read_timeout, the backend starts over until the join
// timeout (3 s each here, a minute each in a pod), and the first round takes both agents once the store serves and
// both pods registered. On torch 2.14 and 2.6.
func TestElasticTrainingBackendAgentsStartBeforeTheStore(t *testing.T) {
	forEachTorch(t, func(t *testing.T, tr trainer) {
		s := newServe(t, "--register=false", ownBackend, "--files-dir="+t.TempDir()) // not started yet
		var agents []*testenv.Proc
		for i := range 2 {
			host, files := fmt.Sprintf("127.0.0.%d", i+1), t.TempDir()
			proxy := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			health := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			join := testenv.Start(t, "join "+host, exec.Command(sidecarBin, "join", "--endpoints="+s.URL, "--health-addr="+health,
				"--member-host="+host, fmt.Sprintf("--member-index=%d", i), "--lease-ttl=2s", "--files-dir="+files,
				"--c10d-addr="+proxy, "--c10d-upstream="+s.C10d, "--c10d-wait=3s"))
			// What the kubelet asks before it starts the trainer; /readyz says no until the pod is a member.
			testenv.WaitHTTP(t, join, "http://"+health+"/startz", http.StatusOK, 30*time.Second)
			require.NoError(t, testenv.CheckHTTP(t.Context(), "http://"+health+"/readyz", http.StatusServiceUnavailable))
			args := append(testenv.TorchrunArgs(trainerpy.Backend, proxy, "own-early", "2", "--rdzv_conf=last_call_timeout=1,read_timeout=3",
				"--local_addr="+host), trainScript(t))
			agents = append(agents, tr.startAgent(t, fmt.Sprintf("agent-%d", i), torchrunEnv("PYTHONPATH="+filepath.Join(files, trainerpy.Dir)), args...))
		}
		for _, a := range agents {
			testenv.WaitOutput(t, a, "did not answer (", 90*time.Second)
		}
		s.start(t)
		requireTwoWorkerResults(t, agents...)
		require.Regexp(t, `torch rendezvous round 1 of run own-early complete: 2 nodes" .*backend=elastic-training`, s.Output())
	})
}

// The store goes away under a running job and a fresh one takes its place, as when the pod that serves it is lost
// and a standby or the rendezvous Deployment's next pod serves (the agents' connections go through their pods'
// sidecars, which close them once their registrations end): the agents stay up, stop their workers, wait for the
// next store and train on in its first round. An agent that exited there failed its pod (restartPolicy Never, a
// preemptible group), which the Job replaced only after its back-off. On torch 2.14 and 2.6.
func TestElasticTrainingBackendOutlivesTheStore(t *testing.T) {
	forEachTorch(t, func(t *testing.T, tr trainer) {
		files := t.TempDir()
		s := startServe(t, "--register=false", ownBackend, "--files-dir="+files)
		var agents []*testenv.Proc
		for i := range 2 {
			host := fmt.Sprintf("127.0.0.%d", i+1)
			proxy := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			startJoin(t, s.URL, host, 1, "", fmt.Sprintf("--member-index=%d", i), "--c10d-addr="+proxy, "--c10d-upstream="+s.C10d)
			args := append(testenv.TorchrunArgs(trainerpy.Backend, proxy, "own-outlives", "2", "--max_restarts=0",
				"--rdzv_conf=last_call_timeout=1", "--local_addr="+host), trainScript(t))
			agents = append(agents, tr.startAgent(t, fmt.Sprintf("agent-%d", i), torchrunEnv("PYTHONPATH="+filepath.Join(files, trainerpy.Dir),
				"TRAIN_STEPS=100000", "STEP_SLEEP=0.3"), args...))
		}
		for _, a := range agents {
			waitWorldAfter(t, a, "world 2 on "+a.Name, "2", 0)
		}

		// The store's node vanishes (no goodbye, its etcd's data with it); the next store serves at the same address.
		start, offsets := time.Now(), []int{len(agents[0].Output()), len(agents[1].Output())}
		s.Kill()
		require.NoError(t, os.RemoveAll(s.DataDir))
		s.start(t)
		for i, a := range agents {
			deadline := time.Now().Add(150 * time.Second)
			for !resultRe.MatchString(a.Output()[offsets[i]:]) {
				select {
				case <-a.Done():
					t.Fatalf("%s exited after the store's loss (%v):\n%s", a.Name, a.Err(), a.Output())
				case <-time.After(200 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: no RESULT line of a new round 150 s after the store's loss:\n%s", a.Name, a.Output())
				}
			}
			require.Contains(t, a.Output()[offsets[i]:], "lost the store")
		}
		t.Logf("torch %s elastic-training backend: the store replaced -> both agents' workers train again in %s", tr.version, time.Since(start).Round(100*time.Millisecond))
		require.Regexp(t, `torch rendezvous round 1 of run own-outlives complete: 2 nodes" .*backend=elastic-training`, s.Output())
		// max_restarts=0: the round after the store's loss cost no restart (a membership change, not a failure).
		waitWorldAfter(t, agents[0], "world 2 steps in the new round", "2", offsets[0])
	})
}

// An agent that lost the connection it asked on after a round took it asks again over a new one, for the same
// request, deleting its rank first: the sidecar answers it with that round, where the round's other agent waits for it
// (testdata/ask_again.py drives the backend as torchrun does, with real torch store clients). Before the request id,
// the second ask was a request for round 2, and the agents of round 1 waited for each other until the store's timeout
// (seen on the cluster when the rendezvous pod was replaced: TestRolesAndPriorities, about one run in four). On
// torch 2.14 and 2.6.
func TestElasticTrainingBackendAskAgain(t *testing.T) {
	forEachTorch(t, func(t *testing.T, tr trainer) {
		files := t.TempDir()
		s := startServe(t, "--register=false", ownBackend, "--files-dir="+files)
		const a, b = "127.0.0.1", "127.0.0.2"
		startJoin(t, s.URL, a, 1, "", "--member-index=0")
		script, err := filepath.Abs("testdata/ask_again.py")
		require.NoError(t, err)
		cmd := tr.python(script, s.C10d, "own-ask-again", a, b)
		cmd.Env = torchrunEnv("PYTHONPATH=" + filepath.Join(files, trainerpy.Dir))
		p := testenv.Start(t, "ask_again", cmd)
		testenv.WaitOutput(t, p, "asked", 60*time.Second)
		startJoin(t, s.URL, b, 1, "", "--member-index=1") // B's pod registers: round 1 forms with it
		if err := p.Wait(t, 90*time.Second); err != nil {
			t.Fatalf("ask_again.py: %v\n%s\nsidecar:\n%s", err, p.Output(), s.Output())
		}
		require.Contains(t, p.Output(), "A round=1 rank=0 world=2")
		require.Contains(t, p.Output(), "B round=1 rank=1 world=2", "B gets the round that took it, not a later one")
		require.Contains(t, p.Output(), "lost the store", "B's first connection ended after the round took it")
	})
}

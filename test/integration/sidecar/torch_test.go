package sidecar_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/torchview"
)

var backends = []string{"etcd-v2", "etcd", "c10d"}

// rdzvEndpoint is the sidecar s's address for torchrun's backend: c10d goes
// to its store, the etcd backends to its client port.
func (s *server) rdzvEndpoint(backend string) string {
	if backend == "c10d" {
		return s.C10d
	}
	return strings.TrimPrefix(s.URL, "http://")
}

// Two real torchrun agents rendezvous through the sidecar and all_reduce.
func TestTorchrunTwoAgents(t *testing.T) {
	tr := forky(t)
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			s := startServe(t)
			script := trainScript(t)
			a := tr.startAgent(t, "agent-0", torchrunEnv(), append(testenv.TorchrunArgs(backend, s.rdzvEndpoint(backend), "two-"+backend, "2"), script)...)
			b := tr.startAgent(t, "agent-1", torchrunEnv(), append(testenv.TorchrunArgs(backend, s.rdzvEndpoint(backend), "two-"+backend, "2"), script)...)
			requireTwoWorkerResults(t, a, b)
			// The round, with torch's world size: read from torch's own state (a pickle, on etcd-v2 and c10d).
			testenv.Eventually(t, 5*time.Second, "a round log line", func() error {
				if !strings.Contains(s.Output(), "run_id=two-"+backend+" round=") || !strings.Contains(s.Output(), "world_size=2") {
					return fmt.Errorf("no round line with world_size=2 in serve's log")
				}
				return nil
			})
			var v torchview.View
			require.NoError(t, json.Unmarshal([]byte(httpGet(t, "http://"+s.Health+"/rendezvous")), &v))
			require.Equal(t, "two-"+backend, v.RunID)
			require.Equal(t, 2, v.WorldSize, "/rendezvous: %+v", v)
			if backend != "etcd" {
				require.Len(t, v.Participants, 2)
				for _, p := range v.Participants {
					require.NotNil(t, p.LastHeartbeat, "%s: no keep-alive in torch's state", p.Node)
					require.WithinDuration(t, time.Now(), *p.LastHeartbeat, time.Minute, "torch's keep-alive times are UTC")
				}
			}
			metrics := httpGet(t, "http://"+s.Health+"/metrics")
			require.Contains(t, metrics, `elastic_training_sidecar_rendezvous_rounds_total{backend="`+backend+`"} 1`)
			if backend == "c10d" {
				require.Contains(t, metrics, `elastic_training_sidecar_tcpstore_ops_total{op="COMPARE_SET"}`)
				require.Contains(t, metrics, `elastic_training_sidecar_tcpstore_waiters 0`)
			} else {
				require.Contains(t, metrics, `elastic_training_sidecar_v2_requests_total{op="compareAndSwap",outcome="ok"}`)
				require.Contains(t, metrics, `elastic_training_sidecar_v2_active_waits 0`)
			}
			require.Contains(t, metrics, `etcd_server_has_leader 1`, "etcd's own metrics")
		})
	}
}

// c10d needs nothing but torch: two agents train through the sidecar's store
// in a root filesystem from which python-etcd has been removed.
func TestTorchrunC10dWithoutPythonEtcd(t *testing.T) {
	tr := forky(t)
	s := startServe(t)
	script := trainScript(t)
	// In the command's own overlay: the cached root filesystem keeps python-etcd.
	const noEtcd = `rm -rf /usr/lib/python3/dist-packages/etcd /usr/lib/python3/dist-packages/python_etcd-*
python3 -c 'import etcd' 2>/dev/null && { echo "python-etcd still importable"; exit 99; }
exec /usr/bin/torchrun "$@"`
	var agents []*testenv.Proc
	for _, name := range []string{"agent-0", "agent-1"} {
		cmd := tr.command("/bin/sh", append([]string{"-c", noEtcd, "sh"}, append(testenv.TorchrunArgs("c10d", s.rdzvEndpoint("c10d"), "no-etcd", "2"), script)...)...)
		cmd.Env = torchrunEnv()
		agents = append(agents, testenv.Start(t, name, cmd))
	}
	requireTwoWorkerResults(t, agents[0], agents[1])
	require.Contains(t, s.Output(), "run_id=no-etcd")
}

// A run configured only through PET_* environment variables.
func TestTorchrunPETEnvOnly(t *testing.T) {
	tr := forky(t)
	s := startServe(t)
	env := torchrunEnv("PET_NNODES=2", "PET_NPROC_PER_NODE=1", "PET_RDZV_BACKEND=etcd-v2",
		"PET_RDZV_ENDPOINT="+strings.TrimPrefix(s.URL, "http://"), "PET_RDZV_ID=pet-env", "PET_MONITOR_INTERVAL=1")
	script := trainScript(t)
	a := tr.startAgent(t, "agent-0", env, script)
	b := tr.startAgent(t, "agent-1", env, script)
	for _, p := range []*testenv.Proc{a, b} {
		require.NoError(t, p.Wait(t, 180*time.Second), "%s failed:\n%s", p.Name, p.Output())
		require.Contains(t, p.Output(), "world=2 sum=2")
	}
	require.Contains(t, s.Output(), "run_id=pet-env")
}

// An elastic run --nnodes=2:3 grows to world 3 when a third agent starts and
// shrinks back to 2 when that agent gets SIGTERM: torch 2.14 (forky) on both
// backends, and torch 2.6 (trixie) on etcd-v2. torch 2.6 closes the whole
// rendezvous when an agent gets SIGTERM, so there the third agent is stopped
// as a deleted pod is, with SIGKILL (agent and workers); the preStop script
// does the same after leaving (TestLeaveRendezvousBeforeStop). The scale times it logs are taken beside the
// package's other parallel tests (TestMain).
func TestTorchrunElasticGrowShrink(t *testing.T) {
	t.Parallel() // see TestMain
	forTorchVersions(t, testElasticGrowShrink)
}

func testElasticGrowShrink(t *testing.T, tr trainer, backend string) {
	s := startServe(t)
	script := trainScript(t)
	conf := "--rdzv_conf=last_call_timeout=2"
	args := append(testenv.TorchrunArgs(backend, s.rdzvEndpoint(backend), "elastic-"+backend, "2:3", "--max_restarts=5", conf), script)
	env := torchrunEnv("TRAIN_STEPS=100000", "STEP_SLEEP=0.3")
	a := tr.startAgent(t, "agent-0", env, args...)
	b := tr.startAgent(t, "agent-1", env, args...)
	waitWorld := func(p interface{ Output() string }, phase, want string, after int) int {
		var at int
		testenv.Eventually(t, 150*time.Second, phase, func() error {
			out := p.Output()
			i := strings.LastIndex(out, "world="+want+" ")
			if i < after {
				return fmt.Errorf("no world=%s step yet; sizes so far %v", want, worldSizes(out))
			}
			at = i
			return nil
		})
		return at
	}
	waitWorld(a, "world 2 on agent-0", "2", 0)
	waitWorld(b, "world 2 on agent-1", "2", 0)

	start := time.Now()
	c := tr.startAgent(t, "agent-2", env, args...)
	at3 := waitWorld(a, "world 3 after a third agent started", "3", 0)
	t.Logf("torch %s %s: scale-up 2→3 took %s", tr.version, backend, time.Since(start).Round(100*time.Millisecond))
	waitWorld(c, "world 3 on the new agent", "3", 0)

	start = time.Now()
	stop := "SIGTERM"
	if tr.closesOnSIGTERM() {
		stop = "SIGKILL"
		c.Kill()
	} else {
		c.Signal(syscall.SIGTERM)
	}
	c.Wait(t, 60*time.Second)
	waitWorld(a, "world 2 after the third agent got "+stop, "2", at3)
	t.Logf("torch %s %s: scale-down 3→2 (%s) took %s", tr.version, backend, stop, time.Since(start).Round(100*time.Millisecond))
	require.Contains(t, s.Output(), "run_id=elastic-"+backend)
}

// With the etcd backend the run directory run_<id> has a TTL (7200 s in
// torch; capped to 2 s here): it must outlive that TTL while the job is
// alive, even though torch refreshes it only every TTL/2 (and etcd ≥ 3.5
// refused those refreshes), because the job's keep-alive keys live under it.
func TestRunDirectoryOutlivesTTL(t *testing.T) {
	tr := forky(t)
	const ttl = 2 * time.Second
	s := startServe(t, fmt.Sprintf("--v2-max-dir-ttl=%s", ttl))
	script := trainScript(t)
	env := torchrunEnv("TRAIN_STEPS=40", "STEP_SLEEP=0.25")
	args := append(testenv.TorchrunArgs("etcd", s.rdzvEndpoint("etcd"), "ttl-run", "2"), script)
	a := tr.startAgent(t, "agent-0", env, args...)
	b := tr.startAgent(t, "agent-1", env, args...)

	runDir := s.URL + "/v2/keys/torchelastic/p2p/run_ttl-run"
	var first, last time.Time
	var sawTTL float64
	for {
		select {
		case <-a.Done():
		default:
			code, body, err := v2Get(runDir)
			if err == nil && code == 200 {
				if first.IsZero() {
					first = time.Now()
				}
				last = time.Now()
				if node, ok := body["node"].(map[string]any); ok {
					if ttl, ok := node["ttl"].(float64); ok {
						sawTTL = ttl
					}
				}
			} else if !first.IsZero() && strings.Contains(a.Output(), "RESULT") && !strings.Contains(a.Output(), "STEP 39") {
				t.Fatalf("run directory vanished under a live job after %s (code %d, err %v)", time.Since(first), code, err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		break
	}
	require.NoError(t, a.Err(), a.Output())
	require.NoError(t, b.Wait(t, 60*time.Second), b.Output())
	require.Contains(t, a.Output(), "STEP 39 world=2")
	lived := last.Sub(first)
	t.Logf("run directory lived %s with a %s TTL (reported ttl %v)", lived.Round(100*time.Millisecond), ttl, sawTTL)
	require.Greater(t, lived, 3*ttl, "the job should have run for several TTLs")
	require.LessOrEqual(t, sawTTL, ttl.Seconds()+1, "the TTL cap was not applied")
}

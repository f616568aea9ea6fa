package sidecar_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/mutate"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/torchrunargv"
	"github.com/elastic-training/elastic-training/internal/trainerpy"
)

// warmWorkerRe is a worker's line; its end is matched exactly, as the workers' unbuffered lines may run together.
var warmWorkerRe = regexp.MustCompile(`WORKER rank=(\d) restart=(\d) warm=(True|False) ready=([\d.]+) (helper=\S+ method=\S+ loader=\S+ fork=\S+ pool=\[[^\]]*\] world=\S+ cuda=\S+ badfork=(?:True|False))`)

// TestWarmStart runs one torchrun agent of two workers on the elastic-training backend, torch 2.14 and 2.6, cold (as
// torchrun does by default) and warm (with the env the webhook sets: mutate.WarmStartEnv), and a training program
// doing what users' programs do that a warm start could change (testdata/warm/train.py): each of its workers, in
// both restarts, must import the module beside the script, find no start method set and set its own (a spawn
// Pool), run a data loader with worker processes and os.fork, and print without flushing; a worker killed with
// SIGKILL costs one restart, the agent stops the other with SIGTERM (whose handler exits 0: the worker ends then),
// and a worker's exit code 3 is the failure it reports. Warm, each worker began with torch imported (its age at the
// script's first line is printed, cold and warm), beside the webhook's envFrom probes as the kubelet leaves them
// when envFrom sets none of torchrun's choices; with one set (PET_START_METHOD from a ConfigMap, which the warm
// start's env overrides), the agent starts again cold, with the user's setting, and says so. No GPU here: the check that the fork server never initialised CUDA (elastic_training._warm) is not
// exercised beyond torch's own answer on a CPU build (cuda=False badfork=False).
func TestWarmStart(t *testing.T) {
	script, err := filepath.Abs("testdata/warm/train.py")
	require.NoError(t, err)
	forEachTorch(t, func(t *testing.T, tr trainer) {
		for _, mode := range []string{"cold", "warm", "envFrom"} {
			t.Run(mode, func(t *testing.T) {
				var env []string
				switch mode {
				case "warm":
					// A container with envFrom that sets none of torchrun's choices: the kubelet leaves the webhook's
					// probes as they are.
					env = append(envFromProbes(nil), warmStartEnv()...)
				case "envFrom":
					// Its envFrom sets PET_START_METHOD, which the warm start's env overrides: the agent starts again,
					// cold, with the user's setting.
					env = append(envFromProbes(map[string]string{"PET_START_METHOD": "spawn"}), warmStartEnv()...)
				}
				warm := mode == "warm"
				files := t.TempDir()
				s := startServe(t, "--register=false", ownBackend, "--files-dir="+files)
				args := testenv.TorchrunArgs(trainerpy.Backend, s.C10d, "warm", "1", "--max_restarts=1", "--rdzv_conf=last_call_timeout=1")
				args = slices.DeleteFunc(args, func(a string) bool { return a == "--nproc_per_node=1" })
				args = append(args, "--nproc_per_node=2", "--local_addr=127.0.0.1", script)
				// Without PYTHONUNBUFFERED (which testenv.TorchEnv sets): the program's unflushed lines must reach
				// the log by the workers' own unbuffered output, as with torchrun's python -u.
				agentEnv := slices.DeleteFunc(torchrunEnv(append([]string{"PYTHONPATH=" + filepath.Join(files, trainerpy.Dir)}, env...)...),
					func(kv string) bool { return strings.HasPrefix(kv, "PYTHONUNBUFFERED=") })
				startJoin(t, s.URL, "127.0.0.1", 2, "", "--member-index=0")
				agent := tr.startAgent(t, "agent", agentEnv, args...)
				require.Error(t, agent.Wait(t, 240*time.Second), "rank 0's exit 3 with no restart left fails the agent")
				out := agent.Output()

				seen := map[string]bool{}
				var ready []string
				for _, m := range warmWorkerRe.FindAllStringSubmatch(out, -1) {
					seen["rank="+m[1]+" restart="+m[2]] = true
					require.Equal(t, fmt.Sprint(warm), strings.ToLower(m[3]), "torch imported before the script: %s", m[0])
					require.Equal(t, "helper=42 method=None loader=28.0 fork=7 pool=[1, 4, 9] world=2 cuda=False badfork=False", m[5], m[0])
					ready = append(ready, m[4]+" s")
				}
				require.Equal(t, map[string]bool{"rank=0 restart=0": true, "rank=1 restart=0": true, "rank=0 restart=1": true, "rank=1 restart=1": true},
					seen, "every worker of both attempts (the SIGKILL counted one restart):\n%s", out)
				require.Contains(t, out, "SIGTERM rank=0 restart=0", "the agent stopped the SIGKILLed worker's peer")
				require.Contains(t, out, "SIGTERM rank=1 restart=1", "the agent stopped the failed worker's peer")
				require.Regexp(t, `exitcode\s*: 3 `, out, "the failure reported is the worker's exit code")
				// Each worker that exits 0 on SIGTERM ends then: torch's worker of a function would wait for the
				// agent to read its result, and the agent, stopping its workers, SIGKILLs it 30 s later.
				require.NotContains(t, out, "forcefully exiting via SIGKILL", "a worker outlived its SIGTERM handler's exit")
				if mode == "envFrom" {
					require.Contains(t, out, "the warm start is off in this pod: the container's envFrom sets PET_START_METHOD=spawn")
				} else {
					require.NotContains(t, out, "the warm start is off in this pod")
				}
				t.Logf("torch %s, %s: the workers' age at the script's first line: %s", tr.version, mode, strings.Join(ready, ", "))
			})
		}
	})
}

// TestForkServerAhead: warm, the agent starts its fork server, whose preload imports torch, while it waits for its
// first round, not once that round has formed (elastic_training.rendezvous.create): the import would otherwise delay
// a new pod's first workers, which a scale-up waits for. One agent of a job of at least two waits alone here, and its
// fork server must run meanwhile, with torch's library loaded.
func TestForkServerAhead(t *testing.T) {
	script, err := filepath.Abs("testdata/warm/train.py") // never runs: no round forms
	require.NoError(t, err)
	forEachTorch(t, func(t *testing.T, tr trainer) {
		files := t.TempDir()
		s := startServe(t, "--register=false", ownBackend, "--files-dir="+files)
		args := append(testenv.TorchrunArgs(trainerpy.Backend, s.C10d, "ahead", "2"), "--local_addr=127.0.0.1", script)
		startJoin(t, s.URL, "127.0.0.1", 1, "", "--member-index=0")
		agent := tr.startAgent(t, "agent", torchrunEnv(append([]string{"PYTHONPATH=" + filepath.Join(files, trainerpy.Dir)}, warmStartEnv()...)...), args...)
		pid := agent.Cmd.Process.Pid
		testenv.Eventually(t, time.Minute, "the agent's fork server runs with torch imported", func() error {
			out, err := exec.Command("sh", "-c", fmt.Sprintf(
				`for c in $(pgrep -P %d -f multiprocessing.forkserver); do grep -l libtorch /proc/$c/maps; done`, pid)).Output()
			if err != nil || len(out) == 0 {
				return fmt.Errorf("no fork server with torch loaded under agent %d yet (%v)", pid, err)
			}
			return nil
		})
		require.NotContains(t, agent.Output(), "WORKER", "a worker ran: a round of one formed")
	})
}

// envFromProbes is the webhook's envFrom probes (mutate.EnvFromProbes) as the kubelet expands them for an envFrom
// that sets set, as NAME=value.
func envFromProbes(set map[string]string) []string {
	var env []string
	for _, v := range mutate.EnvFromProbes() {
		value := v.Value
		if x, ok := set[strings.TrimPrefix(v.Name, constants.EnvFromProbePrefix)]; ok {
			value = x
		}
		env = append(env, v.Name+"="+value)
	}
	return env
}

// warmStartEnv is the warm start's env as the webhook sets it (mutate.WarmStartEnv), as NAME=value.
func warmStartEnv() []string {
	var env []string
	for _, v := range mutate.WarmStartEnv() {
		env = append(env, v.Name+"="+v.Value)
	}
	return env
}

// TestTorchrunValuedFlags: the flags that internal/torchrunargv (the webhook's warm start) and the job chart's checks
// (through the generated contract) read as taking a value are torchrun's own, from its argument parser in torch 2.14
// and 2.6: one missing makes its value read as the script (the warm start then judges the wrong word, and the
// chart stops checking there); one torch does not have is a stale name.
func TestTorchrunValuedFlags(t *testing.T) {
	ours := torchrunargv.ValuedFlags()
	seen := map[string]bool{}
	forEachTorch(t, func(t *testing.T, tr trainer) {
		out, err := tr.python("-c", `
import json
from torch.distributed.run import get_args_parser
names = set()
for a in get_args_parser()._actions:
    if a.option_strings and a.nargs != 0:
        names.update(o.lstrip("-").replace("_", "-") for o in a.option_strings)
print("VALUED " + json.dumps(sorted(names)))
`).CombinedOutput()
		require.NoError(t, err, "%s", out)
		_, js, ok := strings.Cut(string(out), "VALUED ")
		require.True(t, ok, "no VALUED line: %s", out)
		var theirs []string
		require.NoError(t, json.Unmarshal([]byte(js), &theirs))
		for _, f := range theirs {
			seen[f] = true
			require.Contains(t, ours, f, "torchrun's --%s takes a value; internal/torchrunargv's valued list lacks it", f)
		}
	})
	for _, f := range ours {
		require.True(t, seen[f], "internal/torchrunargv lists %q as a torchrun flag with a value; neither torch has it", f)
	}
}

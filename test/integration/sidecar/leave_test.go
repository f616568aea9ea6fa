package sidecar_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

// runLeave runs the preStop script the sidecar installed with the trainer's
// python3, as the webhook's hook does, with env on top of what the trainer
// has. ET_LEAVE_AGENT_PID names the agent: here all agents share one host, so
// the script's own search (every torchrun in the container's PID namespace)
// would find them all.
func runLeave(t *testing.T, tr trainer, filesDir string, env ...string) string {
	t.Helper()
	cmd := tr.command("/usr/bin/python3", filepath.Join(filesDir, constants.LeaveScriptName))
	cmd.Env = torchrunEnv(append([]string{"ET_LEAVE_LOG=-"}, env...)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the preStop script must always exit 0:\n%s", out)
	return string(out)
}

// participants reads the dynamic rendezvous state (etcd-v2 or c10d) with
// torch's own backend and classes, and returns the participants' agent PIDs.
func participants(t *testing.T, tr trainer, s *server, backend, runID string) []int {
	t.Helper()
	const read = `
import importlib, json, pickle, sys
from torch.distributed.elastic.rendezvous import RendezvousParameters
module = {"etcd-v2": "etcd_rendezvous_backend", "c10d": "c10d_rendezvous_backend"}[sys.argv[1]]
create_backend = importlib.import_module("torch.distributed.elastic.rendezvous." + module).create_backend
backend, _ = create_backend(RendezvousParameters(sys.argv[1], sys.argv[2], sys.argv[3], 1, 3, is_host=False))
state = pickle.loads(backend.get_state()[0])
print(json.dumps(sorted(n.pid for n in state.participants)))
`
	out, err := tr.python("-c", read, backend, leaveEndpoint(s, backend), runID).CombinedOutput()
	require.NoError(t, err, "read the rendezvous state with torch:\n%s", out)
	var pids []int
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &pids), "%s", out)
	return pids
}

// A torchrun agent whose pod stops runs the preStop script first. On
// etcd-v2 and c10d the script takes the agent out of the round and torch reads
// back what it wrote; on the legacy etcd backend it deletes the agent's
// keep-alive key. Either way the survivors re-form at world 2 once the agent
// gets SIGTERM. torch 2.14 (forky) on every backend; torch 2.6 (trixie) on
// etcd-v2 and c10d, where
// SIGTERM would close the whole rendezvous, so the script stops the agent and
// its workers with SIGKILL once it has left.
func TestLeaveRendezvousBeforeStop(t *testing.T) {
	t.Parallel() // see TestMain
	forTorchVersions(t, testLeaveBeforeStop)
}

func testLeaveBeforeStop(t *testing.T, tr trainer, backend string) {
	filesDir := t.TempDir()
	s := startServe(t, "--files-dir="+filesDir)
	require.FileExists(t, filepath.Join(filesDir, constants.LeaveScriptName), "serve installs the preStop script")

	runID := "leave-" + backend
	script := trainScript(t)
	args := append(testenv.TorchrunArgs(backend, s.rdzvEndpoint(backend), runID, "2:3", "--max_restarts=5", "--rdzv_conf=last_call_timeout=2"), script)
	env := torchrunEnv("TRAIN_STEPS=100000", "STEP_SLEEP=0.3")
	a := tr.startAgent(t, "agent-0", env, args...)
	b := tr.startAgent(t, "agent-1", env, args...)
	c := tr.startAgent(t, "agent-2", env, args...)
	at3 := 0
	testenv.Eventually(t, 150*time.Second, "world 3 on every agent", func() error {
		for _, p := range []*testenv.Proc{a, b, c} {
			if i := strings.LastIndex(p.Output(), "world=3 "); i < 0 {
				return fmt.Errorf("%s: world sizes so far %v", p.Name, worldSizes(p.Output()))
			} else if p == a {
				at3 = i
			}
		}
		return nil
	})
	var check func(leaveOutput string)
	switch backend {
	case "etcd-v2", "c10d":
		all := []int{a.Cmd.Process.Pid, b.Cmd.Process.Pid, c.Cmd.Process.Pid}
		sort.Ints(all)
		require.Equal(t, all, participants(t, tr, s, backend, runID))
		check = func(out string) {
			require.Contains(t, out, "removed=1 remaining=2")
			survivors := []int{a.Cmd.Process.Pid, b.Cmd.Process.Pid}
			sort.Ints(survivors)
			got := participants(t, tr, s, backend, runID)
			if !tr.closesOnSIGTERM() {
				require.Equal(t, survivors, got, "torch reads the state the script wrote")
				return
			}
			// The script has already killed the agent: the survivors' workers fail at once and
			// their agents may be re-forming the round, but the stopped agent never comes back.
			require.NotContains(t, got, c.Cmd.Process.Pid, "torch reads the state the script wrote")
			require.Subset(t, survivors, got)
		}
	case "etcd":
		rank := groupRankOf(t, c)
		key := fmt.Sprintf("%s/v2/keys/torchelastic/p2p/run_%s/rdzv/v_%s/rank_%d", s.URL, runID, legacyVersion(t, s, runID), rank)
		code, _, err := v2Get(key)
		require.NoError(t, err)
		require.Equal(t, 200, code, "agent-2's keep-alive key %s", key)
		check = func(out string) {
			require.Contains(t, out, fmt.Sprintf("rank=%d", rank))
			code, _, err := v2Get(key)
			require.NoError(t, err)
			require.Equal(t, 404, code, "the keep-alive key is gone")
		}
	}

	leaveEnv := []string{"PET_RDZV_BACKEND=" + backend, "PET_RDZV_ENDPOINT=" + leaveEndpoint(s, backend),
		"PET_RDZV_ID=" + runID, "PET_NNODES=2:3", "ET_LEAVE_AGENT_PID=" + strconv.Itoa(c.Cmd.Process.Pid)}
	start := time.Now()
	out := runLeave(t, tr, filesDir, leaveEnv...)
	t.Logf("preStop script took %s: %s", time.Since(start).Round(10*time.Millisecond), strings.TrimSpace(out))
	require.Contains(t, out, `msg="left the rendezvous before stopping"`)
	check(out)
	if tr.closesOnSIGTERM() {
		require.Contains(t, out, `msg="stopping the agent with SIGKILL: this torch closes the rendezvous on SIGTERM"`)
		c.Wait(t, 30*time.Second) // the script's SIGKILL
	} else {
		require.NotContains(t, out, "SIGKILL", "torch %s keeps the rendezvous open on SIGTERM", tr.version)
	}

	// Running it again (a second preStop, or a retry) changes nothing.
	require.Contains(t, runLeave(t, tr, filesDir, leaveEnv...), `msg="this agent is not in the rendezvous"`)

	c.Signal(syscall.SIGTERM)
	c.Wait(t, 60*time.Second)
	testenv.Eventually(t, 120*time.Second, "world 2 on the survivors", func() error {
		for _, p := range []*testenv.Proc{a, b} {
			if i := strings.LastIndex(p.Output(), "world=2 "); i < at3 {
				return fmt.Errorf("%s: world sizes so far %v", p.Name, worldSizes(p.Output()))
			}
		}
		return nil
	})
	t.Logf("torch %s %s: preStop + SIGTERM -> survivors at world 2: %s (TestTorchrunElasticGrowShrink logs the same step without the script)",
		tr.version, backend, time.Since(start).Round(100*time.Millisecond))
}

// groupRankOf is the GROUP_RANK torchrun gave the workers of agent p.
func groupRankOf(t *testing.T, p *testenv.Proc) int {
	t.Helper()
	out, err := exec.Command("sh", "-c", fmt.Sprintf("for c in $(pgrep -P %d); do tr '\\0' '\\n' < /proc/$c/environ | sed -n 's/^GROUP_RANK=//p'; done", p.Cmd.Process.Pid)).Output()
	require.NoError(t, err)
	f := strings.Fields(string(out))
	require.NotEmpty(t, f, "no worker of %s has GROUP_RANK", p.Name)
	rank, err := strconv.Atoi(f[0])
	require.NoError(t, err)
	return rank
}

// legacyVersion is the version of the legacy etcd backend's final round.
func legacyVersion(t *testing.T, s *server, runID string) string {
	t.Helper()
	code, body, err := v2Get(fmt.Sprintf("%s/v2/keys/torchelastic/p2p/run_%s/rdzv/active_version", s.URL, runID))
	require.NoError(t, err)
	require.Equal(t, 200, code, "%v", body)
	var state struct{ Status, Version string }
	require.NoError(t, json.Unmarshal([]byte(body["node"].(map[string]any)["value"].(string)), &state))
	require.Equal(t, "final", state.Status)
	return state.Version
}

// What the script cannot use, it leaves alone: it logs why and exits 0.
func TestLeaveRendezvousLosesNothing(t *testing.T) {
	tr := forky(t)
	filesDir := t.TempDir()
	s := startServe(t, "--files-dir="+filesDir)
	endpoint := strings.TrimPrefix(s.URL, "http://")
	key := s.URL + "/v2/keys/torch/elastic/rendezvous/"
	put := func(run, value string) {
		req, _ := http.NewRequest("PUT", key+run, strings.NewReader(url.Values{"value": {value}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 201, resp.StatusCode)
	}
	value := func(run string) string {
		code, body, err := v2Get(key + run)
		require.NoError(t, err)
		require.Equal(t, 200, code, "%v", body)
		return body["node"].(map[string]any)["value"].(string)
	}
	put("not-base64", "%%% not base64 %%%")
	put("not-a-pickle", "aGVsbG8gd29ybGQ=")
	// A pickle that names something other than torch's state must not be loaded.
	put("foreign-global", "gASVHwAAAAAAAACMBXBvc2l4lIwGc3lzdGVtlJOUjARlY2hvlIWUUpQu")

	base := []string{"PET_RDZV_ENDPOINT=" + endpoint, "PET_NNODES=1:4", "ET_LEAVE_AGENT_PID=1"}
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"c10d, no state yet", []string{"PET_RDZV_BACKEND=c10d", "PET_RDZV_ENDPOINT=" + s.C10d, "PET_RDZV_ID=absent"}, `msg="no rendezvous state; nothing to leave"`},
		{"c10d store down", []string{"PET_RDZV_BACKEND=c10d", "PET_RDZV_ENDPOINT=127.0.0.1:1", "PET_RDZV_ID=x"}, `msg="could not leave the rendezvous`},
		{"unknown backend", []string{"PET_RDZV_BACKEND=static", "PET_RDZV_ID=x"}, `msg="nothing to do for this rendezvous backend" backend=static`},
		{"legacy etcd, no state yet", []string{"PET_RDZV_BACKEND=etcd", "PET_RDZV_ID=absent"}, `msg="no rendezvous state; nothing to leave"`},
		{"no run id", []string{"PET_RDZV_BACKEND=etcd-v2"}, `msg="PET_RDZV_ID or PET_RDZV_ENDPOINT unset; not leaving"`},
		{"no state yet", []string{"PET_RDZV_BACKEND=etcd-v2", "PET_RDZV_ID=absent"}, `msg="no rendezvous state; nothing to leave"`},
		{"state not base64", []string{"PET_RDZV_BACKEND=etcd-v2", "PET_RDZV_ID=not-base64"}, `msg="could not leave the rendezvous`},
		{"state not a pickle", []string{"PET_RDZV_BACKEND=etcd-v2", "PET_RDZV_ID=not-a-pickle"}, `error="UnpicklingError`},
		{"foreign global", []string{"PET_RDZV_BACKEND=etcd-v2", "PET_RDZV_ID=foreign-global"}, "unexpected global posix.system"},
		{"server down", []string{"PET_RDZV_BACKEND=etcd-v2", "PET_RDZV_ID=x", fmt.Sprintf("PET_RDZV_ENDPOINT=127.0.0.1:%d", testenv.FreePort(t))}, "URLError"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := runLeave(t, tr, filesDir, append(base, tc.env...)...)
			require.Contains(t, out, tc.want)
		})
	}
	require.Equal(t, "%%% not base64 %%%", value("not-base64"))
	require.Equal(t, "aGVsbG8gd29ybGQ=", value("not-a-pickle"))
	require.Equal(t, "gASVHwAAAAAAAACMBXBvc2l4lIwGc3lzdGVtlJOUjARlY2hvlIWUUpQu", value("foreign-global"))
}

// leaveEndpoint is PET_RDZV_ENDPOINT for backend on s, as the webhook sets it.
func leaveEndpoint(s *server, backend string) string {
	if backend == "c10d" {
		return s.C10d
	}
	return strings.TrimPrefix(s.URL, "http://")
}

package sidecar_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

var (
	workerRe = regexp.MustCompile(`WORKER pid=(\d+) rank=(\d+) world=(\d+) restart=(\d+)`)
	stepRe   = regexp.MustCompile(`STEP (\d+) rank=\d+ world=\d+`)
)

// startHung is agent i of o with its joining sidecar hearing its ranks' progress (as the webhook sets both up): on
// loopback, or with hostNet on a Unix socket of the pod's own, as on host networking.
func (o *ownRdzv) startHung(t testing.TB, i int, runID string, port int, hostNet bool) node {
	t.Helper()
	host := fmt.Sprintf("127.0.0.%d", i+1)
	addr := fmt.Sprintf("%s:%d", host, port)
	if hostNet {
		addr = constants.UnixAddrPrefix + filepath.Join(t.TempDir(), "progress.sock")
	}
	join := startJoin(t, o.s.URL, host, 1, "", fmt.Sprintf("--member-index=%d", i), "--progress-addr="+addr, "--run-id="+runID,
		"--c10d-addr="+fmt.Sprintf("%s:%d", host, testenv.FreePort(t)), "--c10d-upstream="+o.s.C10d)
	script, err := filepath.Abs("testdata/hang_train.py")
	require.NoError(t, err)
	args := append(append([]string{"--local_addr=" + host}, o.args...), script)
	agent := o.tr.startAgent(t, fmt.Sprintf("agent-%d", i), append(slices.Clip(o.env), constants.EnvProgressAddr+"="+addr), args...)
	return node{agent: agent, join: join, host: host}
}

// freezeOne starts two agents of run with their joining sidecars, waits until both train, and freezes the second's
// worker (SIGSTOP; SIGCONT at the test's end): the agents, each one's output length at the freeze, and when. The
// second pod is as on host networking (its ranks' progress on a Unix socket), so that both ways are heard.
func (o *ownRdzv) freezeOne(t testing.TB, run string) (a, b node, before []int, frozen time.Time) {
	t.Helper()
	port := testenv.FreePort(t)
	a, b = o.startHung(t, 0, run, port, false), o.startHung(t, 1, run, port, true)
	testenv.Eventually(t, 120*time.Second, "both train", func() error {
		for _, n := range []node{a, b} {
			if len(stepRe.FindAllString(n.agent.Output(), -1)) < 2 {
				return fmt.Errorf("%s has not trained 20 steps", n.agent.Name)
			}
		}
		return nil
	})
	pids, _, _ := workers(b.agent.Output(), 0)
	require.Len(t, pids, 1)
	before = []int{len(a.agent.Output()), len(b.agent.Output())}
	require.NoError(t, syscall.Kill(pids[0], syscall.SIGSTOP), "freeze b's worker")
	frozen = time.Now()
	t.Cleanup(func() { syscall.Kill(pids[0], syscall.SIGCONT) })
	return a, b, before, frozen
}

// workers are the workers an agent started after offset: pid, world and torch's restart count.
func workers(out string, after int) (pids []int, worlds, restarts []string) {
	for _, loc := range workerRe.FindAllStringSubmatchIndex(out, -1) {
		if loc[0] < after {
			continue
		}
		pid, _ := strconv.Atoi(out[loc[2]:loc[3]])
		pids, worlds, restarts = append(pids, pid), append(worlds, out[loc[6]:loc[7]]), append(restarts, out[loc[8]:loc[9]])
	}
	return pids, worlds, restarts
}

// A slow rank that advances is a straggler: reported (the serving sidecar's log names it and how much slower it is
// than the median; on a cluster a Warning Event Stragglers too), never restarted. Real torchrun, torch 2.14 and 2.6,
// ranks that advance apart (no all_reduce per step: in synchronous training every rank waits for the slowest and the
// step times are equal, docs/hangs.md), rank 1's steps three times as long as rank 0's.
func TestStragglerIsReportedNotRestarted(t *testing.T) {
	forEachTorch(t, func(t *testing.T, tr trainer) {
		const run = "straggler"
		o := newOwnRdzvServe(t, tr, run, "2", []string{"--hang-timeout=10s"}, "SYNC_EVERY=0", "STEP_SLEEP=0.1", "SLOW_RANK=1", "SLOW_SLEEP=0.2")
		port := testenv.FreePort(t)
		a, b := o.startHung(t, 0, run, port, false), o.startHung(t, 1, run, port, true)
		slow := ""
		testenv.Eventually(t, 120*time.Second, "a straggler named", func() error {
			for _, n := range []node{a, b} {
				for _, m := range workerRe.FindAllStringSubmatch(n.agent.Output(), -1) {
					if m[2] == "1" {
						slow = n.host
					}
				}
			}
			if slow == "" {
				return errors.New("no worker of rank 1 yet")
			}
			if !strings.Contains(o.s.Output(), "stragglers: ranks that advance, slower than the median") {
				return errors.New("no straggler named yet")
			}
			return nil
		})
		line := regexp.MustCompile(`stragglers: ranks that advance.*`).FindString(o.s.Output())
		require.Regexp(t, `stragglers="rank 1 \(`+regexp.QuoteMeta(slow)+`\) [23]\.\dx"`, line)
		t.Logf("torch %s: %s", tr.version, line)
		// Named, not restarted: ten hang timeouts' worth of steps later, each agent still runs its first worker.
		testenv.Eventually(t, 60*time.Second, "both ranks 100 steps on", func() error {
			for _, n := range []node{a, b} {
				if got := len(stepRe.FindAllString(n.agent.Output(), -1)); got < 10 {
					return fmt.Errorf("%s: %d0 steps", n.agent.Name, got)
				}
			}
			return nil
		})
		for _, n := range []node{a, b} {
			pids, _, restarts := workers(n.agent.Output(), 0)
			require.Len(t, pids, 1, "%s: one worker, never restarted", n.agent.Name)
			require.Equal(t, "0", restarts[0])
		}
		require.NotContains(t, o.s.Output(), "hung:", "a straggler is not a hang")
	})
}

// A frozen rank (SIGSTOP: alive, its pod's lease renewed, every other rank blocked in its next all_reduce) is found
// from the ranks' progress and its round restarted: both agents start their workers again at world 2, training goes
// on, and torch counts no restart (max_restarts is 0: a counted one would end the job). torch's own timeout is
// gloo's 30 minutes. Real torchrun, torch 2.14 and 2.6, a 10 s hang timeout, with the warm start as the webhook
// sets it by default (the frozen worker is the fork server's child, not the agent's: docs/warm-start.md).
func TestHangRestartsTheRound(t *testing.T) {
	forEachTorch(t, func(t *testing.T, tr trainer) {
		const run = "hang"
		o := newOwnRdzvServe(t, tr, run, "2", []string{"--hang-timeout=10s"}, warmStartEnv()...)
		o.args = slices.DeleteFunc(slices.Clone(o.args), func(a string) bool { return a == "--max_restarts=5" })
		o.args = append(o.args, "--max_restarts=0")
		a, b, before, frozen := o.freezeOne(t, run)

		testenv.Eventually(t, 120*time.Second, "both agents' workers start again and train", func() error {
			for i, n := range []node{a, b} {
				out := n.agent.Output()
				_, worlds, restarts := workers(out, before[i])
				if len(worlds) == 0 {
					return fmt.Errorf("%s: no new worker yet", n.agent.Name)
				}
				require.Equal(t, "2", worlds[0], "the same members form the next round")
				require.Equal(t, "0", restarts[0], "torch counted no restart")
				if len(stepRe.FindAllString(out[before[i]:], -1)) == 0 {
					return fmt.Errorf("%s: restarted, no step yet", n.agent.Name)
				}
			}
			return nil
		})
		t.Logf("torch %s: a frozen worker -> both agents train again %s after the freeze (hang timeout 10 s)", tr.version, time.Since(frozen).Round(100*time.Millisecond))
		require.Regexp(t, `round 1 hung: no rank advanced for 1\ds \(timeout 10s\)`, o.s.Output())
		// b's worker is named, frozen: its heartbeat (on b's Unix socket) stopped while a's, blocked in its
		// all_reduce, went on. By the steps alone the two could not be told apart when b froze before its step's
		// all_reduce (docs/hangs.md).
		require.Regexp(t, `stopped_first="rank 1 \(127\.0\.0\.2\) at step \d+, frozen \(silent 1\ds\)"`, o.s.Output())
		t.Logf("b (frozen) is %s: %s", b.host, regexp.MustCompile(`stopped_first="[^"]*"`).FindString(o.s.Output()))
		for _, n := range []node{a, b} {
			require.NoError(t, n.agent.Cmd.Process.Signal(syscall.Signal(0)), "%s still runs", n.agent.Name)
			// The agent stopped its workers itself (SIGCONT, SIGTERM, SIGKILL after 3 s) rather than waiting out
			// torch's 30 s for a worker that does not act on SIGTERM.
			require.Contains(t, n.agent.Output(), "round 1 hung: no rank advanced for the hang timeout; stopping workers")
		}
	})
}

package sidecar_test

import (
	"cmp"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/progress"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/trainerpy"
)

// ckptNode is a pod of a job with in-memory checkpoints: its joining sidecar holds the checkpoint directory its
// trainer saves into and serves it at host:port (every pod at the same port, as in a cluster). With hostNet, as on
// host networking, the trainer asks its sidecar on a Unix socket of the pod's own and host:port serves peers only.
func (o *ownRdzv) startCkpt(t testing.TB, i int, port int, hostNet bool, env ...string) node {
	t.Helper()
	host := fmt.Sprintf("127.0.0.%d", i+1)
	dir := filepath.Join(t.TempDir(), "checkpoints")
	addr := fmt.Sprintf("%s:%d", host, port)
	url, local := "http://"+addr, []string(nil)
	if hostNet {
		sock := filepath.Join(t.TempDir(), "checkpoint.sock")
		url, local = constants.UnixAddrPrefix+sock, []string{"--checkpoint-local=" + sock}
	}
	join := startJoin(t, o.s.URL, host, 1, "", append([]string{fmt.Sprintf("--member-index=%d", i), fmt.Sprintf("--member-node=node-%d", i),
		"--checkpoint-dir=" + dir, "--checkpoint-addr=" + addr, "--checkpoint-memory=" + cmp.Or(o.ckptMemory, "64Mi")}, local...)...)
	script, err := filepath.Abs("testdata/checkpoint_train.py")
	require.NoError(t, err)
	args := append(append([]string{"--local_addr=" + host}, o.args...), script)
	env = append(append(slices.Clip(o.env), constants.EnvCheckpointDir+"="+dir, constants.EnvCheckpointURL+"="+url), env...)
	agent := o.tr.startAgent(t, fmt.Sprintf("agent-%d", i), env, args...)
	return node{agent: agent, join: join, host: host}
}

var (
	savedRe    = regexp.MustCompile(`SAVED step=(\d+) world=(\d+) rank=\d+ digest=(\w+)`)
	restoredRe = regexp.MustCompile(`RESTORED step=(\d+|None) world=(\d+) rank=(\d+) digest=(\w+|-) seconds=([\d.]+)`)
)

// digests are the digests each step was saved with, from every agent's output.
func digests(ns ...node) map[int]string {
	out := map[int]string{}
	for _, n := range ns {
		for _, m := range savedRe.FindAllStringSubmatch(n.agent.Output(), -1) {
			step, _ := strconv.Atoi(m[1])
			out[step] = m[3]
		}
	}
	return out
}

func maxSaved(n node) int {
	best := 0
	for _, m := range savedRe.FindAllStringSubmatch(n.agent.Output(), -1) {
		step, _ := strconv.Atoi(m[1])
		best = max(best, step)
	}
	return best
}

// waitRestored waits for a restore at world in n's output after offset, and returns its step, digest and where.
func waitRestored(t testing.TB, n node, world string, after int) (step int, digest string, at int) {
	t.Helper()
	testenv.Eventually(t, 150*time.Second, n.agent.Name+" restores at world "+world, func() error {
		out := n.agent.Output()
		for _, loc := range restoredRe.FindAllStringSubmatchIndex(out, -1) {
			if loc[0] < after || out[loc[4]:loc[5]] != world {
				continue
			}
			step, _ = strconv.Atoi(out[loc[2]:loc[3]]) // None: 0
			digest, at = out[loc[8]:loc[9]], loc[0]
			t.Logf("%s: %s", n.agent.Name, out[loc[0]:loc[1]])
			return nil
		}
		return fmt.Errorf("no restore at world %s yet", world)
	})
	return step, digest, at
}

// In-memory checkpoints through the sidecars, with real torchrun on torch 2.14 and 2.6: three pods on three nodes
// save a replicated (DDP) and a sharded (DTensor; on 2.14 an FSDP2 model and its optimizer too) state every step; one pod's node vanishes (agent and sidecar
// killed) and the survivors restore at world 2, from the newest step whose pieces survive (the lost pod's from its
// copy on another node), at most one step behind what the lost pod had saved, with the very state that step was
// saved with (digests of the whole state); then a new pod with an empty directory joins and restores at world 3,
// reading the pieces it lacks from its peers. No shared volume: each pod has its own directory.
func TestCheckpointSurvivesANodeLoss(t *testing.T) {
	forEachTorch(t, func(t *testing.T, tr trainer) {
		o := newOwnRdzv(t, tr, "ckpt", "2:3", "TRAIN_STEPS=100000", "STEP_SLEEP=0.3")
		port := testenv.FreePort(t)
		// b and d as on host networking (their trainers ask on a Unix socket), a and c on loopback; a's trainer has
		// an HTTP proxy that answers nothing, as a cluster's trainers often have one: its own pod is never asked
		// through it.
		deadProxy := []string{"http_proxy=http://127.0.0.1:9", "HTTP_PROXY=http://127.0.0.1:9"}
		a, b, c := o.startCkpt(t, 0, port, false, deadProxy...), o.startCkpt(t, 1, port, true), o.startCkpt(t, 2, port, false)
		for _, n := range []node{a, b, c} {
			step, _, _ := waitRestored(t, n, "3", 0)
			require.Zero(t, step, "nothing to restore at the start")
		}
		if tr.suite == testenv.SuiteForky {
			require.NotContains(t, a.agent.Output(), "no FSDP2", "torch 2.14's FSDP2 runs on CPU: the FSDP2 model and its optimizer are part of the state")
		}
		testenv.Eventually(t, 120*time.Second, "every pod saved 5 steps at world 3", func() error {
			for _, n := range []node{a, b, c} {
				if maxSaved(n) < 5 {
					return fmt.Errorf("%s saved %d", n.agent.Name, maxSaved(n))
				}
			}
			return nil
		})
		// The kill comes once the step before c's last save has its copy on another pod: a save completes
		// (every rank's write, DCP's collective) during the next step, and its copy follows within milliseconds;
		// a kill inside those milliseconds loses one step more, which the goal does not count against us.
		testenv.Eventually(t, 30*time.Second, "c's previous step copied", func() error {
			k := maxSaved(c) - 1
			piece := fmt.Sprintf(`piece="step-%012d-\w+ rank 2"`, k)
			if !regexp.MustCompile(piece).MatchString(a.join.Output() + b.join.Output()) {
				return fmt.Errorf("no copy of step %d of rank 2 yet", k)
			}
			return nil
		})
		before := len(a.agent.Output())
		c.join.Kill()
		c.agent.Kill()
		lost := maxSaved(c)
		start := time.Now()
		step, digest, _ := waitRestored(t, a, "2", before)
		t.Logf("torch %s: node lost after saving step %d; the survivors restored step %d at world 2, %s after the loss", tr.version, lost, step, time.Since(start).Round(100*time.Millisecond))
		require.GreaterOrEqual(t, step, lost-1, "at most one step redone")
		require.Equal(t, digests(a, b, c)[step], digest, "the state step %d was saved with", step)
		bStep, bDigest, _ := waitRestored(t, b, "2", 0)
		require.Equal(t, step, bStep)
		require.Equal(t, digest, bDigest)

		before = len(a.agent.Output())
		testenv.Eventually(t, 60*time.Second, "the survivors save again", func() error {
			if maxSaved(a) <= step+2 {
				return fmt.Errorf("a saved up to %d", maxSaved(a))
			}
			return nil
		})
		d := o.startCkpt(t, 3, port, true)
		dStep, dDigest, _ := waitRestored(t, d, "3", 0)
		aStep, aDigest, _ := waitRestored(t, a, "3", before)
		require.Equal(t, aStep, dStep, "the new pod restores the step the others do")
		require.Equal(t, aDigest, dDigest)
		require.Equal(t, digests(a, b)[dStep], dDigest, "the state step %d was saved with, read from the peers", dStep)
		require.Greater(t, dStep, step)
		for _, n := range []node{b, d} {
			// On the socket, the trainer's word of each save reached its sidecar (a failure is logged, not raised).
			require.NotContains(t, n.agent.Output(), "telling the sidecar", "%s: a save told its sidecar on the Unix socket", n.agent.Name)
		}
	})
}

// With a shared volume (checkpoint.persistEvery): every 4th step's save is also copied to the volume, in the
// background, and a job that loses every pod (agents, sidecars, their memory; a reinstall of the job) restores from
// it at its next start: the newest step copied there whole, with the state it was saved with, and the volume holds
// no more than that save and the one being copied. Real torchrun on torch 2.14 and 2.6, two pods.
func TestCheckpointPersistsToTheVolume(t *testing.T) {
	forEachTorch(t, func(t *testing.T, tr trainer) {
		volume := filepath.Join(t.TempDir(), "job-a") // made by the first copy
		persist := []string{constants.EnvCheckpointPersistDir + "=" + volume, constants.EnvCheckpointPersistEvery + "=4"}
		o := newOwnRdzv(t, tr, "ckpt-persist", "2", "TRAIN_STEPS=100000", "STEP_SLEEP=0.2")
		port := testenv.FreePort(t)
		a, b := o.startCkpt(t, 0, port, false, persist...), o.startCkpt(t, 1, port, false, persist...)
		testenv.Eventually(t, 120*time.Second, "both pods saved 14 steps", func() error {
			for _, n := range []node{a, b} {
				if maxSaved(n) < 14 {
					return fmt.Errorf("%s saved %d", n.agent.Name, maxSaved(n))
				}
			}
			return nil
		})
		require.Regexp(t, `step 12 is on the volume \(.*, rank 0\)`, a.agent.Output())
		require.Regexp(t, `step 12 is on the volume \(.*, rank 1\)`, b.agent.Output())
		for _, n := range []node{a, b} {
			n.agent.Kill()
			n.join.Kill()
		}
		o.s.Kill()
		lost := max(maxSaved(a), maxSaved(b))
		saves, err := filepath.Glob(filepath.Join(volume, "step-*"))
		require.NoError(t, err)
		require.LessOrEqual(t, len(saves), 2, "the volume keeps the newest complete save and the one being copied: %v", saves)

		o2 := newOwnRdzv(t, tr, "ckpt-persist-2", "2", "TRAIN_STEPS=100000", "STEP_SLEEP=0.2")
		port = testenv.FreePort(t)
		c, d := o2.startCkpt(t, 0, port, false, persist...), o2.startCkpt(t, 1, port, false, persist...)
		step, digest, _ := waitRestored(t, c, "2", 0)
		t.Logf("torch %s: every pod lost after saving step %d; the new pods restored step %d from the volume", tr.version, lost, step)
		require.Zero(t, step%4, "a step copied to the volume")
		require.GreaterOrEqual(t, step, 12)
		require.Equal(t, digests(a, b)[step], digest, "the state step %d was saved with", step)
		dStep, dDigest, _ := waitRestored(t, d, "2", 0)
		require.Equal(t, step, dStep)
		require.Equal(t, digest, dDigest)
		require.Contains(t, c.agent.Output(), fmt.Sprintf("restoring step %d from the volume", step))
	})
}

// A save holds the state as it was when save() returned, though the loop changes it in place while the write goes
// on: on torch 2.6, whose own async_save would write the changed tensors (it stages a CPU tensor as itself), and
// 2.14; the next save of the same layout is staged into the same memory with its own values, and one of another
// layout anew. Two ranks, no sidecar (the directory alone).
func TestCheckpointSaveIsASnapshot(t *testing.T) {
	forEachTorch(t, func(t *testing.T, tr trainer) {
		script, err := filepath.Abs("testdata/checkpoint_snapshot.py")
		require.NoError(t, err)
		files := t.TempDir()
		require.NoError(t, trainerpy.Install(files))
		// A save is progress too: the pod's sidecar would hear "rank r finished step 1" from each rank.
		sidecar, err := net.ListenPacket("udp", "127.0.0.1:0")
		require.NoError(t, err)
		defer sidecar.Close()
		env := torchrunEnv("PYTHONPATH="+filepath.Join(files, trainerpy.Dir), constants.EnvCheckpointDir+"="+t.TempDir(),
			constants.EnvProgressAddr+"="+sidecar.LocalAddr().String())
		p := tr.startAgent(t, "torchrun", env, "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
			fmt.Sprintf("--rdzv-endpoint=127.0.0.1:%d", testenv.FreePort(t)), "--local-addr=127.0.0.1", script)
		require.NoError(t, p.Wait(t, 180*time.Second), p.Output())
		require.Contains(t, p.Output(), "SNAPSHOT min=0.0 max=0.0 n=1", "the saved step holds the state at save()")
		require.Contains(t, p.Output(), "REUSED True min=20.0 max=20.0 n=2", "the next save of the same layout, staged into the same memory, holds its own values")
		require.Contains(t, p.Output(), "RESTAGED w=7.0..7.0 m=[5.0, 5.0, 5.0] n=3", "a save of another layout is staged anew")
		heard := map[string]bool{}
		buf := make([]byte, 64)
		for len(heard) < 2 {
			require.NoError(t, sidecar.SetReadDeadline(time.Now().Add(5*time.Second)))
			n, _, err := sidecar.ReadFrom(buf)
			require.NoError(t, err, "the ranks' saves said no progress; heard %v", heard)
			u, err := progress.ParseUpdate(buf[:n])
			require.NoError(t, err, "%q", buf[:n])
			require.NotZero(t, u.Pid, "%q names its process", buf[:n])
			heard[fmt.Sprintf("rank %d step %d", u.Rank, u.Step)] = true
		}
		require.Equal(t, map[string]bool{"rank 0 step 1": true, "rank 1 step 1": true}, heard, "each rank's save of step 1")
	})
}

package workloads

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/torchview"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// Node-loss faults: a node of the job vanishes (crash: everything on it SIGKILLed with its network cut first, so
// no FIN, no RST, no preStop) or is cut off (partition: its processes run on). The figures these tests log are
// what `make bench-node-loss` compares with torch's own behaviour (docs/failures.md).

type nodeFault string

const (
	crash     nodeFault = "crash"
	partition nodeFault = "partition"
)

// TestNodeLossPyTorch: elastic PyTorch jobs with the chart's defaults (the elastic-training backend, served by worker 0's
// sidecar) lose the node of some of their pods. The survivors train again at the smaller world size, Kubernetes
// replaces the lost pods on the node that is left and the job grows back to its replicas by itself, and the lost
// node's old pods never take part in a round again once it is back. Each fault strikes several jobs at once, each
// in a namespace of its own, so that the minutes Kubernetes takes to replace the lost pods are waited out once per
// fault, not once per job: a job that loses other workers (worker loss), one that loses the pod that serves its
// rendezvous (store loss: worker 0 with a standby, or the dedicated rendezvous pod), and one on torch's c10d
// rendezvous, where the survivors' restarter rewrites torch's state (internal/torchbackends/survivors). One crash
// strikes every torch of the trainer images (a worker loss on the default one, a store loss on the other) and both
// placements of the store; a partition strikes the default torch. The figures they log are taken beside the fault's
// other jobs on the same 2 cores; `make bench-node-loss` measures one job at a time.
//
// Each fault costs minutes of Kubernetes' own waiting (a lost node's grace period, the pods' eviction, the
// replacements' start), so the cases that a crash once took in two rounds share one (issue 47: CI is a budget).
// Left out of the crash, and where they are still proven: the worker loss on torch 2.6 (the store loss on torch
// 2.6 loses a node's member too, and its survivors re-form without it, at world 2, as a worker loss's do) and the
// store loss with placement auto on the default torch (the partition's, which is its harder case: the cut-off
// server lives on).
func TestNodeLossPyTorch(t *testing.T) {
	imgs := framework.TrainerImages
	def, other := imgs[0], imgs[len(imgs)-1]
	c10d := lossRun{rdzv: map[string]any{"backend": constants.BackendC10d}}
	faults := []struct {
		name  string
		fault nodeFault
		jobs  []lossCase // in the order they are placed: store loss last (it keeps the victim cordoned)
	}{
		{"crash", crash, []lossCase{workerLossCase(def, lossRun{}), workerLossCase(def, c10d), storeLossCase(def, "dedicated", nil), storeLossCase(other, "auto", nil)}},
		// The store's partition at the chart's shortest lease: the cut-off serving pod sees every other member's
		// lease end soonest, and must still not form a round of its own (split brain) before it steps down.
		{"partition", partition, []lossCase{workerLossCase(def, lossRun{}), storeLossCase(def, "auto", map[string]any{"rendezvous.leaseTTL": constants.MinLeaseTTL})}},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) { sharedNodeLoss(t, f.fault, f.jobs) })
	}
}

// lossCase is one job of a shared node loss. place installs it in ns and sets its pods where the case wants
// them, with the cluster to itself (cordons); the returned afterFault checks its recovery from the fault at `at`,
// beside the other jobs of the fault, and returns what to check once the node is back.
type lossCase struct {
	name  func(nodeFault) string
	place func(t testing.TB, c *framework.Cluster, ns string) afterFault
}

type (
	afterFault func(t testing.TB, fault nodeFault, at time.Time) afterBack
	afterBack  func(t testing.TB)
)

// sharedNodeLoss places jobs, brings fault on the victim once, checks each job's recovery in parallel, brings the
// victim back, and checks each job after it.
func sharedNodeLoss(t *testing.T, fault nodeFault, jobs []lossCase) {
	c := framework.Get(t)
	installWebhook(t, c)
	victim := framework.ExtraNodes[0]
	recovers := make([]afterFault, len(jobs))
	for i, j := range jobs {
		recovers[i] = j.place(t, c, c.Namespace(t))
	}
	at := loseNode(t, c, fault, victim)
	backs := make([]afterBack, len(jobs))
	t.Run("after", func(t *testing.T) {
		for i, j := range jobs {
			t.Run(j.name(fault), func(t *testing.T) {
				t.Parallel()
				backs[i] = recovers[i](t, fault, at)
			})
		}
	})
	switch fault {
	case crash:
		c.RestartNode(t, victim)
	case partition:
		c.HealNode(t, victim)
	}
	for i, j := range jobs {
		if backs[i] != nil { // nil: its recovery failed, and its namespace is kept for the dump
			t.Run("back/"+j.name(fault), func(t *testing.T) { backs[i](t) })
		}
	}
}

// nodeLoss is what one worker-node loss measured.
type nodeLoss struct {
	survivors  int           // workers left on the other node
	trainAgain time.Duration // loss -> every survivor's first step at the smaller world size; 0: not within the limit
	restart    time.Duration // the survivors' restart: their agents stop the workers -> first line at that size
	replaced   time.Duration // loss -> every worker (replacements included) at the full world size again
}

// lossRun says how workerNodeLoss runs: rdzv overrides rendezvous values, and a non-zero smallerLimit is how long
// to wait for the survivors at the smaller size before giving up on it without failing (torch's own behaviour: they
// never get there).
type lossRun struct {
	rdzv         map[string]any
	values       map[string]any // more values, dotted keys
	smallerLimit time.Duration
}

// workerLossCase: worker 0 (which serves the rendezvous) stays, other workers are lost.
func workerLossCase(img framework.Trainer, run lossRun) lossCase {
	backend, _ := run.rdzv["backend"].(string)
	return lossCase{
		name: func(fault nodeFault) string {
			if backend != "" {
				return fmt.Sprintf("%s/%s/torch-%s", backend, fault, img.Torch)
			}
			return fmt.Sprintf("%s/torch-%s", fault, img.Torch)
		},
		place: func(t testing.TB, c *framework.Cluster, ns string) afterFault {
			w := placeWorkerLoss(t, c, ns, img, run)
			return func(t testing.TB, fault nodeFault, at time.Time) afterBack {
				m := w.recover(t, fault, at)
				t.Logf("node loss (%s, torch %s, backend %q): %d survivors train at world %d %.1fs after the loss (goal 8 s); "+
					"all 3 workers train again %.1fs after it (goal 90 s)", fault, img.Torch, backend, m.survivors, m.survivors,
					m.trainAgain.Seconds(), m.replaced.Seconds())
				return w.away(t).back
			}
		},
	}
}

// workerLoss is a job of 3 workers over two nodes, worker 0 (which serves the rendezvous) on NodeName and at least
// one on the victim.
type workerLoss struct {
	c               *framework.Cluster
	ns, sel, victim string
	run             lossRun
	lost, survivors []string
}

const workerLossJob = "nodeloss"

// workerNodeLoss runs a worker loss alone: the job placed, the victim broken with fault, the recovery measured, the
// victim back. Every wait is generous for a busy machine: the figures are logged, the goals are the bench's.
func workerNodeLoss(t testing.TB, c *framework.Cluster, ns string, img framework.Trainer, fault nodeFault, run lossRun) nodeLoss {
	w := placeWorkerLoss(t, c, ns, img, run)
	m := w.recover(t, fault, loseNode(t, c, fault, w.victim))
	a := w.away(t)
	switch fault {
	case crash:
		c.RestartNode(t, w.victim)
	case partition:
		c.HealNode(t, w.victim)
	}
	a.back(t)
	return m
}

func placeWorkerLoss(t testing.TB, c *framework.Cluster, ns string, img framework.Trainer, run lossRun) *workerLoss {
	w := &workerLoss{c: c, ns: ns, victim: framework.ExtraNodes[0], run: run}
	v := jobValues(t, c, pytorchValues, trainScript)
	useTrainer(v, img)
	for k, x := range run.rdzv {
		set(v, "rendezvous."+k, x)
	}
	for k, x := range run.values {
		set(v, k, x)
	}
	set(v, "args", []any{"--steps=100000", "--step-seconds=0.5", "--checkpoint-dir=/data/checkpoints"})
	set(v, "workers", map[string]any{"replicas": 1, "minReplicas": 1, "maxReplicas": 4})
	// One worker per node and then the next: the victim gets at least one. Tainted nodes (cordoned, or lost:
	// node.kubernetes.io/unreachable) are no domain, so the replacements of lost pods schedule on the node left.
	set(v, "topologySpreadConstraints", []any{map[string]any{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
		"whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Honor"}})
	sharedDir(t, v, ns)

	// Worker 0 first, on NodeName (the victim cordoned), then two more.
	uncordon := c.Cordon(t, w.victim)
	w.sel = installTraining(t, c, ns, workerLossJob, v, 1)
	uncordon()
	scaleWorkers(t, c, ns, workerLossJob, 3)
	c.WaitWorld(t, ns, w.sel, trainer, 3, 1, 3*time.Minute)
	pods, err := c.LivePods(t.Context(), ns, w.sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if framework.PodIndex(p) == 0 && p.Spec.NodeName == w.victim {
			t.Fatalf("worker 0 (the rendezvous) runs on %s despite the cordon", w.victim)
		}
		if p.Spec.NodeName == w.victim {
			w.lost = append(w.lost, p.Name)
		} else {
			w.survivors = append(w.survivors, p.Name)
		}
	}
	if len(w.lost) == 0 {
		t.Fatalf("no worker on %s: the spread constraint did not spread (%v)", w.victim, podNodes(pods))
	}
	t.Logf("workers: %v; %s's loss takes %v", podNodes(pods), w.victim, w.lost)
	return w
}

// recover measures the survivors at the smaller size and the job grown back after the fault at `at`.
func (w *workerLoss) recover(t testing.TB, fault nodeFault, at time.Time) nodeLoss {
	c, ns := w.c, w.ns
	m := nodeLoss{survivors: len(w.survivors)}
	limit := 4 * time.Minute
	if w.run.smallerLimit > 0 {
		limit = w.run.smallerLimit
	}
	d, err := waitTrainingAgain(t.Context(), c, ns, w.survivors, len(w.survivors), at, limit)
	switch {
	case err == nil:
		m.trainAgain = d
		for _, p := range w.survivors {
			l, err := readPodLog(t.Context(), c, ns, p, len(w.survivors), at)
			if err != nil {
				t.Fatal(err)
			}
			m.restart = max(m.restart, l.first.Sub(l.starting))
		}
		t.Logf("%d survivors train at world %d %.1fs after the %s (their restart, from stopping their workers, %.2fs)", len(w.survivors), len(w.survivors), d.Seconds(), fault, m.restart.Seconds())
	case w.run.smallerLimit > 0:
		t.Logf("the %d survivors did not train at world %d within %v of the %s: %v", len(w.survivors), len(w.survivors), limit, fault, err)
	default:
		t.Fatalf("waiting for the survivors at world %d: %v", len(w.survivors), err)
	}

	// Kubernetes catches up: the lost pods are evicted (the node's grace period, then nodeLossTolerationSeconds),
	// replaced on the node left, and the job grows back to 3 by itself.
	pods, replaced := grownBack(t, c, ns, w.sel, w.victim, at)
	m.replaced = replaced
	t.Logf("the lost pods replaced (Ready on %s) %.1fs after the %s (goal 90 s); all 3 workers train again %.1fs after it: %v",
		framework.NodeName, replacedAfter(pods, slices.Concat(w.lost, w.survivors), at).Seconds(), fault, m.replaced.Seconds(), podNodes(pods))
	return m
}

// away is what the job looks like while the victim is away, for back.
func (w *workerLoss) away(t testing.TB) awayState {
	a := takeAway(t, w.c, w.ns, workerLossJob, w.sel, w.lost)
	a.then = func(t testing.TB) {
		w.c.WaitWorld(t, w.ns, w.sel, trainer, 3, 1, time.Minute)
		uninstallJob(t, w.c, w.ns, workerLossJob)
	}
	return a
}

// storeLossCase: the node that serves the rendezvous is lost. Placement auto (the chart's default): worker 0
// serves it, alone on the victim, and workers 1 and 2 survive on the other node; worker 1 is the standby
// (rendezvous.standbys, default 1). The survivors' agents reach the store through their own pods' sidecars, which
// close those connections when their leases end with the store (internal/storeproxy). Worker 1 takes the Lease once
// worker 0 has not renewed it for its duration, serves a fresh store and points Service <job>-rdzv at itself, and
// the survivors train again at world 2 without waiting for Kubernetes and without their agents restarting; worker
// 0's replacement joins later and the job grows back to 3. In a partition the cut-off worker 0 serves on until a
// member leaves and must then step down without acting on the departure (it cannot renew its Lease): when its node comes back, its old pod never serves or joins again.
// Placement dedicated: the one rendezvous pod, whose loss costs Kubernetes' replacement of it (a Deployment's pod)
// and every worker on the other node survives. Placed last of a fault's jobs: it keeps the victim cordoned. values
// are more chart values, dotted keys.
func storeLossCase(img framework.Trainer, placement string, values map[string]any) lossCase {
	return lossCase{
		name: func(fault nodeFault) string {
			if placement == "dedicated" {
				return fmt.Sprintf("store/dedicated/%s/torch-%s", fault, img.Torch)
			}
			return fmt.Sprintf("store/%s/torch-%s", fault, img.Torch)
		},
		place: func(t testing.TB, c *framework.Cluster, ns string) afterFault {
			return placeStoreLoss(t, c, ns, img, placement, values)
		},
	}
}

const storeLossJob = "storeloss"

func placeStoreLoss(t testing.TB, c *framework.Cluster, ns string, img framework.Trainer, placement string, values map[string]any) afterFault {
	const job = storeLossJob
	victim := framework.ExtraNodes[0]
	v := jobValues(t, c, pytorchValues, trainScript)
	useTrainer(v, img)
	set(v, "args", []any{"--steps=100000", "--step-seconds=0.5", "--checkpoint-dir=/data/checkpoints"})
	set(v, "workers", map[string]any{"replicas": 1, "minReplicas": 1, "maxReplicas": 4})
	set(v, "rendezvous.placement", placement)
	for k, val := range values {
		set(v, k, val)
	}
	sharedDir(t, v, ns)

	var sel string
	if placement == "dedicated" {
		// The rendezvous pod prefers the victim (and is replaced on the node left), the workers stay off it.
		set(v, "rendezvous.affinity", map[string]any{"nodeAffinity": map[string]any{"preferredDuringSchedulingIgnoredDuringExecution": []any{
			map[string]any{"weight": 100, "preference": map[string]any{"matchExpressions": []any{map[string]any{
				"key": "kubernetes.io/hostname", "operator": "In", "values": []any{victim}}}}}}}})
		set(v, "workers.nodeSelector", map[string]any{"kubernetes.io/hostname": framework.NodeName})
		sel = installTraining(t, c, ns, job, v, 1)
		scaleWorkers(t, c, ns, job, 3)
		rdzv := c.WaitPodsReady(t, ns, groupSelector(job, constants.GroupRdzv), 1, time.Minute)[0]
		if rdzv.Spec.NodeName != victim {
			t.Fatalf("the rendezvous pod %s runs on %s, not %s", rdzv.Name, rdzv.Spec.NodeName, victim)
		}
	} else {
		// Worker 0 on the victim (the first node cordoned), then the other two beside the first node's (the
		// victim cordoned until the test ends).
		uncordon := c.Cordon(t, framework.NodeName)
		sel = installTraining(t, c, ns, job, v, 1)
		uncordon()
		c.Cordon(t, victim)
		scaleWorkers(t, c, ns, job, 3)
	}
	c.WaitWorld(t, ns, sel, trainer, 3, 1, 3*time.Minute)
	pods, err := c.LivePods(t.Context(), ns, sel)
	if err != nil {
		t.Fatal(err)
	}
	server, err := c.RdzvServer(t.Context(), ns, job)
	if err != nil {
		t.Fatal(err)
	}
	if server.Spec.NodeName != victim {
		t.Fatalf("the rendezvous is served by %s on %s, not on %s", server.Name, server.Spec.NodeName, victim)
	}
	restarts := map[string]int{}
	var survivors, lost []string
	for _, p := range pods {
		if placement != "dedicated" && (framework.PodIndex(p) == 0) != (p.Spec.NodeName == victim) {
			t.Fatalf("want worker 0 alone on %s: %v", victim, podNodes(pods))
		}
		if p.Spec.NodeName == victim {
			lost = append(lost, p.Name)
		} else {
			restarts[p.Name] = trainerRestarts(p)
			survivors = append(survivors, p.Name)
		}
	}
	t.Logf("workers: %v; %s serves the rendezvous; %s's loss takes it", podNodes(pods), server.Name, victim)

	return func(t testing.TB, fault nodeFault, at time.Time) afterBack {
		world := len(survivors)
		if placement == "dedicated" {
			// No standby: the next store comes with Kubernetes' replacement of the rendezvous pod.
			c.WaitFor(t, 5*time.Minute, "the rendezvous pod replaced off "+victim, func(ctx context.Context) (bool, error) {
				p, err := c.RdzvServer(ctx, ns, job)
				if err != nil || p.Spec.NodeName == victim || !podReady(*p) {
					return false, fmt.Errorf("not yet served off %s: %v %v", victim, p, err)
				}
				return true, nil
			})
		}
		resumed, err := waitTrainingAgain(t.Context(), c, ns, survivors, world, at, 5*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		now, err := c.RdzvServer(t.Context(), ns, job)
		if err != nil {
			t.Fatal(err)
		}
		if now.Spec.NodeName == victim || now.Name == server.Name {
			t.Fatalf("training resumed, yet the rendezvous is served by %s on %s", now.Name, now.Spec.NodeName)
		}
		live, err := c.LivePods(t.Context(), ns, sel)
		if err != nil {
			t.Fatal(err)
		}
		// The survivors re-joined at the next store (waitTrainingAgain) with their agents up: the elastic-training backend
		// stops the workers and waits for the next store instead of exiting (docs/elastic-training-backend.md).
		for _, p := range live {
			if r, ok := restarts[p.Name]; ok && trainerRestarts(p) != r {
				t.Errorf("%s's trainer restarted (%d -> %d): its agent exited when the store was lost", p.Name, r, trainerRestarts(p))
			}
		}
		t.Logf("store node loss (%s, placement %s, torch %s): the survivors train again at world %d %.1fs after the "+
			"loss (goal 60 s), served by %s on %s", fault, placement, img.Torch, world, resumed.Seconds(), now.Name, now.Spec.NodeName)

		if placement != "dedicated" {
			// Kubernetes catches up: worker 0 is evicted and replaced on the node left, and the job grows back to 3.
			pods, all := grownBack(t, c, ns, sel, victim, at)
			t.Logf("worker 0 replaced (Ready on %s) %.1fs after the %s (goal 90 s); all 3 workers train again %.1fs after it: %v",
				framework.NodeName, replacedAfter(pods, slices.Concat(lost, survivors), at).Seconds(), fault, all.Seconds(), podNodes(pods))
		}

		// A partitioned worker 0 had to step down once a member left (it could not renew the Lease), before the
		// standby served: its sidecar's log on its node says so, and its trainer never trained at world 1 (a
		// second job).
		if fault == partition {
			logs, err := c.CutOffLog(victim, ns, server.Name, constants.SidecarContainerName)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(logs, "stepping down") {
				t.Errorf("the cut-off %s did not step down:\n%s", server.Name, logs)
			}
			if logs, err = c.CutOffLog(victim, ns, server.Name, trainer); err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(logs, "\n") { // CRI log lines: <time> <stream> <tag> <text>
				ts, text, _ := strings.Cut(line, " ")
				if tm, err := time.Parse(time.RFC3339Nano, ts); err == nil && tm.After(at) && strings.Contains(text, "world_size=1 ") {
					t.Errorf("the cut-off %s trained alone on its own rendezvous after the partition: %s", server.Name, line)
					break
				}
			}
		}
		a := takeAway(t, c, ns, job, sel, append(lost, server.Name))
		a.then = func(t testing.TB) {
			if p, err := c.RdzvServer(t.Context(), ns, job); err != nil || p.Name != now.Name {
				t.Errorf("the rendezvous moved after the node came back: %v %v, want %s", p, err, now.Name)
			}
			uninstallJob(t, c, ns, job)
		}
		return a.back
	}
}

// grownBack waits until the job is back at 3 workers after victim was lost at at, none of them on victim (the
// test fails for each that is), and all training again. It returns the live pods and how long after at the last
// of them trained again.
func grownBack(t testing.TB, c *framework.Cluster, ns, sel, victim string, at time.Time) ([]corev1.Pod, time.Duration) {
	t.Helper()
	c.WaitWorld(t, ns, sel, trainer, 3, 1, 5*time.Minute)
	pods, err := c.LivePods(t.Context(), ns, sel)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods {
		if p.Spec.NodeName == victim {
			t.Errorf("%s trains on the lost node %s", p.Name, victim)
		}
		names = append(names, p.Name)
	}
	again, err := waitTrainingAgain(t.Context(), c, ns, names, 3, at, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return pods, again
}

// awayState is what a job looks like while the lost node is away: its members' joins and restarts and its round,
// against which back checks it once the node is back.
type awayState struct {
	c            *framework.Cluster
	ns, job, sel string
	gone         []string // the lost node's old pods
	joined       map[string]progress
	before       torchview.View
	then         afterBack // the case's own checks after back's
}

func takeAway(t testing.TB, c *framework.Cluster, ns, job, sel string, gone []string) awayState {
	t.Helper()
	before, _ := rdzvView(t, c, ns, job)
	return awayState{c: c, ns: ns, job: job, sel: sel, gone: gone, joined: snapshot(t, c, ns, sel), before: before}
}

// back checks the job once the lost node is back. Its old pods (gone), deleted while it was away, are killed by its
// kubelet and never take part in a round again. A stale agent that reached the store before its kubelet killed it
// (the network is back first) would have put itself on the wait list or into a new round by now: the round is the
// one of before, nobody waits, and no worker of sel joined again.
func (a awayState) back(t testing.TB) {
	t.Helper()
	c, ns := a.c, a.ns
	c.WaitFor(t, 3*time.Minute, "the lost node's old pods gone", func(ctx context.Context) (bool, error) {
		all, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: constants.LabelJob + "=" + a.job})
		if err != nil {
			return false, err
		}
		var left []string
		for _, p := range all.Items {
			if slices.Contains(a.gone, p.Name) {
				left = append(left, p.Name)
			}
		}
		if len(left) > 0 {
			return false, fmt.Errorf("still there: %v", left)
		}
		return true, nil
	})
	if now, raw := rdzvView(t, c, ns, a.job); now.RunID != a.before.RunID || now.Round != a.before.Round || !now.Complete || len(now.Waiting) > 0 {
		t.Errorf("the rendezvous moved after the node came back: round %d before, now %s", a.before.Round, raw)
	}
	for name, p := range snapshot(t, c, ns, a.sel) {
		if b, ok := a.joined[name]; !ok || p.joins != b.joins || p.restarts != b.restarts {
			t.Errorf("%s re-joined after the node came back (joins %d -> %d): a stale agent took part in a round", name, b.joins, p.joins)
		}
	}
	if a.then != nil {
		a.then(t)
	}
}

// waitTrainingAgain waits until every one of pods trains at world size world after the loss at `at`: a step at that
// size after its workers joined a round of that size, both after the loss and after its trainer's last restart (a
// restarted trainer's log holds steps from before the loss; workers that ran on for a moment after it, until their
// agent heard of the loss, are not training again). It returns the time from `at` to the last of their first such
// steps, read from the timestamps of their logs.
func waitTrainingAgain(ctx context.Context, c *framework.Cluster, ns string, pods []string, world int, at time.Time, timeout time.Duration) (time.Duration, error) {
	want := fmt.Sprintf("world_size=%d ", world)
	var last time.Time
	err := testenv.Poll(ctx, timeout, framework.PollInterval, func(ctx context.Context) (bool, error) {
		last = time.Time{}
		for _, name := range pods {
			pod, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			after := at
			for _, cs := range pod.Status.ContainerStatuses {
				if r := cs.State.Running; cs.Name == trainer && r != nil && r.StartedAt.After(after) {
					after = r.StartedAt.Time
				}
			}
			raw, err := c.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Container: trainer, Timestamps: true, SinceTime: &metav1.Time{Time: after}}).DoRaw(ctx)
			if err != nil {
				return false, err
			}
			first, joined := time.Time{}, false
			for _, line := range strings.Split(string(raw), "\n") {
				ts, text, ok := strings.Cut(line, " ")
				tm, err := time.Parse(time.RFC3339Nano, ts)
				if !ok || err != nil || !tm.After(after) {
					continue
				}
				if m := joinedLine.FindStringSubmatch(text); m != nil {
					joined = m[1] == strconv.Itoa(world)
				} else if joined && framework.StepLine.MatchString(text) && strings.Contains(text, want) {
					first = tm
					break
				}
			}
			if first.IsZero() {
				step, w := framework.LastStep(string(raw))
				return false, fmt.Errorf("%s: no step at world %d since the loss (last since: step %d world %d)", name, world, step, w)
			}
			if first.After(last) {
				last = first
			}
		}
		return true, nil
	})
	return last.Sub(at), err
}

// replacedAfter is how long after at the last of pods that were not there before (the lost pods' replacements)
// turned Ready, from its Ready condition (whole seconds).
func replacedAfter(pods []corev1.Pod, before []string, at time.Time) time.Duration {
	var last time.Time
	for _, p := range pods {
		if slices.Contains(before, p.Name) {
			continue
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue && cond.LastTransitionTime.After(at) && cond.LastTransitionTime.After(last) {
				last = cond.LastTransitionTime.Time
			}
		}
	}
	if last.IsZero() {
		return 0
	}
	return last.Sub(at)
}

// podNodes says where each pod runs.
func podNodes(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name+"@"+p.Spec.NodeName)
	}
	return out
}

// TestNodeLossMPI: an MPI job (Open MPI; the launcher, which serves the rendezvous, on NodeName; one worker per
// node) loses the other node while mpirun runs a loop of allreduces. The lost worker leaves the launcher's hostfile
// and discover_hosts.sh (its lease ends); `rdzv-sidecar supervise` stops the hung mpirun and the launcher runs the
// round again on the worker that remains, whose ranks complete an allreduce; and the lost worker, a StatefulSet pod
// that Kubernetes never replaces by itself, is force-deleted by the serving sidecar once evicted and comes back on
// the node that is left.
func TestNodeLossMPI(t *testing.T) {
	c, ns := startTest(t)
	const job = "mpiloss"
	victim := framework.ExtraNodes[0]
	v := jobValues(t, c, mpiValues, "")
	set(v, "mpi.launcher.args", []any{"2"})
	set(v, "mpi.launcher.backoffLimit", 0)
	set(v, "mpi.launcher.nodeSelector", map[string]any{"kubernetes.io/hostname": framework.NodeName})
	// Allreduces every half second for as long as the test runs: the job is busy when the node is lost.
	env, _ := v["env"].([]any)
	set(v, "env", append(env, map[string]any{"name": "ALLREDUCE_ITERS", "value": "100000"}))
	set(v, "workers", map[string]any{"replicas": 2, "minReplicas": 1, "maxReplicas": 2, "gpus": 1})
	set(v, "workerGroups.wide.enabled", false)
	set(v, "topologySpreadConstraints", []any{map[string]any{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
		"whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Honor"}})
	installJob(t, c, ns, job, v)
	launcher := launcherPod(t, c, ns, job)
	waitLauncherLog(t, c, ns, launcher, "round=1 rank=1 size=2", 4*time.Minute)

	sel := groupSelector(job, constants.GroupWorker)
	pods, err := c.LivePods(t.Context(), ns, sel)
	if err != nil {
		t.Fatal(err)
	}
	var lost string
	for _, p := range pods {
		if p.Spec.NodeName == victim {
			lost = p.Name
		}
	}
	if lost == "" {
		t.Fatalf("no worker on %s: the spread constraint did not spread (%v)", victim, podNodes(pods))
	}
	lostHost := naming.PodFQDN(lost, job, ns, framework.ClusterDomain)
	t.Logf("workers: %v; %s's loss takes %s", podNodes(pods), victim, lost)
	hostfile := func(ctx context.Context) (string, error) {
		return c.Kubectl(ctx, "-n", ns, "exec", launcher, "-c", trainer, "--", "/bin/sh", "-c",
			fmt.Sprintf("cat %[1]s/%[2]s; %[1]s/%[3]s", constants.FilesDir, constants.HostfileName, constants.DiscoverHostsName))
	}

	at := c.CrashNode(t, victim)
	c.WaitFor(t, time.Minute, lost+" gone from the launcher's hostfile and discover_hosts.sh", func(ctx context.Context) (bool, error) {
		out, err := hostfile(ctx)
		if err != nil || strings.Contains(out, lostHost) {
			return false, fmt.Errorf("files: %q (%v)", out, err)
		}
		return true, nil
	})
	t.Logf("%s left the hostfile and discover_hosts.sh %.1fs after the crash (goal 10 s)", lost, time.Since(at).Seconds())
	log := waitLauncherLog(t, c, ns, launcher, "round=1 rank=0 size=1", 2*time.Minute)
	if !strings.Contains(log, "again on the hosts that remain") {
		t.Fatalf("the launcher ran its round on one host without having been stopped:\n%s", log)
	}
	t.Logf("mpirun stopped and run again on the worker left, its ranks' allreduce done %.1fs after the crash", time.Since(at).Seconds())

	// Kubernetes evicts the lost pod; the serving sidecar force-deletes it and the StatefulSet starts it on the
	// node that is left, where it registers again.
	c.WaitFor(t, 5*time.Minute, lost+" replaced on "+framework.NodeName+" and back in the hostfile", func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, lost, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Spec.NodeName != framework.NodeName || p.DeletionTimestamp != nil {
			return false, fmt.Errorf("%s on %s (deleting: %v)", lost, p.Spec.NodeName, p.DeletionTimestamp != nil)
		}
		out, err := hostfile(ctx)
		if err != nil || !strings.Contains(out, lostHost) {
			return false, fmt.Errorf("files: %q (%v)", out, err)
		}
		return true, nil
	})
	t.Logf("%s replaced on %s and listed again %.1fs after the crash (goal 90 s)", lost, framework.NodeName, time.Since(at).Seconds())
	sidecarLog, err := c.TailLogs(t.Context(), ns, launcher, constants.SidecarContainerName, 200)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sidecarLog, "force-deleted a pod lost with its node") {
		t.Errorf("the launcher's sidecar did not log the force delete:\n%s", sidecarLog)
	}
	uninstallJob(t, c, ns, job)
}

// podReady: the pod's Ready condition is true.
func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// loseNode brings fault on node and returns when it struck.
func loseNode(t testing.TB, c *framework.Cluster, fault nodeFault, node string) time.Time {
	t.Helper()
	switch fault {
	case crash:
		return c.CrashNode(t, node)
	case partition:
		return c.PartitionNode(t, node)
	}
	t.Fatalf("unknown fault %q", fault)
	return time.Time{}
}

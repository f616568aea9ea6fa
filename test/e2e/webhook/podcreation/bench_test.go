package podcreation

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

const (
	jobChart  = "charts/elastic-training"
	jobValues = "examples/local/pytorch-elastic.yaml"
	// job is the release the worker Job is rendered for: its Job is <job>-worker, its pods carry
	// elastic-training.io/job=<job>.
	job = "bench"
	// schedulingGate keeps every pod of the benchmark unscheduled: the scheduler never looks at them and the
	// kubelet never starts them, so only pod creation is measured.
	schedulingGate = "elastic-training.io/bench-pod-creation"
	// goal is the largest acceptable ratio of the time to create every pod with the webhook to the time without.
	goal = 1.10
)

// env reads a positive integer setting from the environment.
func env(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var n int
	if _, err := fmt.Sscan(v, &n); err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// repetition is one Job created and deleted again.
type repetition struct {
	webhook bool
	// create is from the Job's creation (the client's Create call) until the watch has seen every pod.
	create time.Duration
	// cleanup is from the Job's deletion (propagation Background) until the Job and every pod are gone.
	cleanup time.Duration
	// mutated counts the pods carrying elastic-training.io/mutated; calls counts the API server's calls to the
	// webhook during the repetition (apiserver_admission_webhook_request_total).
	mutated int
	calls   float64
	hist    histogram
}

// BenchmarkPodCreation measures, on the real control plane of the local cluster, how long the Job controller
// takes to create every pod of a big Indexed Job (BENCH_PODCREATION_PODS, default 500) of the job chart's PyTorch
// workers, with the webhook installed and mutating them and without it, in the same run: repetitions
// (BENCH_PODCREATION_REPS each, default 3) alternate between the two, in the order without/with, then
// with/without, so that drift in the machine's load hits both alike. Goal: with/without <= 1.10 (printed as
// PASS or MISS; timing never fails the benchmark, errors do). It also prints the webhook's admission latency as
// the API server measured it, for information.
//
// Both namespaces see the same installed webhook; the "without" namespace is in the chart's
// webhook.excludeNamespaces, so the MutatingWebhookConfiguration's namespaceSelector keeps the API server from
// calling the webhook for its pods. Every repetition checks it: every pod of a "with" repetition carries the
// webhook's elastic-training.io/mutated annotation and the API server called the webhook at least once per pod;
// no pod of a "without" repetition carries it and the API server did not call the webhook at all.
//
// Run it with `make bench-webhook`.
func BenchmarkPodCreation(b *testing.B) {
	pods := env(b, "BENCH_PODCREATION_PODS", 500)
	reps := env(b, "BENCH_PODCREATION_REPS", 3)
	warmup := env(b, "BENCH_PODCREATION_WARMUP_PODS", 50)
	c := framework.Get(b)
	ctx := b.Context()

	nsWith, nsWithout := c.Namespace(b), c.Namespace(b)
	webhookName := installWebhook(b, c, nsWith, nsWithout)
	mc, err := metadata.NewForConfig(c.REST)
	if err != nil {
		b.Fatal(err)
	}
	m := &measure{c: c, mc: mc, webhookName: webhookName}
	jobs := map[bool]*batchv1.Job{true: renderWorkerJob(b, c, nsWith, pods), false: renderWorkerJob(b, c, nsWithout, pods)}
	kcm, qps, burst := controllerManagerClient(c)

	// An unmeasured small Job in each namespace first: the API server's connections to the webhook, the
	// controllers' caches and the Go runtimes are warm for the first measured repetition of either kind.
	for _, with := range []bool{false, true} {
		small := renderWorkerJob(b, c, jobs[with].Namespace, warmup)
		r := m.run(b, ctx, small, with)
		b.Logf("warm-up, %s, %d pods: %.1fs (cleanup %.1fs)", mode(with), warmup, r.create.Seconds(), r.cleanup.Seconds())
	}

	var got []repetition
	for i := 0; i < reps*b.N; i++ {
		order := []bool{false, true}
		if i%2 == 1 {
			order = []bool{true, false}
		}
		for _, with := range order {
			r := m.run(b, ctx, jobs[with], with)
			b.Logf("round %d, %s: %d pods in %.2fs (%.0f pods/s), %d mutated, %.0f webhook calls; cleanup %.1fs",
				i+1, mode(with), pods, r.create.Seconds(), float64(pods)/r.create.Seconds(), r.mutated, r.calls, r.cleanup.Seconds())
			got = append(got, r)
		}
	}

	var with, without []float64
	var hist histogram
	for _, r := range got {
		if r.webhook {
			with = append(with, r.create.Seconds())
			hist = hist.add(r.hist)
		} else {
			without = append(without, r.create.Seconds())
		}
	}
	ratio := testenv.Median(with) / testenv.Median(without)
	verdict := "PASS"
	if ratio > goal {
		verdict = "MISS"
	}

	var out strings.Builder
	fmt.Fprintf(&out, "\nPod creation by the Job controller on the local cluster: a %d-pod Indexed Job of the job chart's PyTorch\n", pods)
	fmt.Fprintf(&out, "workers (%s, scheduling-gated: no pod is scheduled or started), seconds from the\n", jobValues)
	fmt.Fprintf(&out, "Job's creation until all %d pods exist; %d repetitions each, alternating (round 1 without first).\n", pods, len(with))
	fmt.Fprintf(&out, "kube-controller-manager's API client: %s.\n", kcm)
	if qps > 0 && pods > burst {
		fmt.Fprintf(&out, "At %g requests/s after a burst of %d, the %d pod creations alone take at least %.1f s, webhook or not.\n",
			qps, burst, pods, float64(pods-burst)/qps)
	}
	fmt.Fprintf(&out, "%-10s %16s %16s\n", "", "without webhook", "with webhook")
	for i := range with {
		fmt.Fprintf(&out, "%-10s %16.2f %16.2f\n", fmt.Sprintf("round %d", i+1), without[i], with[i])
	}
	fmt.Fprintf(&out, "%-10s %16.2f %16.2f\n", "median", testenv.Median(without), testenv.Median(with))
	fmt.Fprintf(&out, "%-10s %16.0f %16.0f\n", "pods/s", float64(pods)/testenv.Median(without), float64(pods)/testenv.Median(with))
	fmt.Fprintf(&out, "ratio with/without (medians): %.3f, goal <= %.2f: %s\n", ratio, goal, verdict)
	fmt.Fprintf(&out, "without webhook: namespace %s in the chart's webhook.excludeNamespaces (the MutatingWebhookConfiguration's\n", nsWithout)
	fmt.Fprintf(&out, "  namespaceSelector); checked per repetition: 0 pods mutated and 0 webhook calls; with: every pod mutated\n")
	fmt.Fprintf(&out, "  and at least one webhook call per pod (calls per repetition:%s)\n", callsList(got))
	fmt.Fprintf(&out, "admission latency of webhook %s (information only), from the API server's %s\n", webhookName, metricWebhookDuration)
	fmt.Fprintf(&out, "  histogram, deltas over the %d \"with\" repetitions (%.0f calls): p50 %.2f ms, p99 %.2f ms (linear interpolation\n",
		len(with), hist.count, hist.quantile(0.5)*1000, hist.quantile(0.99)*1000)
	fmt.Fprintf(&out, "  inside the buckets, whose bounds are 5, 25, 100 ms...: as coarse as that), mean %.2f ms (exact: sum/count);\n",
		hist.sum/hist.count*1000)
	fmt.Fprintf(&out, "  calls per bucket: %s\n", hist.describe())
	fmt.Print(out.String())

	b.ReportMetric(testenv.Median(without), "without-s")
	b.ReportMetric(testenv.Median(with), "with-s")
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(hist.quantile(0.5)*1000, "admission-p50-ms")
	b.ReportMetric(hist.quantile(0.99)*1000, "admission-p99-ms")
}

func mode(with bool) string {
	if with {
		return "with webhook"
	}
	return "without webhook"
}

func callsList(rs []repetition) string {
	var s strings.Builder
	for _, r := range rs {
		if r.webhook {
			fmt.Fprintf(&s, " %.0f", r.calls)
		}
	}
	return s.String()
}

// installWebhook installs the webhook chart with the images just built, the "without" namespace excluded
// (framework.InstallWebhook: a webhook left installed by `make demo` or the workloads tests is replaced, and it
// waits until the API server really mutates a training pod in nsWith), and checks that the chart's
// MutatingWebhookConfiguration excludes nsWithout and that the API server does not mutate a training pod there.
// The release is uninstalled when the benchmark ends. It returns the webhook's name in the
// MutatingWebhookConfiguration.
func installWebhook(b *testing.B, c *framework.Cluster, nsWith, nsWithout string) string {
	ctx := b.Context()
	c.InstallWebhook(b, nsWith, []string{nsWithout})

	mwc, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, framework.WebhookRelease, metav1.GetOptions{})
	if err != nil {
		b.Fatalf("the chart's MutatingWebhookConfiguration: %v", err)
	}
	if len(mwc.Webhooks) != 1 {
		b.Fatalf("MutatingWebhookConfiguration %s has %d webhooks, want 1", mwc.Name, len(mwc.Webhooks))
	}
	wh := mwc.Webhooks[0]
	excluded := false
	if sel := wh.NamespaceSelector; sel != nil {
		for _, e := range sel.MatchExpressions {
			if e.Key == corev1.LabelMetadataName && e.Operator == metav1.LabelSelectorOpNotIn {
				for _, v := range e.Values {
					excluded = excluded || v == nsWithout
				}
			}
		}
	}
	if !excluded {
		b.Fatalf("webhook %s: namespaceSelector %v does not exclude %s", wh.Name, wh.NamespaceSelector, nsWithout)
	}
	if mutated, err := c.DryRunMutated(ctx, nsWithout); err != nil || mutated {
		b.Fatalf("a dry-run training pod in the excluded namespace %s: mutated %v, error %v", nsWithout, mutated, err)
	}
	return wh.Name
}

// renderWorkerJob renders the job chart as `helm template` would (examples/local/pytorch-elastic.yaml with
// workers.replicas=pods) and returns its worker Job for namespace ns, with a scheduling gate on its pod template.
func renderWorkerJob(b *testing.B, c *framework.Cluster, ns string, pods int) *batchv1.Job {
	values := c.Values(b, jobValues)
	workers, _ := values["workers"].(map[string]any)
	if workers == nil {
		workers = map[string]any{}
		values["workers"] = workers
	}
	workers["replicas"], workers["minReplicas"], workers["maxReplicas"] = pods, 1, pods
	// The chart refuses a job with nothing to run; these pods stay gated and never run it.
	values["command"] = []any{"torchrun", "train.py"}

	want := job + "-worker"
	for _, obj := range c.HelmTemplate(b, c.RepoPath(jobChart), job, ns, values) {
		if obj.GetKind() != "Job" || obj.GetName() != want {
			continue
		}
		j := &batchv1.Job{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(obj.Object, j, true); err != nil {
			b.Fatalf("rendered Job %s: %v", want, err)
		}
		j.Namespace = ns
		if j.Spec.Completions == nil || *j.Spec.Completions != int32(pods) || j.Spec.Parallelism == nil || *j.Spec.Parallelism != int32(pods) {
			b.Fatalf("rendered Job %s: completions %v, parallelism %v, want %d", want, j.Spec.Completions, j.Spec.Parallelism, pods)
		}
		if j.Spec.CompletionMode == nil || *j.Spec.CompletionMode != batchv1.IndexedCompletion {
			b.Fatalf("rendered Job %s is not Indexed", want)
		}
		if j.Spec.Template.Labels[constants.LabelJob] != job || j.Spec.Template.Labels[constants.LabelRole] != constants.RoleWorker ||
			j.Spec.Template.Annotations[constants.AnnotationFramework] != constants.FrameworkPyTorch {
			b.Fatalf("rendered Job %s: its pod template is not a PyTorch worker's: labels %v, annotations %v", want,
				j.Spec.Template.Labels, j.Spec.Template.Annotations)
		}
		j.Spec.Template.Spec.SchedulingGates = append(j.Spec.Template.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: schedulingGate})
		return j
	}
	b.Fatalf("%s rendered no Job %s", jobChart, want)
	return nil
}

// measure runs repetitions.
type measure struct {
	c           *framework.Cluster
	mc          metadata.Interface
	webhookName string
}

var podsResource = corev1.SchemeGroupVersion.WithResource("pods")

// run creates the Job, waits until all its pods exist, checks their mutation against with, deletes the Job
// and waits until it and its pods are gone.
func (m *measure) run(b *testing.B, ctx context.Context, j *batchv1.Job, with bool) repetition {
	b.Helper()
	ns, n := j.Namespace, int(*j.Spec.Completions)
	sel := constants.LabelJob + "=" + job
	pods := m.mc.Resource(podsResource).Namespace(ns)
	r := repetition{webhook: with}

	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		b.Fatal(err)
	}
	if len(list.Items) > 0 {
		b.Fatalf("%d pods %s left in %s before the repetition", len(list.Items), sel, ns)
	}
	before := m.scrape(b, ctx)
	// A watch of the pods' metadata only (what the API server sends is small, and the same for mutated pods
	// and others), from before the Job exists, so no creation is missed.
	ctxWatch, stop := context.WithCancel(ctx)
	defer stop()
	w, err := watchtools.NewRetryWatcherWithContext(ctxWatch, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel
			return pods.Watch(ctx, o)
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()

	start := time.Now()
	if _, err := m.c.Client.BatchV1().Jobs(ns).Create(ctx, j, metav1.CreateOptions{}); err != nil {
		b.Fatalf("create Job %s/%s: %v", ns, j.Name, err)
	}
	seen := map[string]bool{}
	timeout := time.NewTimer(5 * time.Minute)
	defer timeout.Stop()
	for len(seen) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				b.Fatalf("the watch of pods in %s ended after %d of %d pods", ns, len(seen), n)
			}
			if ev.Type == watch.Error {
				b.Fatalf("watch of pods in %s: %v", ns, apierrors.FromObject(ev.Object))
			}
			p, ok := ev.Object.(*metav1.PartialObjectMetadata)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) || seen[p.Name] {
				continue
			}
			seen[p.Name] = true
			if p.Annotations[constants.AnnotationMutated] != "" {
				r.mutated++
			}
		case <-timeout.C:
			js, _ := m.c.Kubectl(ctx, "-n", ns, "describe", "job", j.Name)
			b.Fatalf("%s: only %d of %d pods after 5 minutes\n%s", mode(with), len(seen), n, js)
		}
	}
	r.create = time.Since(start)
	stop()

	after := m.scrape(b, ctx)
	r.calls = after.calls - before.calls
	r.hist = after.hist.sub(before.hist)
	switch {
	case with && (r.mutated != n || r.calls < float64(n)):
		b.Fatalf("with webhook: %d of %d pods mutated and %.0f webhook calls: the API server did not call the webhook for every pod", r.mutated, n, r.calls)
	case !with && (r.mutated != 0 || r.calls != 0):
		b.Fatalf("without webhook: %d of %d pods mutated and %.0f webhook calls: the webhook was called in namespace %s", r.mutated, n, r.calls, ns)
	}

	start = time.Now()
	if err := m.c.Client.BatchV1().Jobs(ns).Delete(ctx, j.Name, metav1.DeleteOptions{PropagationPolicy: ptr(metav1.DeletePropagationBackground)}); err != nil {
		b.Fatalf("delete Job %s/%s: %v", ns, j.Name, err)
	}
	var left int
	err = wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, false, func(ctx context.Context) (bool, error) {
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return false, nil
		}
		left = len(l.Items)
		if left > 0 {
			return false, nil
		}
		_, err = m.c.Client.BatchV1().Jobs(ns).Get(ctx, j.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		b.Fatalf("after deleting Job %s/%s: %d pods left: %v", ns, j.Name, left, err)
	}
	r.cleanup = time.Since(start)
	return r
}

// scrape reads the API server's metrics about the webhook.
func (m *measure) scrape(b *testing.B, ctx context.Context) webhookMetrics {
	raw, err := m.c.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		b.Fatalf("the API server's /metrics: %v", err)
	}
	wm, err := parseWebhookMetrics(string(raw), m.webhookName)
	if err != nil {
		b.Fatal(err)
	}
	return wm
}

func ptr[T any](v T) *T { return &v }

// controllerManagerClient says how fast the kube-controller-manager may talk to the API server (its flags
// --kube-api-qps and --kube-api-burst, read from the running process): the Job controller's pod creations, its
// status updates and its events all wait for that client's rate limiter. It also returns the QPS and burst
// (0 when unknown).
func controllerManagerClient(c *framework.Cluster) (desc string, qps float64, burst int) {
	pid, err := c.PID("kube-controller-manager")
	if err != nil {
		return "unknown (" + err.Error() + ")", 0, 0
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return "unknown (" + err.Error() + ")", 0, 0
	}
	flags := map[string]string{"kube-api-qps": "", "kube-api-burst": "", "concurrent-job-syncs": ""}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	for i, a := range args {
		k, v, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if _, ok := flags[k]; ok && strings.HasPrefix(a, "--") {
			if !hasValue && i+1 < len(args) {
				v = args[i+1]
			}
			flags[k] = v
		}
	}
	// Kubernetes v1.36's defaults (pkg/controller/apis/config/v1alpha1, pkg/controller/job/config/v1alpha1).
	def := map[string]string{"kube-api-qps": "20", "kube-api-burst": "30", "concurrent-job-syncs": "5"}
	var parts []string
	for _, k := range []string{"kube-api-qps", "kube-api-burst", "concurrent-job-syncs"} {
		if flags[k] == "" {
			flags[k] = def[k]
			parts = append(parts, fmt.Sprintf("--%s=%s (default)", k, def[k]))
		} else {
			parts = append(parts, fmt.Sprintf("--%s=%s", k, flags[k]))
		}
	}
	fmt.Sscan(flags["kube-api-qps"], &qps)
	fmt.Sscan(flags["kube-api-burst"], &burst)
	s := strings.Join(parts, " ")
	for _, a := range args {
		if a == "--use-service-account-credentials=true" || a == "--use-service-account-credentials" {
			s += " (--use-service-account-credentials: the Job controller's own client and rate limiter, shared by its pod creations, status updates and events)"
		}
	}
	return s, qps, burst
}

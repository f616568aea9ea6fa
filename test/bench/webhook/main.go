// Command webhook-bench measures the admission webhook binary over HTTPS:
// latency p50/p99 of /mutate-pods against the no-op admission path /noop of the
// same server, in the same run, at a fixed request rate (open loop, the two
// paths interleaved), and the process's idle resident memory.
//
//	go build -o bin/webhook ./cmd/webhook && go run ./test/bench/webhook -binary bin/webhook
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/elastic-training/elastic-training/internal/testcert"
)

func main() {
	binary := flag.String("binary", "bin/webhook", "webhook binary to measure")
	podFile := flag.String("pod", "internal/mutate/testdata/pytorch-worker0-serves-rdzv.yaml", "pod sent for admission")
	rate := flag.Int("rate", 200, "requests per second, both paths together")
	duration := flag.Duration("duration", 20*time.Second, "measured load duration")
	warmup := flag.Duration("warmup", 3*time.Second, "unmeasured load before measuring")
	maxRatio := flag.Float64("max-ratio", 1.2, "goal: mutate/noop latency ratio (p50 and p99)")
	maxRSS := flag.Float64("max-rss-mib", 40, "goal: idle RSS in MiB")
	out := flag.String("out", "", "write the results as JSON to this file")
	strict := flag.Bool("strict", false, "exit 1 when a goal is missed")
	backToBack := flag.Int("back-to-back", 2000, "requests per path sent one at a time after the fixed-rate load")
	flag.Parse()
	if err := run(*binary, *podFile, *rate, *duration, *warmup, *backToBack, *maxRatio, *maxRSS, *out, *strict); err != nil {
		fmt.Fprintln(os.Stderr, "webhook-bench:", err)
		os.Exit(1)
	}
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func rssMiB(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS")
}

// cpuTime is the user+system CPU time of a process (clock ticks of 10 ms).
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name (which is in parentheses): utime is the 12th, stime the 13th.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * 10 * time.Millisecond, nil
}

func body(podFile string) ([]byte, error) {
	b, err := os.ReadFile(podFile)
	if err != nil {
		return nil, err
	}
	pod := &corev1.Pod{}
	if err := yaml.Unmarshal(b, pod); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		return nil, err
	}
	return json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "bench", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: pod.Namespace,
			Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
		},
	})
}

type result struct {
	Rate        int     `json:"rate"`
	DurationS   float64 `json:"durationSeconds"`
	Requests    int     `json:"requestsPerPath"`
	Errors      int     `json:"errors"`
	MutateP50Ms float64 `json:"mutateP50Ms"`
	MutateP99Ms float64 `json:"mutateP99Ms"`
	NoopP50Ms   float64 `json:"noopP50Ms"`
	NoopP99Ms   float64 `json:"noopP99Ms"`
	RatioP50    float64 `json:"ratioP50"`
	RatioP99    float64 `json:"ratioP99"`
	// Server CPU time (user+sys) per request, from separate single-path phases:
	// steadier than latency on a busy machine.
	MutateCPUUs float64 `json:"mutateCpuMicros"`
	NoopCPUUs   float64 `json:"noopCpuMicros"`
	// One request at a time, the paths alternating (not a goal: a diagnosis).
	BackToBackMutateP50Ms float64 `json:"backToBackMutateP50Ms"`
	BackToBackNoopP50Ms   float64 `json:"backToBackNoopP50Ms"`
	IdleRSSMiB            float64 `json:"idleRssMiB"`
	AfterLoadRSSMB        float64 `json:"afterLoadRssMiB"`
	GoalsMet              bool    `json:"goalsMet"`
}

func run(binary, podFile string, rate int, duration, warmup time.Duration, backToBack int, maxRatio, maxRSS float64, out string, strict bool) error {
	reqBody, err := body(podFile)
	if err != nil {
		return fmt.Errorf("pod: %w", err)
	}
	dir, err := os.MkdirTemp("", "webhook-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	pair, err := testcert.New("127.0.0.1")
	if err != nil {
		return err
	}
	if err := pair.WriteDir(dir); err != nil {
		return err
	}
	port, hport := freePort(), freePort()
	logf, err := os.Create(filepath.Join(dir, "webhook.log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(binary, "--host=127.0.0.1", fmt.Sprintf("--port=%d", port), "--cert-dir="+dir,
		fmt.Sprintf("--health-addr=127.0.0.1:%d", hport), "--metrics-addr=0", "--sidecar-image=example.com/rdzv-sidecar:v0.1.0")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", binary, err)
	}
	defer func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", hport))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if ctx.Err() != nil {
			b, _ := os.ReadFile(filepath.Join(dir, "webhook.log"))
			return fmt.Errorf("webhook not ready in 30 s:\n%s", b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // settle
	idle, err := rssMiB(cmd.Process.Pid)
	if err != nil {
		return err
	}

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pair.CA)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 64,
	}}
	base := fmt.Sprintf("https://127.0.0.1:%d", port)
	var mu sync.Mutex
	lat := map[string][]time.Duration{}
	errs := 0
	// roundTrip sends one admission review and tells how long it took and
	// whether the pod was allowed.
	roundTrip := func(path string) (time.Duration, bool) {
		start := time.Now()
		resp, err := client.Post(base+path, "application/json", bytes.NewReader(reqBody))
		ok := err == nil
		if ok {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			ok = resp.StatusCode == 200 && bytes.Contains(b, []byte(`"allowed":true`))
		}
		return time.Since(start), ok
	}
	// The paths alternate request by request.
	pathOf := func(i int) string {
		if i%2 == 1 {
			return "/noop"
		}
		return "/mutate-pods"
	}
	send := func(path string, record bool) {
		d, ok := roundTrip(path)
		if !record {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !ok {
			errs++
			return
		}
		lat[path] = append(lat[path], d)
	}
	load := func(d time.Duration, record bool, only string) {
		var wg sync.WaitGroup
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		end := time.Now().Add(d)
		for i := 0; time.Now().Before(end); i++ {
			<-tick.C
			path := pathOf(i)
			if only != "" {
				path = only
			}
			wg.Add(1)
			go func() { defer wg.Done(); send(path, record) }()
		}
		wg.Wait()
	}
	load(warmup, false, "")
	load(duration, true, "")
	after, _ := rssMiB(cmd.Process.Pid)
	cpuPer := func(path string) (float64, error) {
		before, err := cpuTime(cmd.Process.Pid)
		if err != nil {
			return 0, err
		}
		d := duration / 2
		load(d, false, path)
		end, err := cpuTime(cmd.Process.Pid)
		return float64((end - before).Microseconds()) / (d.Seconds() * float64(rate)), err
	}
	noopCPU, err := cpuPer("/noop")
	if err != nil {
		return err
	}
	mutateCPU, err := cpuPer("/mutate-pods")
	if err != nil {
		return err
	}

	// Back to back (closed loop, one request at a time, the paths
	// alternating): the server never idles between requests, so its latency
	// holds none of the wake-up cost that the fixed rate pays on every
	// request. It tells how much of the ratio is the mutation's own work.
	b2b := map[string][]time.Duration{}
	for i := 0; i < 2*backToBack; i++ {
		path := pathOf(i)
		d, ok := roundTrip(path)
		if !ok {
			return fmt.Errorf("back to back: %s failed", path)
		}
		b2b[path] = append(b2b[path], d)
	}

	pct := func(ds []time.Duration, p float64) float64 {
		if len(ds) == 0 {
			return 0
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return float64(ds[int(p*float64(len(ds)-1))].Microseconds()) / 1000
	}
	m, n := lat["/mutate-pods"], lat["/noop"]
	r := result{Rate: rate, DurationS: duration.Seconds(), Requests: len(m), Errors: errs,
		MutateP50Ms: pct(m, 0.50), MutateP99Ms: pct(m, 0.99), NoopP50Ms: pct(n, 0.50), NoopP99Ms: pct(n, 0.99),
		IdleRSSMiB: idle, AfterLoadRSSMB: after, MutateCPUUs: mutateCPU, NoopCPUUs: noopCPU,
		BackToBackMutateP50Ms: pct(b2b["/mutate-pods"], 0.50), BackToBackNoopP50Ms: pct(b2b["/noop"], 0.50)}
	if r.NoopP50Ms > 0 && r.NoopP99Ms > 0 {
		r.RatioP50, r.RatioP99 = r.MutateP50Ms/r.NoopP50Ms, r.MutateP99Ms/r.NoopP99Ms
	}
	r.GoalsMet = errs == 0 && r.RatioP50 <= maxRatio && r.RatioP99 <= maxRatio && idle <= maxRSS
	fmt.Printf("webhook-bench: %d req/s for %s over HTTPS, %d requests per path, %d errors\n", rate, duration, len(m), errs)
	fmt.Printf("  /mutate-pods  p50 %.3f ms  p99 %.3f ms\n", r.MutateP50Ms, r.MutateP99Ms)
	fmt.Printf("  /noop         p50 %.3f ms  p99 %.3f ms\n", r.NoopP50Ms, r.NoopP99Ms)
	fmt.Printf("  ratio         p50 %.2f  p99 %.2f   (goal <= %.2f)\n", r.RatioP50, r.RatioP99, maxRatio)
	fmt.Printf("  mutation's cost at p50: +%.0f µs at %d req/s, +%.0f µs back to back (p50 mutate %.3f ms, noop %.3f ms)\n",
		1000*(r.MutateP50Ms-r.NoopP50Ms), rate, 1000*(r.BackToBackMutateP50Ms-r.BackToBackNoopP50Ms),
		r.BackToBackMutateP50Ms, r.BackToBackNoopP50Ms)
	fmt.Printf("  server CPU per request: mutate %.0f µs, noop %.0f µs\n", mutateCPU, noopCPU)
	fmt.Printf("  RSS idle %.1f MiB (goal <= %.0f), after load %.1f MiB\n", idle, maxRSS, after)
	fmt.Printf("  goals met: %v\n", r.GoalsMet)
	if out != "" {
		b, _ := json.MarshalIndent(r, "", "  ")
		if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if strict && !r.GoalsMet {
		return fmt.Errorf("goals missed")
	}
	return nil
}

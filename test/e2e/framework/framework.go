// Package framework runs e2e tests against a real single-node Kubernetes
// cluster (real kubelet and containerd) started by the scripts in
// test/e2e/cluster. Every e2e test package calls Main from its TestMain:
//
//	func TestMain(m *testing.M) { framework.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		c := framework.Get(t)
//		ns := c.Namespace(t)
//		c.HelmInstall(t, ns, "job", c.RepoPath("charts/elastic-training"), values, framework.Wait(2*time.Minute))
//		c.WaitPodsReady(t, ns, "app.kubernetes.io/instance=job", 3, time.Minute)
//	}
//
// A missing cluster is never a reason to skip: when it cannot be brought up,
// Main prints why and the test binary fails.
package framework

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// ModulePath identifies the repository root (its go.mod).
const ModulePath = "github.com/elastic-training/elastic-training"

// Cluster is the running test cluster.
type Cluster struct {
	// Kubeconfig is the admin kubeconfig file (system:masters).
	Kubeconfig string
	REST       *rest.Config
	Client     kubernetes.Interface
	// RepoRoot is the repository checkout the tests run from.
	RepoRoot string
	// ScriptsDir is test/e2e/cluster; BinDir holds kubectl, helm, kube-apiserver, etcd... of the pinned versions.
	ScriptsDir string
	BinDir     string
	// imagesScript is hack/images.sh, which builds the local images and imports them into the cluster.
	imagesScript string
}

var current *Cluster

// Main brings the cluster up once per test binary (reusing one that already runs), runs the tests, then the
// checks of After options in their order, and stops the cluster only if it started it. A cluster that was
// running before and was stopped by a test or a check is started again, so a developer's cluster survives
// `go test`.
func Main(m *testing.M, opts ...Option) {
	os.Exit(run(m, opts))
}

func run(m *testing.M, opts []Option) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "e2e: FAIL: "+format+"\n", args...)
		return 1
	}
	if os.Geteuid() != 0 {
		return fail("the e2e tests need root: they start a kubelet and containerd and change routes and iptables; run them as root (sudo make e2e)")
	}
	root, err := findRepoRoot()
	if err != nil {
		return fail("%v", err)
	}
	c, err := newCluster(root)
	if err != nil {
		return fail("%v", err)
	}
	unlock, err := lockFile(e2eLock)
	if err != nil {
		return fail("%v", err)
	}
	defer unlock()

	wasRunning := c.Running()
	start := time.Now()
	if err := c.script(os.Stderr, "up.sh"); err != nil {
		return fail("cannot bring the test cluster up: %v (logs under %s)", err, settings["LOGS"])
	}
	if err := c.run(os.Stderr, c.imagesScript); err != nil {
		return fail("cannot build or import the images: %v", err)
	}
	fmt.Fprintf(os.Stderr, "e2e: cluster ready in %.1fs (was running: %v)\n", time.Since(start).Seconds(), wasRunning)
	if err := c.connect(); err != nil {
		return fail("%v", err)
	}
	// A test binary killed earlier (timeout, ^C, a restarted machine) left its namespaces, and their pods
	// hold resources the tests count on; the lock says no other test binary is running.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	swept, err := c.SweepOrphans(ctx, 3*time.Minute)
	cancel()
	if len(swept) > 0 {
		fmt.Fprintf(os.Stderr, "e2e: deleted %d namespaces left by an earlier run: %s\n", len(swept), strings.Join(swept, " "))
	}
	if err != nil {
		return fail("%v", err)
	}
	current = c
	code := m.Run()
	for _, o := range opts {
		if !o.after.run(c) {
			code = 1
		}
	}

	switch running := c.Running(); {
	case !wasRunning && running:
		if err := c.script(os.Stderr, "down.sh"); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: cluster-down failed: %v\n", err)
			code = 1
		}
	case wasRunning && !running:
		if err := c.script(os.Stderr, "up.sh"); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: could not restart the cluster that was running before: %v\n", err)
			code = 1
		}
	}
	return code
}

// Get returns the cluster Main brought up. Calling it from a test binary whose TestMain does not call
// Main is a programming error and fails the test.
func Get(t testing.TB) *Cluster {
	t.Helper()
	if current == nil {
		t.Fatal("framework.Get: no cluster; the package's TestMain must call framework.Main(m)")
	}
	return current
}

// RepoPath returns a path inside the repository, e.g. c.RepoPath("charts/elastic-training").
func (c *Cluster) RepoPath(rel string) string { return filepath.Join(c.RepoRoot, rel) }

// Running reports whether this checkout's cluster runs and answers (status.sh).
func (c *Cluster) Running() bool {
	return c.script(nil, "status.sh") == nil
}

// Up starts the cluster (or the parts of it that are not running) and waits until it is ready.
func (c *Cluster) Up(t testing.TB) {
	t.Helper()
	c.scriptForTest(t, "cluster up", "up.sh")
}

// Down stops the cluster and undoes every host change (down.sh). Main starts it again at the end if it was
// running before the tests; later tests in the same binary must call Up first.
func (c *Cluster) Down(t testing.TB) {
	t.Helper()
	c.scriptForTest(t, "cluster down", "down.sh")
}

// scriptForTest runs a cluster script and logs its output as what, failing the test when it fails.
func (c *Cluster) scriptForTest(t testing.TB, what, name string, args ...string) {
	t.Helper()
	var out bytes.Buffer
	if err := c.script(&out, name, args...); err != nil {
		t.Fatalf("%s: %v\n%s", what, err, out.String())
	}
	t.Logf("%s:\n%s", what, out.String())
}

// Script runs one of the cluster scripts (test/e2e/cluster/NAME) and returns its combined output.
func (c *Cluster) Script(name string, args ...string) (string, error) {
	var out bytes.Buffer
	err := c.script(&out, name, args...)
	return out.String(), err
}

// RemoveImages deletes from every node's containerd the images whose name starts with prefix (a registry's
// host/), so that a test pulls them as a fresh node would, not finding an earlier run's copy under the same tag.
func (c *Cluster) RemoveImages(t testing.TB, prefix string) {
	t.Helper()
	out, err := exec.Command(c.imagesScript, "--remove", prefix).CombinedOutput() // also from a Cleanup, whose test's context has ended
	if err != nil {
		t.Fatalf("images.sh --remove %s: %v\n%s", prefix, err, out)
	}
	if len(out) > 0 {
		t.Logf("%s", out)
	}
}

// PushImages is `make images REGISTRY=<registry> PUSH=1 PLAIN_HTTP=1 PUSH_TRAINERS=<suites>` (docs/install.md):
// the webhook and sidecar images, and the trainer images of suites, pushed to the registry (plain HTTP).
func (c *Cluster) PushImages(t testing.TB, registry string, suites ...string) {
	t.Helper()
	start := time.Now()
	cmd := exec.CommandContext(t.Context(), c.imagesScript)
	cmd.Env = append(os.Environ(), "REGISTRY="+registry, "PUSH=1", "PLAIN_HTTP=1", "PUSH_TRAINERS="+strings.Join(suites, " "))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make images REGISTRY=%s PUSH=1: %v\n%s", registry, err, out)
	}
	t.Logf("make images REGISTRY=%s PUSH=1 PUSH_TRAINERS=%q: %.1fs\n%s", registry, strings.Join(suites, " "), time.Since(start).Seconds(), out)
}

// PID returns the process id of a cluster component (etcd, kubelet, kube-controller-manager...) from its pid file.
func (c *Cluster) PID(component string) (int, error) {
	file := filepath.Join(settings["PIDS"], component+".pid")
	raw, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	var pid int
	if _, err := fmt.Sscan(string(raw), &pid); err != nil {
		return 0, fmt.Errorf("pid file %s: %w", file, err)
	}
	return pid, nil
}

// Kubectl runs the kubectl of the cluster's version with the admin kubeconfig and returns stdout;
// a non-zero exit fails with stderr in the error.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// script runs test/e2e/cluster/NAME with its output to w (nil: discarded).
func (c *Cluster) script(w io.Writer, name string, args ...string) error {
	return c.run(w, filepath.Join(c.ScriptsDir, name), args...)
}

// run runs the script at path with its output to w (nil: discarded).
func (c *Cluster) run(w io.Writer, path string, args ...string) error {
	if w == nil {
		w = io.Discard
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), "REPO_ROOT="+c.RepoRoot)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return nil
}

func newCluster(root string) (*Cluster, error) {
	c := &Cluster{
		Kubeconfig:   settings["KUBECONFIG"],
		RepoRoot:     root,
		ScriptsDir:   filepath.Join(root, "test", "e2e", "cluster"),
		BinDir:       settings["BIN"],
		imagesScript: filepath.Join(settings["HACK_DIR"], "images.sh"),
	}
	if _, err := os.Stat(filepath.Join(c.ScriptsDir, "up.sh")); err != nil {
		return nil, fmt.Errorf("cluster scripts: %w", err)
	}
	return c, nil
}

func (c *Cluster) connect() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig %s: %w", c.Kubeconfig, err)
	}
	// Tests create many objects quickly; the client-side default (5 qps) would make them wait for nothing.
	cfg.QPS, cfg.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	c.REST, c.Client = cfg, cs
	return nil
}

func findRepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find repository root: %w", err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if f, err := os.Open(filepath.Join(d, "go.mod")); err == nil {
			s := bufio.NewScanner(f)
			s.Scan()
			f.Close()
			if strings.TrimSpace(strings.TrimPrefix(s.Text(), "module")) == ModulePath {
				return d, nil
			}
		}
		if d == filepath.Dir(d) {
			return "", fmt.Errorf("find repository root: no go.mod of %s above %s", ModulePath, dir)
		}
	}
}

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
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Names the cluster scripts use too (test/e2e/cluster/env.sh); keep them in sync.
const (
	// BusyboxImage is Debian's busybox-static with its applets (sh, wget, nslookup, httpd...).
	BusyboxImage = "local/busybox:1"
	// TrainerImage is the default trainer image: Debian forky's torch 2.14 with python-etcd, Open MPI, MPICH,
	// mpi4py and sshd, built by rootfs.sh and images.sh. TrainerImages lists every one.
	TrainerImage = "local/trainer:forky"
	// WebhookImage and SidecarImage are the project's binaries, built by images.sh from ./cmd.
	WebhookImage = "local/elastic-training-webhook:dev"
	SidecarImage = "local/rdzv-sidecar:dev"
	// NodeName is the only node.
	NodeName = "node1"
	// ClusterDomain is the DNS domain of Services and pods.
	ClusterDomain = "cluster.local"
	// ServiceCIDR holds every ClusterIP; the host has a guard route so that a packet to an address in it
	// that kube-proxy did not rewrite fails locally.
	ServiceCIDR = "10.96.0.0/16"
	// FakeGPUResource is advertised by the fake device plugin with FakeGPUCount devices (and AMDGPUResource
	// as well). Pods requesting them are scheduled and admitted, but no device is attached.
	FakeGPUResource = "nvidia.com/gpu"
	AMDGPUResource  = "amd.com/gpu"
	FakeGPUCount    = 8
)

// Trainer is a local trainer image and the torch it has (test/e2e/cluster/rootfs.sh, TRAINER_SUITES).
type Trainer struct {
	Image string
	Torch string // the torch version, as torch.__version__ prints it without its Debian suffix
}

// TrainerImages are the trainer images images.sh builds, newest torch first: tests that cover torch versions
// range over them.
var TrainerImages = []Trainer{
	{Image: "local/trainer:forky", Torch: "2.14.1"},
	{Image: "local/trainer:trixie", Torch: "2.6.0"},
}

// StockTrainer is the forky image without python-etcd, as a stock torch image is: what the chart's default
// backend (c10d) must train with.
var StockTrainer = Trainer{Image: "local/trainer:forky-no-etcd", Torch: "2.14.1"}

// ModulePath identifies the repository root (its go.mod).
const ModulePath = "github.com/elastic-training/elastic-training"

// e2eLock serialises e2e test binaries on one machine (go test runs packages in parallel): they share the
// one cluster, and one may stop it. It is not the scripts' lock, which up.sh/down.sh take themselves.
const e2eLock = "/run/lock/elastic-training-e2e.lock"

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
}

var current *Cluster

// Main brings the cluster up once per test binary (reusing one that already runs), runs the tests, and
// stops the cluster only if it started it. A cluster that was running before and was stopped by a test
// is started again, so a developer's cluster survives `go test`.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "e2e: FAIL: "+format+"\n", args...)
		return 1
	}
	if os.Geteuid() != 0 {
		return fail("the e2e tests need root: they start a kubelet and containerd and change routes and iptables; run them as root (sudo make test-e2e)")
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
		return fail("cannot bring the test cluster up: %v (logs under %s)", err, filepath.Join(cacheDir(), "run", "logs"))
	}
	if err := c.script(os.Stderr, "images.sh"); err != nil {
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
func (c *Cluster) scriptForTest(t testing.TB, what, name string) {
	t.Helper()
	var out bytes.Buffer
	if err := c.script(&out, name); err != nil {
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
	if w == nil {
		w = io.Discard
	}
	cmd := exec.Command(filepath.Join(c.ScriptsDir, name), args...)
	cmd.Env = append(os.Environ(), "REPO_ROOT="+c.RepoRoot)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func newCluster(root string) (*Cluster, error) {
	cache := cacheDir()
	c := &Cluster{
		Kubeconfig: filepath.Join(cache, "run", "admin.kubeconfig"),
		RepoRoot:   root,
		ScriptsDir: filepath.Join(root, "test", "e2e", "cluster"),
		BinDir:     filepath.Join(cache, "bin"),
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

// cacheDir mirrors env.sh: ET_CACHE, else ~/.cache/elastic-training.
func cacheDir() string {
	if d := os.Getenv("ET_CACHE"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/root"
	}
	return filepath.Join(home, ".cache", "elastic-training")
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

// lockFile takes an exclusive flock, saying so when it has to wait.
func lockFile(path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		fmt.Fprintf(os.Stderr, "e2e: waiting for another e2e test binary to finish with the cluster (lock %s)\n", path)
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
	}
	return func() { f.Close() }, nil
}

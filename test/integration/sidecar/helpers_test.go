// Package sidecar_test runs the real rdzv-sidecar binary against real
// programs: torchrun, torch and python-etcd from the Debian root filesystems
// of hack/rootfs.sh (forky: torch 2.14, trixie: torch 2.6, run
// through chroot), and the host's etcdctl, Open MPI and MPICH. Missing
// programs or root filesystems fail the tests: CI installs and builds them.
package sidecar_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

var sidecarBin string

// The tests that wait the longest on torch (TestTorchAgentTests, TestTorchrunElasticGrowShrink,
// TestLeaveRendezvousBeforeStop: two thirds of the package's time, most of it timeouts and sleeps) call t.Parallel,
// so Go runs them together once the others are done (make integration: -parallel 4); the figures they log are
// taken beside each other. The others run one at a time, so that the figures they log (a node loss, a store loss,
// a restore from the checkpoints) are a quiet machine's.

func TestMain(m *testing.M) {
	var flags []string
	if os.Getenv("ET_SIDECAR_RACE") != "" {
		flags = append(flags, "-race") // the binary then exits 66 on a data race
	}
	os.Exit(testenv.MainWithCommand(m, "./cmd/rdzv-sidecar", &sidecarBin, flags...))
}

// server is a running `rdzv-sidecar serve`.
type server struct {
	*testenv.Proc
	URL, Health, DataDir string
	C10d                 string // host:port of the c10d store
	port                 int
	args                 []string
	cgroup               string // if set, the cgroup.procs file serve joins before it starts
}

func startServe(t testing.TB, extra ...string) *server {
	t.Helper()
	s := newServe(t, extra...)
	s.start(t)
	return s
}

// newServe is startServe without the start.
func newServe(t testing.TB, extra ...string) *server {
	t.Helper()
	s := &server{port: testenv.FreePort(t), DataDir: filepath.Join(t.TempDir(), "data")}
	s.URL = fmt.Sprintf("http://127.0.0.1:%d", s.port)
	s.Health = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	s.C10d = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	s.args = append([]string{"serve", "--data-dir=" + s.DataDir,
		"--listen-client-urls=" + s.URL, "--advertise-client-urls=" + s.URL,
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", testenv.FreePort(t)),
		"--health-addr=" + s.Health, "--c10d-addr=" + s.C10d, "--unsafe-no-fsync"}, extra...)
	return s
}

func (s *server) start(t testing.TB) {
	t.Helper()
	cmd := exec.Command(sidecarBin, s.args...)
	if s.cgroup != "" {
		cmd = exec.Command("/bin/sh", append([]string{"-c", `echo $$ > "$0" && exec "$@"`, s.cgroup, sidecarBin}, s.args...)...)
	}
	s.Proc = testenv.Start(t, "serve", cmd)
	waitReady(t, s.Proc, s.Health)
}

// restart stops the server with SIGTERM and starts it again on the same
// ports and data dir.
func (s *server) restart(t testing.TB) {
	t.Helper()
	s.Signal(15)
	if err := s.Wait(t, 30*time.Second); err != nil {
		t.Fatalf("serve exited with %v after SIGTERM:\n%s", err, s.Output())
	}
	s.start(t)
}

// waitReady waits until p's /readyz on health answers 200.
func waitReady(t testing.TB, p *testenv.Proc, health string) {
	t.Helper()
	testenv.WaitHTTP(t, p, "http://"+health+"/readyz", http.StatusOK, 60*time.Second)
}

func startJoin(t testing.TB, endpoint, host string, slots int, filesDir string, extra ...string) *testenv.Proc {
	t.Helper()
	p, _ := startJoinHealth(t, endpoint, host, slots, filesDir, extra...)
	return p
}

// startJoinHealth is startJoin, and the address of the join's health port (/metrics).
func startJoinHealth(t testing.TB, endpoint, host string, slots int, filesDir string, extra ...string) (*testenv.Proc, string) {
	t.Helper()
	health := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	args := append([]string{"join", "--endpoints=" + endpoint, "--health-addr=" + health,
		"--member-host=" + host, fmt.Sprintf("--member-slots=%d", slots), "--lease-ttl=2s"}, extra...)
	if filesDir != "" {
		args = append(args, "--files-dir="+filesDir)
	}
	p := testenv.Start(t, "join "+host, exec.Command(sidecarBin, args...))
	waitReady(t, p, health)
	return p, health
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// torch: torchrun, python3, torch and python-etcd run from the Debian root
// filesystems that hack/rootfs.sh builds (testenv.Rootfs), never
// from the host.

func trainScript(t testing.TB) string {
	t.Helper()
	p, err := filepath.Abs("testdata/train.py")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// trainer is a root filesystem with torch: forky (torch 2.14) is what the
// tests run by default, trixie (torch 2.6) covers the older release.
type trainer struct {
	suite, root, version string
}

func newTrainer(t testing.TB, suite string) trainer {
	t.Helper()
	root := testenv.Rootfs(t, suite)
	return trainer{suite: suite, root: root, version: testenv.TorchVersion(t, root)}
}

// forky is the default trainer (torch 2.14); it logs the torch version.
func forky(t *testing.T) trainer { t.Helper(); return newTrainer(t, testenv.SuiteForky) }

// name names a subtest by the torch version: "torch-2.14.1".
func (tr trainer) name() string { return "torch-" + testenv.ShortVersion(tr.version) }

// closesOnSIGTERM: torch 2.3 to 2.7 close the whole rendezvous when an agent
// gets SIGTERM (pytorch#117066, undone by pytorch#152525), so every survivor
// of a scale-down would exit with RendezvousClosedError.
func (tr trainer) closesOnSIGTERM() bool {
	var major, minor int
	fmt.Sscanf(tr.version, "%d.%d", &major, &minor)
	return major == 2 && minor >= 3 && minor < 8
}

// command runs name (a path in the root filesystem) there.
func (tr trainer) command(name string, args ...string) *exec.Cmd {
	return testenv.InRootfs(tr.root, name, args...)
}

// python runs the root filesystem's python3 with the torch environment.
func (tr trainer) python(args ...string) *exec.Cmd {
	cmd := tr.command("/usr/bin/python3", args...)
	cmd.Env = torchrunEnv()
	return cmd
}

// torchrunEnv is the environment every agent needs (testenv.TorchEnv:
// USE_LIBUV=0 for Debian's libuv-less torch, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
// as the webhook sets it, unbuffered output, one OpenMP thread).
func torchrunEnv(extra ...string) []string {
	return testenv.TorchEnv(extra...)
}

func (tr trainer) startAgent(t testing.TB, name string, env []string, args ...string) *testenv.Proc {
	t.Helper()
	cmd := tr.command("/usr/bin/torchrun", args...)
	cmd.Env = env
	return testenv.Start(t, name, cmd)
}

var resultRe = regexp.MustCompile(`RESULT rank=(\d+) world=(\d+) sum=(\d+)`)

// requireTwoWorkerResults waits for each agent to exit 0 and checks its worker's RESULT line: a world of 2 whose
// all_reduce summed to 2.
func requireTwoWorkerResults(t *testing.T, agents ...*testenv.Proc) {
	t.Helper()
	for _, p := range agents {
		require.NoError(t, p.Wait(t, 180*time.Second), "%s failed:\n%s", p.Name, p.Output())
		m := resultRe.FindStringSubmatch(p.Output())
		require.NotNil(t, m, "no RESULT line from %s:\n%s", p.Name, p.Output())
		require.Equal(t, "2", m[2], "world size")
		require.Equal(t, "2", m[3], "all_reduce sum")
	}
}

// worldSizes lists the world sizes an agent's workers reported, in order.
func worldSizes(out string) []string {
	var ws []string
	for _, line := range strings.Split(out, "\n") {
		if m := regexp.MustCompile(`(?:RESULT|STEP).* world=(\d+)`).FindStringSubmatch(line); m != nil {
			if len(ws) == 0 || ws[len(ws)-1] != m[1] {
				ws = append(ws, m[1])
			}
		}
	}
	return ws
}

// v2Get reads a key through the v2 API.
func v2Get(url string) (int, map[string]any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var body map[string]any
	err = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body, err
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// forEachTorch runs f as a subtest on torch 2.14 (forky) and torch 2.6 (trixie).
func forEachTorch(t *testing.T, f func(t *testing.T, tr trainer)) {
	for _, suite := range []string{testenv.SuiteForky, testenv.SuiteTrixie} {
		tr := newTrainer(t, suite)
		t.Run(tr.name(), func(t *testing.T) { f(t, tr) })
	}
}

// forTorchVersions runs f on torch 2.14 (forky) with every backend and on torch 2.6 (trixie) with etcd-v2 and c10d:
// the versions differ in what SIGTERM does to the rendezvous. The cases run at once (t.Parallel, up to the
// package's -parallel): each has a server, run id and agents of its own, and most of a case's time is torch's own
// waiting (leases, last-call and keep-alive timeouts), not the 2 cores.
func forTorchVersions(t *testing.T, f func(t *testing.T, tr trainer, backend string)) {
	for _, tc := range []struct {
		suite    string
		backends []string
	}{{testenv.SuiteForky, backends}, {testenv.SuiteTrixie, []string{"etcd-v2", "c10d"}}} {
		tr := newTrainer(t, tc.suite)
		t.Run(tr.name(), func(t *testing.T) {
			t.Parallel()
			for _, backend := range tc.backends {
				t.Run(backend, func(t *testing.T) {
					t.Parallel()
					f(t, tr, backend)
				})
			}
		})
	}
}

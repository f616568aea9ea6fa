// Package testenv is the project's general test support (beside it:
// internal/testcert's certificates, internal/mutate/mutatetest's pods,
// internal/tcpstore/tcpstoretest's store servers, test/e2e/framework's
// cluster). It helps tests and benchmarks run real programs (etcd 3.4, rdzv-sidecar, torchrun,
// mpirun): free loopback ports (ports.go: PickFreePort, FreePort), polling
// instead of sleeping (poll.go: Poll, PollHTTP, CheckHTTP, Eventually,
// WaitHTTP, WaitOutput), required binaries that fail the test with a clear
// reason when missing, the repository's commands built once for a package's
// tests (MainWithCommand), processes (and their whole trees) that are always
// stopped in t.Cleanup (proc.go: Start, Proc, SyncBuffer), and torch from
// the Debian root filesystems of hack/rootfs.sh (rootfs.go:
// Rootfs, InRootfs, TorchEnv; torchrun.go: TorchrunArgs), and the Median of
// measurements (stats.go), and benchmarks' settings from the environment (knob.go: Knob). Helm charts are rendered client-side by its
// subpackage chartrender, and etcd v3 clients come from its subpackage
// etcdtest: both keep their dependencies out of the tests that need none.
//
// Helpers that take a testing.TB fail the test; the port, polling and
// root-filesystem ones each have a form that returns an error instead, for
// code without a test (PickFreePort, Poll and PollHTTP, RootfsDir), and
// MainWithCommand is a TestMain's.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// MainWithCommand is the body of a TestMain whose tests run a command of
// this repository: it builds pkg (e.g. "./cmd/rdzv-sidecar") with go build
// and flags into a temporary directory, sets *bin to the binary, runs m and
// removes the binary. It returns the exit code for os.Exit: m.Run's, or 1
// when the build fails.
func MainWithCommand(m *testing.M, pkg string, bin *string, flags ...string) int {
	name := filepath.Base(pkg)
	dir, err := os.MkdirTemp("", name+"-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	*bin = filepath.Join(dir, name)
	build := exec.Command("go", append(append([]string{"build", "-o", *bin}, flags...), pkg)...)
	build.Dir = RepoRoot()
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "build %s: %v\n", name, err)
		return 1
	}
	return m.Run()
}

// RequireBinary fails the test (it does not skip: CI installs these) when
// path is not an executable.
func RequireBinary(t testing.TB, path, debianPackage string) string {
	t.Helper()
	if _, err := exec.LookPath(path); err != nil {
		t.Fatalf("%s is required (apt-get install %s): %v", path, debianPackage, err)
	}
	return path
}

// Etcd34Args are the arguments of Debian's etcd 3.4 as the v2 reference
// server: one member named ref with data in dataDir, the v2 API enabled,
// serving clients on client and peers on peer (URLs), errors logged only.
func Etcd34Args(dataDir, client, peer string) []string {
	return []string{"--name=ref", "--data-dir=" + dataDir, "--enable-v2",
		"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=ref=" + peer, "--log-level=error"}
}

// Etcd34 starts Debian's etcd 3.4 (StartEtcd34, without fsync) and returns
// its client URL once it answers.
func Etcd34(t testing.TB) string {
	t.Helper()
	_, client := StartEtcd34(t, filepath.Join(t.TempDir(), "etcd"), "--unsafe-no-fsync")
	return client
}

// StartEtcd34 starts Debian's etcd 3.4 (Etcd34Args with data in dataDir,
// then extra) on free loopback ports and returns it and its client URL once
// it answers.
func StartEtcd34(t testing.TB, dataDir string, extra ...string) (*Proc, string) {
	t.Helper()
	bin := RequireBinary(t, "/usr/bin/etcd", "etcd-server")
	client := fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
	cmd := exec.Command(bin, append(Etcd34Args(dataDir, client, peer), extra...)...)
	cmd.Env = append(os.Environ(), "ETCD_UNSUPPORTED_ARCH=")
	p := Start(t, "etcd-3.4", cmd)
	WaitHTTP(t, p, client+"/v2/keys/", 0, 20*time.Second)
	return p, client
}

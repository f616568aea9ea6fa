// Package testenv is the project's one test-support package. It helps tests,
// and the benchmarks' mains, run real programs (etcd 3.4, torchrun, mpirun):
// free loopback ports (ports.go: PickFreePort, FreePort), polling instead of
// sleeping (poll.go: Poll, PollHTTP, CheckHTTP, Eventually, WaitHTTP),
// required binaries that fail the test with a clear reason when missing,
// processes (and their whole trees) that are always stopped in t.Cleanup
// (proc.go), and torch from the Debian root filesystems of
// test/e2e/cluster/rootfs.sh (rootfs.go: Rootfs, InRootfs, TorchEnv). Helm
// charts are rendered client-side by its subpackage chartrender, which keeps
// the Helm SDK out of the tests that need none of it.
//
// Helpers that take a testing.TB fail the test; the port, polling and
// root-filesystem ones each have a form that returns an error instead, for
// code without a test (PickFreePort, Poll and PollHTTP, RootfsDir).
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

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

// Etcd34 starts Debian's etcd 3.4 (Etcd34Args, without fsync) on free
// loopback ports and returns its client URL once it answers.
func Etcd34(t testing.TB) string {
	t.Helper()
	bin := RequireBinary(t, "/usr/bin/etcd", "etcd-server")
	client := fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
	cmd := exec.Command(bin, append(Etcd34Args(filepath.Join(t.TempDir(), "etcd"), client, peer), "--unsafe-no-fsync")...)
	cmd.Env = append(os.Environ(), "ETCD_UNSUPPORTED_ARCH=")
	p := Start(t, "etcd-3.4", cmd)
	WaitHTTP(t, p, client+"/v2/keys/", 0, 20*time.Second)
	return client
}

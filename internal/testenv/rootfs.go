package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Trainer root filesystems: torch, python-etcd and Python run from Debian
// suites that hack/rootfs.sh builds with mmdebstrap into
// $ET_CACHE/rootfs/<suite> (forky: torch 2.14, trixie: torch 2.6), never from
// the host. Tests run programs there through InRootfs, which needs root.

// Suites of the trainer root filesystems (test/e2e/cluster/env.sh's
// TRAINER_SUITES); the first is the default for tests that need one torch.
const (
	SuiteForky  = "forky"  // torch 2.14, Python 3.14
	SuiteTrixie = "trixie" // torch 2.6, Python 3.13
)

// RootfsWait is how long Rootfs waits for rootfs.sh while it (re)builds a
// root filesystem.
const RootfsWait = 15 * time.Minute

// RootfsBase is $ET_CACHE/rootfs, as test/e2e/cluster/env.sh sets it
// (ET_CACHE defaults to $HOME/.cache/elastic-training).
func RootfsBase() string {
	cache := os.Getenv("ET_CACHE")
	if cache == "" {
		home := os.Getenv("HOME")
		if home == "" {
			home = "/root"
		}
		cache = filepath.Join(home, ".cache", "elastic-training")
	}
	return filepath.Join(cache, "rootfs")
}

// RootfsDir returns the root filesystem of suite once its .et-stamp exists.
// While rootfs.sh holds its lock (a build in progress) it waits up to wait,
// calling logf once; a root filesystem that is missing with no build under
// way is an error that says how to build it.
func RootfsDir(suite string, wait time.Duration, logf func(format string, args ...any)) (string, error) {
	base := RootfsBase()
	dir := filepath.Join(base, suite)
	stamp := filepath.Join(dir, ".et-stamp")
	deadline := time.Now().Add(wait)
	logged := false
	for {
		if _, err := os.Stat(stamp); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "usr/bin/torchrun")); err != nil {
				return "", fmt.Errorf("root filesystem %s has no /usr/bin/torchrun (%v): rebuild it with "+
					"hack/rootfs.sh %s (as root)", dir, err, suite)
			}
			return dir, nil
		}
		if !rootfsBuilding(base) {
			if _, err := os.Stat(stamp); err == nil {
				continue // finished between the two checks
			}
			return "", fmt.Errorf("trainer root filesystem %s is missing (no %s): build it with "+
				"hack/rootfs.sh %s (as root, needs the Debian mirror; about 2 minutes per suite)", dir, stamp, suite)
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("trainer root filesystem %s: hack/rootfs.sh is still building it after %s", dir, wait)
		}
		if !logged && logf != nil {
			logf("waiting for hack/rootfs.sh to finish building %s", dir)
			logged = true
		}
		time.Sleep(2 * time.Second)
	}
}

// rootfsBuilding reports whether rootfs.sh holds its lock ($ROOTFS/.lock).
func rootfsBuilding(base string) bool {
	f, err := os.Open(filepath.Join(base, ".lock"))
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

// Rootfs returns the root filesystem of suite (SuiteForky, SuiteTrixie),
// waiting while rootfs.sh builds it. It fails the test (never skips) when the
// root filesystem is missing or the test does not run as root.
func Rootfs(t testing.TB, suite string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("running programs in the trainer root filesystem (%s) needs root (mount namespace, chroot)", suite)
	}
	dir, err := RootfsDir(suite, RootfsWait, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

var torchVersions sync.Map // root -> string

// RootfsTorchVersion is torch.__version__ in root (e.g. "2.14.1+debian"),
// read once per root filesystem and process.
func RootfsTorchVersion(root string) (string, error) {
	if v, ok := torchVersions.Load(root); ok {
		return v.(string), nil
	}
	out, err := InRootfs(root, "/usr/bin/python3", "-c", "import torch; print(torch.__version__)").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("import torch in %s: %v\n%s", root, err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	v := strings.TrimSpace(lines[len(lines)-1])
	torchVersions.Store(root, v)
	return v, nil
}

// TorchVersion is RootfsTorchVersion for tests: it fails the test on error
// and logs "torch <version> (<root>)".
func TorchVersion(t testing.TB, root string) string {
	t.Helper()
	v, err := RootfsTorchVersion(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("torch %s (%s)", v, root)
	return v
}

// ShortVersion drops a local version label: "2.14.1+debian" -> "2.14.1".
func ShortVersion(v string) string {
	v, _, _ = strings.Cut(v, "+")
	return v
}

// TorchEnv is the environment every torch process in a trainer root
// filesystem needs, on top of the caller's: Debian builds torch without
// libuv (torch >= 2.4 asks for it: USE_LIBUV=0), and the agent's TCPStore is
// not shared with the workers (torch >= 2.5 shares it, and then a scale-up
// never completes on etcd-v2 and c10d; the webhook sets the same variable).
func TorchEnv(extra ...string) []string {
	env := append(os.Environ(), "USE_LIBUV=0", "PYTHONUNBUFFERED=1", "OMP_NUM_THREADS=1",
		"TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")
	return append(env, extra...)
}

// RepoRoot is the checkout this package was built from.
func RepoRoot() string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(self), "../.."))
}

// inRootfsScript runs as sh -c in a private mount namespace: $1 the root
// filesystem, $2 a scratch directory to mount a tmpfs on (only in this
// namespace), $3 the number of directories to bind, then those directories,
// then the program and its arguments. The root filesystem is the lower layer
// of an overlay whose upper layer is that tmpfs, so mount points and anything
// the programs write never reach it (images.sh packs it into images).
const inRootfsScript = `set -e
root=$1 s=$2 n=$3; shift 3
# This namespace's copies of the host's network-namespace mounts (pods of a running cluster) would keep
# containerd from removing them while the program runs: drop them here.
for m in $(awk '$5 ~ "^/(var/)?run/netns/" { print $5 }' /proc/self/mountinfo); do umount -l "$m" 2>/dev/null || true; done
mount -t tmpfs -o mode=0755 et-rootfs "$s"
mkdir "$s/upper" "$s/work" "$s/root"
mount -t overlay -o "lowerdir=$root,upperdir=$s/upper,workdir=$s/work" et-rootfs "$s/root"
r=$s/root
mount --bind /proc "$r/proc"
mount --rbind /dev "$r/dev"
mount --rbind /sys "$r/sys"
for f in /etc/hosts /etc/resolv.conf; do
  if [ -e "$f" ]; then rm -f "$r$f"; : > "$r$f"; mount --bind "$f" "$r$f"; fi
done
while [ "$n" -gt 0 ]; do
  mkdir -p "$r$1"; mount --rbind "$1" "$r$1"; shift; n=$((n-1))
done
exec chroot "$r" /bin/sh -c 'cd "$1" 2>/dev/null || cd /; shift; exec "$@"' sh "$PWD" "$@"
`

// InRootfs returns a command that runs name (a path inside the root
// filesystem, e.g. /usr/bin/torchrun) with args in root, as root: a private
// mount namespace (unshare), the host's /proc, /dev, /sys, /etc/hosts and
// /etc/resolv.conf, /tmp, os.TempDir() and the repository checkout bound at
// the same paths, then chroot. Every step execs the next, so the command's
// PID is name's own (signals reach it; /proc/<pid> is the program), and the
// network is the host's. The working directory is kept when it is under a
// bound directory. Set Env, Stdout etc. on the result as for exec.Command.
func InRootfs(root, name string, args ...string) *exec.Cmd {
	binds := rootfsBinds()
	full := append([]string{"--mount", "--propagation", "private", "/bin/sh", "-c", inRootfsScript, "sh",
		root, scratchDir(binds), fmt.Sprint(len(binds))}, binds...)
	full = append(append(full, name), args...)
	return exec.Command("/usr/bin/unshare", full...)
}

// rootfsBinds: /tmp, os.TempDir() and the checkout, without duplicates or
// directories below another one.
func rootfsBinds() []string {
	var out []string
	for _, d := range []string{"/tmp", os.TempDir(), RepoRoot()} {
		d = filepath.Clean(d)
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() || d == "/" {
			continue
		}
		covered := false
		for _, o := range out {
			if d == o || strings.HasPrefix(d, o+"/") {
				covered = true
			}
		}
		if !covered {
			out = append(out, d)
		}
	}
	return out
}

// scratchDir is a host directory that the namespace may cover with a tmpfs:
// one that exists and holds nothing the programs need.
func scratchDir(binds []string) string {
	for _, d := range []string{"/media", "/srv", "/opt", "/mnt"} {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			continue
		}
		ok := true
		for _, b := range append([]string{RootfsBase()}, binds...) {
			if b == d || strings.HasPrefix(b, d+"/") {
				ok = false
			}
		}
		if ok {
			return d
		}
	}
	return "/media"
}

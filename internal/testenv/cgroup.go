package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// MemoryCgroup makes a memory cgroup limited to limit bytes, as a
// container's memory limit is, removed when the test ends, and returns the
// file that a process joins it through by writing its PID (cgroup.procs).
// It takes cgroup v2 (/sys/fs/cgroup with the memory controller) or v1
// (/sys/fs/cgroup/memory); it needs root.
func MemoryCgroup(t testing.TB, limit int64) string {
	t.Helper()
	name := fmt.Sprintf("et-test-%d-%s", os.Getpid(), filepath.Base(t.TempDir()))
	var dir, limitFile string
	switch {
	case fileExists("/sys/fs/cgroup/cgroup.controllers"):
		dir, limitFile = filepath.Join("/sys/fs/cgroup", name), "memory.max"
	case fileExists("/sys/fs/cgroup/memory/memory.limit_in_bytes"):
		dir, limitFile = filepath.Join("/sys/fs/cgroup/memory", name), "memory.limit_in_bytes"
	default:
		t.Fatal("no memory cgroup: neither cgroup v2 (/sys/fs/cgroup/cgroup.controllers) nor v1 (/sys/fs/cgroup/memory) is mounted")
	}
	makeCgroup(t, "memory", dir, limitFile, strconv.FormatInt(limit, 10))
	return filepath.Join(dir, "cgroup.procs")
}

// CPUCgroup makes a CPU cgroup weighted as Kubernetes weights a container
// that requests milliCPU (cgroup v1 cpu.shares = milliCPU*1024/1000, at
// least 2; v2 cpu.weight converted from those shares as the kubelet does),
// removed when the test ends, and returns its cgroup.procs file. Needs root.
func CPUCgroup(t testing.TB, milliCPU int64) string {
	t.Helper()
	shares := max(milliCPU*1024/1000, 2)
	name := fmt.Sprintf("et-test-%d-%s", os.Getpid(), filepath.Base(t.TempDir()))
	var dir, file, value string
	switch {
	case fileExists("/sys/fs/cgroup/cgroup.controllers"):
		dir, file, value = filepath.Join("/sys/fs/cgroup", name), "cpu.weight", strconv.FormatInt(1+((shares-2)*9999)/262142, 10)
	case fileExists("/sys/fs/cgroup/cpu/cpu.shares"):
		dir, file, value = filepath.Join("/sys/fs/cgroup/cpu", name), "cpu.shares", strconv.FormatInt(shares, 10)
	default:
		t.Fatal("no CPU cgroup: neither cgroup v2 (/sys/fs/cgroup/cgroup.controllers) nor v1 (/sys/fs/cgroup/cpu) is mounted")
	}
	makeCgroup(t, "CPU", dir, file, value)
	return filepath.Join(dir, "cgroup.procs")
}

// makeCgroup creates the cgroup dir with its file set to value, removed after the test's processes (registered
// earlier) have ended.
func makeCgroup(t testing.TB, what, dir, file, value string) {
	t.Helper()
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("%s cgroup (needs root): %v", what, err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Logf("removing %s cgroup %s: %v", what, dir, err)
		}
	})
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0o644); err != nil {
		t.Fatalf("%s cgroup %s: %v", what, dir, err)
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

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
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("memory cgroup (needs root): %v", err)
	}
	// Removed after the test's processes (registered earlier) have ended.
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Logf("removing memory cgroup %s: %v", dir, err)
		}
	})
	if err := os.WriteFile(filepath.Join(dir, limitFile), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		t.Fatalf("memory cgroup %s: %v", dir, err)
	}
	return filepath.Join(dir, "cgroup.procs")
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

package testenv

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// descendants lists every process below pid, from /proc's parent links.
func descendants(pid int) []int {
	parent := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 2 {
			continue
		}
		if pp, err := strconv.Atoi(f[1]); err == nil {
			parent[n] = pp
		}
	}
	var out []int
	seen := map[int]bool{pid: true}
	for todo := []int{pid}; len(todo) > 0; {
		var next []int
		for c, pp := range parent {
			if !seen[c] && slices.Contains(todo, pp) {
				seen[c] = true
				next = append(next, c)
			}
		}
		out = append(out, next...)
		todo = next
	}
	return out
}

// StatusBytes is a /proc/<pid>/status field given in kB (VmRSS, VmHWM: the
// peak), in bytes.
func StatusBytes(pid int, field string) (int64, error) {
	s, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(s), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field+":" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

// CPUSeconds is the user and system CPU time a process has used.
func CPUSeconds(pid int) (float64, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command, which may hold spaces: state is field 3,
	// utime 14 and stime 15.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, stat)
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100, nil // USER_HZ
}

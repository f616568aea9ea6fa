package testenv

import (
	"bytes"
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

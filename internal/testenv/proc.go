package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is a started process whose output is kept for failure messages.
type Proc struct {
	Cmd  *exec.Cmd
	Name string
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	err  error
}

func (p *Proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

// Output is everything the process printed so far.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the exit error once Done is closed.
func (p *Proc) Err() error { <-p.done; return p.err }

// Wait waits up to timeout for the process to exit and returns its error.
func (p *Proc) Wait(t testing.TB, timeout time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s; output:\n%s", p.Name, timeout, p.Output())
		return nil
	}
}

// Signal sends sig to the process group.
func (p *Proc) Signal(sig syscall.Signal) {
	if p.Cmd.Process != nil {
		syscall.Kill(-p.Cmd.Process.Pid, sig)
	}
}

// Kill stops the process, its group and every process below it with
// SIGKILL, as when a pod is deleted: torchrun (torch 2.x) starts its workers
// in sessions of their own, which the group's signal does not reach.
func (p *Proc) Kill() {
	if p.Cmd.Process == nil {
		return
	}
	pid := p.Cmd.Process.Pid
	select {
	case <-p.done: // reaped: its PID may be another process' now
		syscall.Kill(-pid, syscall.SIGKILL)
		return
	default:
	}
	syscall.Kill(-pid, syscall.SIGSTOP) // no new workers while the tree is read
	below := Descendants(pid)
	syscall.Kill(-pid, syscall.SIGKILL)
	for _, d := range below {
		syscall.Kill(d, syscall.SIGKILL)
	}
}

// Descendants lists every process below pid, from /proc's parent links.
func Descendants(pid int) []int {
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

// Start runs cmd in its own process group, captures its output and kills
// the group in t.Cleanup. With ET_TEST_VERBOSE=1 output also goes to stderr.
func Start(t testing.TB, name string, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{Cmd: cmd, Name: name, done: make(chan struct{})}
	if os.Getenv("ET_TEST_VERBOSE") != "" {
		cmd.Stdout = &prefixWriter{p: p, prefix: name}
	} else {
		cmd.Stdout = p
	}
	cmd.Stderr = cmd.Stdout
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.Kill()
		<-p.done
		if strings.Contains(p.Output(), "WARNING: DATA RACE") {
			t.Errorf("%s reported a data race", name)
		}
		if t.Failed() {
			t.Logf("--- output of %s ---\n%s", name, p.Output())
		}
	})
	return p
}

type prefixWriter struct {
	p      *Proc
	prefix string
}

func (w *prefixWriter) Write(b []byte) (int, error) {
	fmt.Fprintf(os.Stderr, "[%s] %s", w.prefix, b)
	return w.p.Write(b)
}

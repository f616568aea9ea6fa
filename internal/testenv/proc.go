package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// SyncBuffer is a bytes.Buffer safe for concurrent Write and String: a log
// handler's output that a test reads while a server writes to it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Proc is a started process whose output is kept for failure messages.
type Proc struct {
	Cmd  *exec.Cmd
	Name string
	out  SyncBuffer
	done chan struct{}
	err  error
}

func (p *Proc) Write(b []byte) (int, error) { return p.out.Write(b) }

// Output is everything the process printed so far.
func (p *Proc) Output() string { return p.out.String() }

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

// Stop ends the process gracefully: SIGTERM to its group, then after grace
// SIGKILL to the group and every process below it, those that were there
// before the SIGTERM included (torchrun starts its workers in sessions of
// their own). It returns once the process has exited.
func (p *Proc) Stop(grace time.Duration) {
	below := descendants(p.Cmd.Process.Pid)
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
		for _, d := range below {
			syscall.Kill(d, syscall.SIGKILL)
		}
		<-p.done
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
	below := descendants(pid)
	syscall.Kill(-pid, syscall.SIGKILL)
	for _, d := range below {
		syscall.Kill(d, syscall.SIGKILL)
	}
}

// WaitOutput polls p's output until it contains s, and fails the test when p
// exits first or timeout passes.
func WaitOutput(t testing.TB, p *Proc, s string, timeout time.Duration) {
	t.Helper()
	waitWhileRunning(t, p, timeout, fmt.Sprintf(" to print %q", s), func() error {
		if !strings.Contains(p.Output(), s) {
			return fmt.Errorf("not printed yet")
		}
		return nil
	})
}

// waitWhileRunning is Eventually(p.Name+what, cond) that fails the test as
// soon as cond does not hold once p has exited.
func waitWhileRunning(t testing.TB, p *Proc, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	Eventually(t, timeout, p.Name+what, func() error {
		err := cond()
		if err != nil {
			select {
			case <-p.Done():
				t.Fatalf("%s exited early: %v\n%s", p.Name, p.err, p.Output())
			default:
			}
		}
		return err
	})
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

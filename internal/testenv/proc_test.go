package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestStop(t *testing.T) {
	t.Run("SIGTERM", func(t *testing.T) {
		p := Start(t, "sleep", exec.Command("sleep", "60"))
		t0 := time.Now()
		p.Stop(30 * time.Second)
		if d := time.Since(t0); d > 10*time.Second {
			t.Errorf("sleep took %s to end on SIGTERM", d)
		}
	})
	t.Run("SIGKILL after grace, to a child in a session of its own too", func(t *testing.T) {
		// Ignored signals stay ignored across exec: neither sh nor sleep ends on SIGTERM.
		p := Start(t, "stubborn", exec.Command("sh", "-c", `trap "" TERM; setsid sleep 60 & echo READY; wait`))
		WaitOutput(t, p, "READY", 10*time.Second)
		var below []int
		Eventually(t, 10*time.Second, "sleep below sh", func() error {
			if below = descendants(p.Cmd.Process.Pid); len(below) == 0 {
				return fmt.Errorf("no process below sh yet")
			}
			return nil
		})
		t0 := time.Now()
		p.Stop(300 * time.Millisecond)
		if d := time.Since(t0); d < 300*time.Millisecond || d > 10*time.Second {
			t.Errorf("Stop returned after %s, want the grace of 300ms and little more", d)
		}
		for _, pid := range below {
			Eventually(t, 10*time.Second, fmt.Sprintf("process %d gone", pid), func() error {
				b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
				if err != nil || strings.Contains(string(b), ") Z ") { // gone, or a zombie nobody reaps here
					return nil
				}
				return fmt.Errorf("still running: %s", b)
			})
		}
	})
}

func TestWaitOutput(t *testing.T) {
	p := Start(t, "echo", exec.Command("sh", "-c", "echo one; sleep 0.2; echo two; sleep 60"))
	WaitOutput(t, p, "two", 10*time.Second)
	if got := p.Output(); got != "one\ntwo\n" {
		t.Errorf("output %q", got)
	}
	// Printed, then exited: still found.
	q := Start(t, "done", exec.Command("echo", "READY"))
	<-q.Done()
	WaitOutput(t, q, "READY", time.Second)
}

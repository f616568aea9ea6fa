package podcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/membership/etcdmembers"
)

// ExitMemberLost is supervise's exit status when it stopped its command
// because a member left (EX_TEMPFAIL: run it again on the hosts that remain).
const ExitMemberLost = 75

// SuperviseConfig configures supervise mode.
type SuperviseConfig struct {
	QueryConfig
	Command []string
	// Grace is how long the command has after SIGTERM before SIGKILL.
	Grace time.Duration
	// StopOnJoin stops the command (ExitMemberLost too) when a member joins:
	// a plain mpirun never uses a host it did not start with.
	StopOnJoin bool
	// LossWindow: when the command fails, how long to wait for a member of
	// its start to leave, which makes it ExitMemberLost after all (0: none).
	// On a scale-down the worker's sshd stops before its sidecar deregisters,
	// so mpirun sees the host go first.
	LossWindow time.Duration
}

// Supervise runs cfg.Command (an MPI launcher: mpirun, mpiexec) in a process
// group of its own and returns its exit status, unless a member registered
// when it started leaves first: then it stops the whole group (SIGTERM, then
// SIGKILL after cfg.Grace) and returns ExitMemberLost. mpirun has no way to
// learn that a host is gone when its node vanishes (no FIN, no RST: its ranks
// wait in a collective for ever); the membership knows within the lease TTL.
// ctx ending (SIGTERM to supervise) stops the command the same way.
func Supervise(ctx context.Context, cfg SuperviseConfig, stderr io.Writer) (int, error) {
	code, _, err := supervise(ctx, cfg, stderr)
	return code, err
}

// supervise is Supervise, and says whether it stopped the command because a
// member joined.
func supervise(ctx context.Context, cfg SuperviseConfig, stderr io.Writer) (code int, joined bool, err error) {
	if len(cfg.Command) == 0 {
		return 0, false, errors.New("no command: rdzv-sidecar supervise [flags] -- mpirun ...")
	}
	cli, err := cfg.connect()
	if err != nil {
		return 0, false, err
	}
	defer cli.Close()
	lctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	start, _, err := etcdmembers.List(lctx, cli, cfg.Prefix)
	cancel()
	if err != nil {
		return 0, false, fmt.Errorf("listing the members: %w", err)
	}
	fmt.Fprintf(stderr, "rdzv-sidecar supervise: %s; stops %s if one of them leaves\n", membership.Describe(start), cfg.Command[0])

	cmd := exec.Command(cfg.Command[0], cfg.Command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return 0, false, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	lost := make(chan []string, 1)
	came := make(chan []string, 1)
	go etcdmembers.Watch(wctx, cli, cfg.Prefix, 2*time.Second, nil, func(ms []membership.Member) {
		in, left := membership.Diff(start, ms)
		if len(left) > 0 {
			select {
			case lost <- left:
			default:
			}
		} else if len(in) > 0 && cfg.StopOnJoin {
			select {
			case came <- in:
			default:
			}
		}
	})

	var stopped int // the exit status when supervise stopped the command
	select {
	case err := <-exited:
		code, err := exitStatus(err)
		if err != nil || code == 0 || cfg.LossWindow <= 0 {
			return code, false, err
		}
		select {
		case left := <-lost:
			fmt.Fprintf(stderr, "rdzv-sidecar supervise: %s exited with status %d and %s left the membership; exit status %d: run it again on the hosts that remain\n",
				cfg.Command[0], code, strings.Join(left, ","), ExitMemberLost)
			return ExitMemberLost, false, nil
		case <-time.After(cfg.LossWindow):
		case <-ctx.Done():
		}
		return code, false, nil
	case left := <-lost:
		fmt.Fprintf(stderr, "rdzv-sidecar supervise: %s left the membership; stopping %s (exit status %d: run it again on the hosts that remain)\n",
			strings.Join(left, ","), cfg.Command[0], ExitMemberLost)
		stopped = ExitMemberLost
	case in := <-came:
		fmt.Fprintf(stderr, "rdzv-sidecar supervise: %s joined the membership; stopping %s (exit status %d: run it again on every host)\n",
			strings.Join(in, ","), cfg.Command[0], ExitMemberLost)
		stopped, joined = ExitMemberLost, true
	case <-ctx.Done():
		stopped = 128 + int(syscall.SIGTERM)
	}
	pgid := -cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(cfg.Grace):
		fmt.Fprintf(stderr, "rdzv-sidecar supervise: %s still runs %s after SIGTERM; SIGKILL\n", cfg.Command[0], cfg.Grace)
		_ = syscall.Kill(pgid, syscall.SIGKILL)
		<-exited
	}
	_ = syscall.Kill(pgid, syscall.SIGKILL) // whatever of the group outlived its leader
	return stopped, joined, nil
}

// exitStatus is the exit status a shell would report for the command.
func exitStatus(err error) (int, error) {
	if err == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return 0, err
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return ee.ExitCode(), nil
}

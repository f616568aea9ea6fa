package podcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/membership/etcdmembers"
	"github.com/elastic-training/elastic-training/internal/progress"
)

// ExitMemberLost is supervise's exit status when it stopped its command
// because a member left (EX_TEMPFAIL: run it again on the hosts that remain),
// or because its ranks stopped advancing (a hang: run it again).
const ExitMemberLost = 75

// stopReason is why supervise stopped its command.
type stopReason int

const (
	ranOut     stopReason = iota // it ended by itself, or supervise was stopped
	memberLost                   // a member of its start left
	memberCame                   // a member joined (SuperviseConfig.StopOnJoin)
	ranksHung                    // its ranks said their progress and then none advanced (SuperviseConfig.Hang)
)

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
	// Hang: how the ranks' progress is judged (hang.go).
	Hang HangConfig
}

// Supervise runs cfg.Command (an MPI launcher: mpirun, mpiexec) in a process
// group of its own and returns its exit status, unless a member registered
// when it started leaves first: then it stops the whole group (SIGTERM, then
// SIGKILL after cfg.Grace) and returns ExitMemberLost. mpirun has no way to
// learn that a host is gone when its node vanishes (no FIN, no RST: its ranks
// wait in a collective for ever); the membership knows within the lease TTL.
// Likewise when the ranks said their progress and then none advanced for the
// hang timeout (cfg.Hang). ctx ending (SIGTERM to supervise) stops the command
// the same way.
func Supervise(ctx context.Context, cfg SuperviseConfig, stderr io.Writer) (int, error) {
	code, _, err := supervise(ctx, cfg, stderr)
	return code, err
}

// supervise is Supervise, and says why it stopped the command.
func supervise(ctx context.Context, cfg SuperviseConfig, stderr io.Writer) (code int, why stopReason, err error) {
	if len(cfg.Command) == 0 {
		return 0, ranOut, errors.New("no command: rdzv-sidecar supervise [flags] -- mpirun ...")
	}
	cli, err := cfg.connect()
	if err != nil {
		return 0, ranOut, err
	}
	defer cli.Close()
	lctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	start, _, err := etcdmembers.List(lctx, cli, cfg.Prefix)
	if err != nil {
		cancel()
		return 0, ranOut, fmt.Errorf("listing the members: %w", err)
	}
	var rev int64
	if !cfg.Hang.Off {
		if rev, err = progressRevision(lctx, cli); err != nil {
			cancel()
			return 0, ranOut, fmt.Errorf("reading the progress reports' revision: %w", err)
		}
	}
	cancel()
	var mu sync.Mutex // the watchers say things too
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(stderr, "rdzv-sidecar supervise: "+format+"\n", args...)
	}
	if cfg.Hang.Off {
		say("%s; stops %s if one of them leaves", membership.Describe(start), cfg.Command[0])
	} else {
		say("%s; stops %s if one of them leaves, or if its ranks say their progress (elastic_training.progress) and none advances for %s",
			membership.Describe(start), cfg.Command[0], hangTimeoutText(cfg.Hang.Timeout))
	}

	cmd := exec.Command(cfg.Command[0], cfg.Command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return 0, ranOut, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	hung := make(chan progress.Verdict, 1)
	if !cfg.Hang.Off {
		hosts := make([]string, len(start))
		for i, m := range start {
			hosts[i] = m.Host
		}
		go newHangs(cfg.Hang, hosts, time.Now(), say).watch(wctx, cli, rev, hung)
	}
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
			return code, ranOut, err
		}
		select {
		case left := <-lost:
			say("%s exited with status %d and %s left the membership; exit status %d: run it again on the hosts that remain",
				cfg.Command[0], code, strings.Join(left, ","), ExitMemberLost)
			return ExitMemberLost, memberLost, nil
		case <-time.After(cfg.LossWindow):
		case <-ctx.Done():
		}
		return code, ranOut, nil
	case left := <-lost:
		say("%s left the membership; stopping %s (exit status %d: run it again on the hosts that remain)",
			strings.Join(left, ","), cfg.Command[0], ExitMemberLost)
		stopped, why = ExitMemberLost, memberLost
	case in := <-came:
		say("%s joined the membership; stopping %s (exit status %d: run it again on every host)",
			strings.Join(in, ","), cfg.Command[0], ExitMemberLost)
		stopped, why = ExitMemberLost, memberCame
	case v := <-hung:
		say("hung: no rank advanced for %s (at step %d); stopped first: %s; stopping %s (exit status %d: run it again)",
			v.Idle.Round(time.Second), v.Step, progress.Join(v.Stopped), cfg.Command[0], ExitMemberLost)
		stopped, why = ExitMemberLost, ranksHung
	case <-ctx.Done():
		stopped = 128 + int(syscall.SIGTERM)
	}
	pgid := -cmd.Process.Pid
	// A rank frozen by SIGSTOP takes SIGTERM only once continued (mpirun's daemons send SIGCONT first too).
	_ = syscall.Kill(pgid, syscall.SIGCONT)
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(cfg.Grace):
		say("%s still runs %s after SIGTERM; SIGKILL", cfg.Command[0], cfg.Grace)
		_ = syscall.Kill(pgid, syscall.SIGKILL)
		<-exited
	}
	_ = syscall.Kill(pgid, syscall.SIGKILL) // whatever of the group outlived its leader
	return stopped, why, nil
}

// hangTimeoutText is the hang timeout as the logs say it.
func hangTimeoutText(d time.Duration) string {
	if d > 0 {
		return d.String()
	}
	return fmt.Sprintf("the larger of %s and %d median step times", progress.MinTimeout, progress.StepFactor)
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

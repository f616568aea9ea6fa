package podcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/membership/etcdmembers"
)

// LaunchConfig configures launch mode: what an MPI launcher runs by default (the job chart wraps
// mpi.launcher.command in it), so that a plain `mpirun` starts only once its workers can take it and runs again
// when one is lost.
type LaunchConfig struct {
	QueryConfig
	// Members is how many members a run needs (the job's minimum): the first waits for them, and a run again after
	// a member left waits for its replacement when fewer remain.
	Members int
	// Settle is how long the membership must stay unchanged before a run (more members than Members may still be
	// coming: torch's last call, for MPI).
	Settle time.Duration
	// Hostfile is the file the launcher's sidecar writes (ET_HOSTFILE): a run starts once it lists every member.
	Hostfile string
	// SSHPort: a run starts once every member accepts connections there (0: no check).
	SSHPort int
	// Restarts is how many times the command runs again after a member left during a run.
	Restarts int
	// RerunOnJoin stops a run when a member joins and runs the command again on every member (a scale-up: a plain
	// mpirun never uses a host it did not start with). Not counted against Restarts.
	RerunOnJoin bool
	// Once runs the command once, unsupervised: a launcher that follows the membership itself (horovodrun with a
	// host discovery script) must not be stopped when a member leaves.
	Once bool
	// Grace is how long the command has after SIGTERM before SIGKILL (supervise's).
	Grace time.Duration
	// LossWindow is supervise's: a failed run followed within it by a member leaving counts as that member lost.
	LossWindow time.Duration
	Command    []string
	// Poll is how often the hostfile and the members' ports are looked at (0: 250 ms).
	Poll time.Duration
	// Hang is supervise's: a run whose ranks stopped advancing runs again, counted against Restarts.
	Hang HangConfig
}

// Launch waits for cfg.Members members and for the membership to settle, then runs cfg.Command under Supervise once
// the hostfile lists every member registered now and each answers on its SSH port (members register as their sidecar
// starts, before their sshd listens; the hostfile follows a change a moment later). When a member leaves during a
// run, Supervise stops the command with ExitMemberLost and Launch runs it again the same way, on the members there
// are then (at least cfg.Members: a lost pod's replacement, or those that remain), up to cfg.Restarts times; with
// cfg.RerunOnJoin a member joining stops the run too, and it runs again on every member (not a restart). It
// returns the command's exit status. mpi-operator's launcherCreationPolicy WaitForWorkersReady does the first half
// of this, for a fixed set of workers.
func Launch(ctx context.Context, cfg LaunchConfig, stderr io.Writer) (int, error) {
	if len(cfg.Command) == 0 {
		return 0, errors.New("no command: rdzv-sidecar launch [flags] -- mpirun ...")
	}
	if cfg.Members < 1 {
		return 0, fmt.Errorf("--members must be ≥ 1, got %d", cfg.Members)
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 250 * time.Millisecond
	}
	cli, err := cfg.connect()
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	fmt.Fprintf(stderr, "rdzv-sidecar launch: waiting up to %s for %d members\n", cfg.Timeout, cfg.Members)
	if _, err := waitMembers(ctx, cli, cfg.Prefix, cfg.Members, cfg.Timeout); err != nil {
		return 0, err
	}
	for run, restarts := 1, 0; ; run++ {
		ms, err := cfg.ready(ctx, cli)
		if err != nil {
			return 0, err
		}
		fmt.Fprintf(stderr, "rdzv-sidecar launch: %s listed in %s and reachable; running %s\n", membership.Describe(ms), cfg.Hostfile, cfg.Command[0])
		if cfg.Once {
			return runOnce(ctx, cfg.Command, cfg.Grace)
		}
		code, why, err := supervise(ctx, SuperviseConfig{QueryConfig: cfg.QueryConfig, Command: cfg.Command, Grace: cfg.Grace, StopOnJoin: cfg.RerunOnJoin, LossWindow: cfg.LossWindow, Hang: cfg.Hang}, stderr)
		if err != nil || code != ExitMemberLost || ctx.Err() != nil {
			return code, err
		}
		if why == memberCame {
			fmt.Fprintf(stderr, "rdzv-sidecar launch: a member joined during run %d; running %s again on every member\n", run, cfg.Command[0])
			continue
		}
		what := "a member left during"
		if why == ranksHung {
			what = "a hang stopped"
		}
		if restarts >= cfg.Restarts {
			fmt.Fprintf(stderr, "rdzv-sidecar launch: %s run %d; no restarts left (--restarts=%d)\n", what, run, cfg.Restarts)
			return code, nil
		}
		restarts++
		fmt.Fprintf(stderr, "rdzv-sidecar launch: %s run %d; running %s again (restart %d of %d) once at least %d members are there\n",
			what, run, cfg.Command[0], restarts, cfg.Restarts, cfg.Members)
	}
}

// ready waits, up to cfg.Timeout, until at least cfg.Members members have been registered unchanged for
// cfg.Settle, the hostfile lists exactly them and each accepts connections on cfg.SSHPort; it returns them.
func (cfg LaunchConfig) ready(ctx context.Context, cli *clientv3.Client) ([]membership.Member, error) {
	deadline := time.Now().Add(cfg.Timeout)
	var why string
	var last []membership.Member
	var since time.Time
	for {
		lctx, cancel := context.WithTimeout(ctx, cfg.Poll+5*time.Second)
		ms, _, err := etcdmembers.List(lctx, cli, cfg.Prefix)
		cancel()
		switch {
		case err != nil:
			why = fmt.Sprintf("listing the members: %v", err)
		case len(ms) < cfg.Members:
			why = fmt.Sprintf("%s, fewer than %d", membership.Describe(ms), cfg.Members)
		case !slices.Equal(ms, last) || time.Since(since) < cfg.Settle:
			if !slices.Equal(ms, last) {
				last, since = ms, time.Now()
			}
			why = fmt.Sprintf("%s, changed less than %s ago", membership.Describe(ms), cfg.Settle)
		default:
			if why = cfg.notReady(ctx, ms); why == "" {
				return ms, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("launch: not ready after %s: %s", cfg.Timeout, why)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(cfg.Poll):
		}
	}
}

// notReady says what keeps ms from a run ("": nothing).
func (cfg LaunchConfig) notReady(ctx context.Context, ms []membership.Member) string {
	listed, err := hostfileHosts(cfg.Hostfile)
	if err != nil {
		return err.Error()
	}
	var want []string
	for _, m := range ms {
		want = append(want, m.Host)
	}
	slices.Sort(want)
	if !slices.Equal(listed, want) {
		return fmt.Sprintf("%s lists %v, the members are %v", cfg.Hostfile, listed, want)
	}
	if cfg.SSHPort == 0 {
		return ""
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	for _, h := range want {
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(h, strconv.Itoa(cfg.SSHPort)))
		if err != nil {
			return fmt.Sprintf("%s does not answer on port %d yet (%v)", h, cfg.SSHPort, err)
		}
		c.Close()
	}
	return ""
}

// hostfileHosts are the hosts a hostfile lists, sorted: the first word of each line, before a space (Open MPI's
// "host slots=N") or a colon (MPICH's and Intel MPI's "host:N").
func hostfileHosts(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the hostfile: %w", err)
	}
	var hosts []string
	for line := range strings.Lines(string(b)) {
		if h, _, _ := strings.Cut(strings.TrimSpace(line), " "); h != "" && !strings.HasPrefix(h, "#") {
			h, _, _ = strings.Cut(h, ":")
			hosts = append(hosts, h)
		}
	}
	slices.Sort(hosts)
	return hosts, nil
}

// runOnce runs command as it is and returns its exit status; ctx ending stops it (SIGTERM, then SIGKILL after grace).
func runOnce(ctx context.Context, command []string, grace time.Duration) (int, error) {
	cmd := exec.CommandContext(ctx, command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = grace
	return exitStatus(cmd.Run())
}

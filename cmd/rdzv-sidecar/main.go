// Command rdzv-sidecar is the per-job rendezvous sidecar: `serve` runs an
// embedded etcd (v3 API + the v2 keys API torch's etcd backends use), `join`
// registers a pod and keeps its hostfile current, `wait` and `hosts` help an
// MPI launcher. See docs/contract.md for how the webhook calls it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/hostfile"
	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/sidecar"
)

const usage = `rdzv-sidecar: the rendezvous sidecar of an elastic-training job.

Usage:
  rdzv-sidecar serve [flags]   embedded etcd: v3 API + etcd v2 keys API (torch etcd/etcd-v2 backends)
  rdzv-sidecar join  [flags]   register this pod with a lease, keep hostfile and discover_hosts.sh current
  rdzv-sidecar wait  [flags]   wait until --members=N members are registered
  rdzv-sidecar hosts [flags]   print the registered hosts as a hostfile
Run "rdzv-sidecar <command> --help" for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmds := map[string]func([]string, io.Writer, io.Writer) error{
		"serve": serveCmd, "join": joinCmd, "wait": waitCmd, "hosts": hostsCmd,
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "rdzv-sidecar: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if err := cmd(args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "rdzv-sidecar %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

func newFlagSet(name, summary string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: rdzv-sidecar %s [flags]\n%s\n\nFlags:\n", name, summary)
		fs.PrintDefaults()
	}
	return fs
}

// urlsFlag is a comma-separated list of URLs, as etcd's flags take them.
type urlsFlag []url.URL

func (u *urlsFlag) String() string {
	s := make([]string, len(*u))
	for i, x := range *u {
		s[i] = x.String()
	}
	return strings.Join(s, ",")
}

func (u *urlsFlag) Set(v string) error {
	var out []url.URL
	for _, s := range strings.Split(v, ",") {
		p, err := url.Parse(strings.TrimSpace(s))
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("%q is not an http(s)://host:port URL", s)
		}
		out = append(out, *p)
	}
	*u = out
	return nil
}

func mustURLs(s string) urlsFlag {
	var u urlsFlag
	if err := u.Set(s); err != nil {
		panic(err)
	}
	return u
}

type logFlags struct{ format, level string }

func (l *logFlags) add(fs *flag.FlagSet) {
	fs.StringVar(&l.format, "log-format", "text", "log format: text or json")
	fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn, error")
}

func (l *logFlags) logger(w io.Writer, mode string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(l.level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	switch l.format {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("--log-format: %q is not text or json", l.format)
	}
	return slog.New(h).With("mode", mode), nil
}

type memberFlags struct {
	filesDir, flavour, host, group, prefix string
	register, installHelper                bool
	slots, index                           int
	leaseTTL                               time.Duration
}

func (m *memberFlags) add(fs *flag.FlagSet) {
	fs.StringVar(&m.filesDir, "files-dir", "", "directory to keep "+constants.HostfileName+", "+constants.DiscoverHostsName+", the PyTorch preStop script "+constants.LeaveScriptName+" and, with --install-helper, a copy of this binary in (empty: write no files)")
	// Only a launcher runs the copy (`rdzv-sidecar wait|hosts` in an image that lacks it). It is tens of MiB
	// written before the member registers, so every other pod would pay for it in start time and node disk.
	fs.BoolVar(&m.installHelper, "install-helper", false, "copy this binary into --files-dir as "+constants.SidecarBinaryName+", for a launcher that runs `"+constants.SidecarBinaryName+" wait|hosts`")
	fs.StringVar(&m.flavour, "hostfile-flavour", constants.FlavourOpenMPI, "hostfile syntax: openmpi (host slots=N), mpich or intelmpi (host:N)")
	fs.BoolVar(&m.register, "register", true, "register this pod as a member (false for an MPI launcher and other non-members)")
	fs.StringVar(&m.host, "member-host", os.Getenv(constants.EnvMemberHost), "this pod's stable DNS name (default $"+constants.EnvMemberHost+")")
	fs.IntVar(&m.slots, "member-slots", 1, "slots (processes/accelerators) of this member")
	fs.StringVar(&m.group, "member-group", "worker", "worker group of this member")
	fs.IntVar(&m.index, "member-index", 0, "index of this member within its group")
	fs.StringVar(&m.prefix, "members-prefix", constants.MembersPrefix, "etcd v3 key prefix of the membership")
	fs.DurationVar(&m.leaseTTL, "lease-ttl", 5*time.Second, "lease TTL of the registration: a member killed without deregistering is dropped after this long (whole seconds)")
}

func (m *memberFlags) config(requireHost bool) (sidecar.MemberConfig, error) {
	cfg := sidecar.MemberConfig{
		Prefix:   m.prefix,
		Register: m.register,
		Member:   hostfile.Member{Host: m.host, Slots: m.slots, Group: m.group, Index: m.index},
		LeaseTTL: m.leaseTTL,
		FilesDir: m.filesDir,
		Flavour:  hostfile.Flavour(m.flavour),
	}
	if cfg.Register && cfg.Member.Host == "" {
		if requireHost {
			return cfg, errors.New("--member-host (or $" + constants.EnvMemberHost + ") is required with --register=true")
		}
		cfg.Register = false // serve without member flags: a plain server
	}
	if cfg.LeaseTTL < 2*time.Second {
		return cfg, fmt.Errorf("--lease-ttl: %s is below etcd's minimum of 2s", cfg.LeaseTTL)
	}
	return cfg, cfg.Validate()
}

func (m *memberFlags) prepareFiles(log *slog.Logger) error {
	if m.filesDir == "" {
		return nil
	}
	if err := os.MkdirAll(m.filesDir, 0o755); err != nil {
		return fmt.Errorf("--files-dir: %w", err)
	}
	if err := sidecar.InstallLeaveScript(m.filesDir, constants.LeaveScriptName); err != nil {
		return err
	}
	helper := ""
	if m.installHelper {
		if err := sidecar.InstallSelf(m.filesDir, constants.SidecarBinaryName); err != nil {
			return err
		}
		helper = m.filesDir + "/" + constants.SidecarBinaryName
	}
	log.Info("installed preStop script", "prestop", m.filesDir+"/"+constants.LeaveScriptName, "launcher_helper", helper)
	return nil
}

type clientFlags struct {
	endpoints                 string
	dialTimeout               time.Duration
	caFile, certFile, keyFile string
}

func (c *clientFlags) add(fs *flag.FlagSet) {
	fs.StringVar(&c.endpoints, "endpoints", os.Getenv(constants.EnvRdzvEndpoint), "comma-separated client URLs of the rendezvous server (default $"+constants.EnvRdzvEndpoint+")")
	fs.DurationVar(&c.dialTimeout, "dial-timeout", 5*time.Second, "timeout of one connection attempt")
	fs.StringVar(&c.caFile, "cacert", "", "CA bundle to verify the server's TLS certificate")
	fs.StringVar(&c.certFile, "cert", "", "client TLS certificate")
	fs.StringVar(&c.keyFile, "key", "", "client TLS key")
}

func (c *clientFlags) config() (sidecar.ClientConfig, error) {
	var eps []string
	for _, e := range strings.Split(c.endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			if !strings.Contains(e, "://") {
				e = "http://" + e
			}
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return sidecar.ClientConfig{}, errors.New("--endpoints is required")
	}
	return sidecar.ClientConfig{Endpoints: eps, DialTimeout: c.dialTimeout, CAFile: c.caFile, CertFile: c.certFile, KeyFile: c.keyFile}, nil
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
}

func serveCmd(args []string, _, stderr io.Writer) error {
	fs := newFlagSet("serve", "Run the job's rendezvous: embedded etcd serving the v3 API and the etcd v2 keys API on one client port.", stderr)
	var (
		cfg                           sidecar.ServeConfig
		lf                            logFlags
		mf                            memberFlags
		listenClient, advertise, peer = mustURLs("http://0.0.0.0:2379"), mustURLs("http://localhost:2379"), mustURLs("http://127.0.0.1:2380")
	)
	fs.StringVar(&cfg.Name, "name", "rdzv", "etcd member name")
	fs.StringVar(&cfg.DataDir, "data-dir", constants.DataDir, "etcd data directory")
	fs.Var(&listenClient, "listen-client-urls", "URLs to serve clients on (v3 gRPC, v2 keys API)")
	fs.Var(&advertise, "advertise-client-urls", "client URLs to advertise (python-etcd uses them from /v2/machines as its failover list: give a name pods can reach, never localhost in a cluster)")
	fs.Var(&peer, "listen-peer-urls", "URL for etcd's peer port (single-member cluster; keep it on loopback)")
	fs.StringVar(&cfg.HealthAddr, "health-addr", fmt.Sprintf(":%d", constants.SidecarHealthPort), "address of /healthz, /readyz and /metrics (empty: none)")
	fs.StringVar(&cfg.CertFile, "cert-file", "", "client TLS certificate (enables https on the client port)")
	fs.StringVar(&cfg.KeyFile, "key-file", "", "client TLS key")
	fs.StringVar(&cfg.TrustedCAFile, "trusted-ca-file", "", "CA that client certificates must be signed by")
	fs.BoolVar(&cfg.ClientCertAuth, "client-cert-auth", false, "require client certificates signed by --trusted-ca-file")
	fs.DurationVar(&cfg.MaxDirTTL, "v2-max-dir-ttl", 0, "cap on v2 directory TTLs (0: none); a directory still lives while keys under it are written")
	fs.BoolVar(&cfg.UnsafeNoFsync, "unsafe-no-fsync", false, "skip fsync (tests; the store is rebuilt by the agents anyway)")
	fs.StringVar(&cfg.EtcdLogLevel, "etcd-log-level", "warn", "log level of etcd's own (zap) logs")
	fs.DurationVar(&cfg.ReadyTimeout, "ready-timeout", time.Minute, "give up if etcd is not ready within this")
	lf.add(fs)
	mf.add(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	log, err := lf.logger(stderr, "serve")
	if err != nil {
		return err
	}
	if cfg.Member, err = mf.config(false); err != nil {
		return err
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return errors.New("--cert-file and --key-file go together")
	}
	if cfg.CertFile != "" {
		for i := range listenClient {
			listenClient[i].Scheme = "https"
		}
	}
	cfg.ListenClientURLs, cfg.AdvertiseClientURLs, cfg.ListenPeerURLs = listenClient, advertise, peer
	cfg.Log = log
	if err := mf.prepareFiles(log); err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	return sidecar.Serve(ctx, cfg)
}

func joinCmd(args []string, _, stderr io.Writer) error {
	fs := newFlagSet("join", "Register this pod (lease-bound, deregistered at once on SIGTERM) and keep the hostfile and discover_hosts.sh in --files-dir current.", stderr)
	var (
		cfg sidecar.JoinConfig
		lf  logFlags
		mf  memberFlags
		cf  clientFlags
	)
	fs.StringVar(&cfg.HealthAddr, "health-addr", fmt.Sprintf(":%d", constants.SidecarHealthPort), "address of /healthz, /readyz and /metrics (empty: none)")
	lf.add(fs)
	mf.add(fs)
	cf.add(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	log, err := lf.logger(stderr, "join")
	if err != nil {
		return err
	}
	if cfg.Member, err = mf.config(true); err != nil {
		return err
	}
	if cfg.Client, err = cf.config(); err != nil {
		return err
	}
	cfg.Log = log
	if err := mf.prepareFiles(log); err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	return sidecar.Join(ctx, cfg)
}

func waitCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("wait", "Wait until at least --members members are registered, then print them (one host per line, in --flavour).", stderr)
	var (
		cf      clientFlags
		n       int
		timeout time.Duration
		prefix  string
		flavour string
		quiet   bool
	)
	cf.add(fs)
	fs.IntVar(&n, "members", 1, "how many members to wait for")
	fs.DurationVar(&timeout, "timeout", 5*time.Minute, "give up after this long (exit status 1)")
	fs.StringVar(&prefix, "members-prefix", constants.MembersPrefix, "etcd v3 key prefix of the membership")
	fs.StringVar(&flavour, "flavour", constants.FlavourOpenMPI, "how to print the hosts: openmpi, mpich, intelmpi, horovod")
	fs.BoolVar(&quiet, "quiet", false, "print nothing on success")
	if err := fs.Parse(args); err != nil {
		return err
	}
	f, err := hostfile.ParseFlavour(flavour)
	if err != nil {
		return fmt.Errorf("--flavour: %w", err)
	}
	if n < 1 {
		return fmt.Errorf("--members must be ≥ 1, got %d", n)
	}
	cc, err := cf.config()
	if err != nil {
		return err
	}
	cli, err := sidecar.NewClient(cc)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, stop := signalContext()
	defer stop()
	fmt.Fprintf(stderr, "rdzv-sidecar wait: waiting up to %s for %d members at %s\n", timeout, n, cf.endpoints)
	ms, err := sidecar.WaitMembers(ctx, cli, prefix, n, timeout)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "rdzv-sidecar wait: %s\n", membership.Describe(ms))
	if quiet {
		return nil
	}
	out, err := hostfile.Render(f, ms)
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}

func hostsCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("hosts", "Print the registered members as a hostfile.", stderr)
	var (
		cf      clientFlags
		prefix  string
		flavour string
		timeout time.Duration
	)
	cf.add(fs)
	fs.StringVar(&prefix, "members-prefix", constants.MembersPrefix, "etcd v3 key prefix of the membership")
	fs.StringVar(&flavour, "flavour", constants.FlavourOpenMPI, "openmpi, mpich, intelmpi or horovod")
	fs.DurationVar(&timeout, "timeout", 10*time.Second, "timeout of the request")
	if err := fs.Parse(args); err != nil {
		return err
	}
	f, err := hostfile.ParseFlavour(flavour)
	if err != nil {
		return fmt.Errorf("--flavour: %w", err)
	}
	cc, err := cf.config()
	if err != nil {
		return err
	}
	cli, err := sidecar.NewClient(cc)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ms, _, err := membership.List(ctx, cli, prefix)
	if err != nil && ms == nil {
		return err
	}
	out, err := hostfile.Render(f, ms)
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}

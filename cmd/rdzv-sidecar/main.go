// Command rdzv-sidecar is the per-job rendezvous sidecar: `serve` runs the
// job's rendezvous (an embedded etcd serving the v3 API and the v2 keys API
// torch's etcd backends use, torch's c10d TCPStore, and the view of torch's
// rounds on the health port), `join` registers a pod and keeps its hostfile
// current, `wait` and `hosts` help an MPI launcher, `progress` is a PyTorch
// job's helm test. See docs/contract.md for how the webhook calls it. This
// file only parses flags; internal/sidecar does the work.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/etcdclient"
	"github.com/elastic-training/elastic-training/internal/hostfile"
	"github.com/elastic-training/elastic-training/internal/membudget"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/internal/podcmd"
	"github.com/elastic-training/elastic-training/internal/podreplace"
	"github.com/elastic-training/elastic-training/internal/sidecar"
	"github.com/elastic-training/elastic-training/internal/tcpstore"
	"github.com/elastic-training/elastic-training/internal/torchbackends/v2api"
)

// commands are rdzv-sidecar's commands, in the order the usage text lists them (README.md's list is checked
// against it).
var commands = []command{
	{"serve", "[flags]", "the job's rendezvous: embedded etcd (v3 API + v2 keys API: torch's etcd/etcd-v2 backends), " +
		"torch's c10d TCPStore, the elastic-training backend (--backend), the rounds' view on /rendezvous", serveCmd},
	{"join", "[flags]", "register this pod with a lease, keep hostfile and discover_hosts.sh current", joinCmd},
	{"started", "[flags]", "wait until this sidecar's /startz answers (its postStart hook)", startedCmd},
	{"wait", "[flags]", "wait until --members=N members are registered", waitCmd},
	{"hosts", "[flags]", "print the registered hosts as a hostfile", hostsCmd},
	{"supervise", "[flags] -- mpirun ...", "run an MPI launcher; stop it (exit status 75) when a member it started with leaves, or its ranks hang", superviseCmd},
	{"launch", "[flags] -- mpirun ...", "the MPI launcher's default: wait for the workers, run mpirun, run it again when one is lost (with --rerun-on-join, also when one joins)", launchCmd},
	{"progress", "[flags]", "wait until a torch round of --nodes=N holds (helm test of a PyTorch job)", progressCmd},
}

type command struct {
	name, args, what string
	run              func(args []string, stdout, stderr io.Writer) error
}

// usage is the text of `rdzv-sidecar --help`, from commands.
var usage = func() string {
	var b strings.Builder
	b.WriteString("rdzv-sidecar: the rendezvous sidecar of an elastic-training job.\n\nUsage:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  rdzv-sidecar %s %s\n      %s\n", c.name, c.args, c.what)
	}
	b.WriteString(`Run "rdzv-sidecar <command> --help" for a command's flags.` + "\n")
	return b.String()
}()

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
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == args[0] })
	if i < 0 {
		fmt.Fprintf(stderr, "rdzv-sidecar: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if err := commands[i].run(args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if code, ok := err.(exitCode); ok {
			return int(code)
		}
		fmt.Fprintf(stderr, "rdzv-sidecar %s: %v\n", args[0], err)
		if errors.As(err, new(usageError)) {
			return 2
		}
		return 1
	}
	return 0
}

// exitCode is a command's own exit status, passed on (supervise).
type exitCode int

func (c exitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

// usageError is a command line the flags do not parse (exit status 2).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// parse parses args, a parse error being a usageError (--help stays flag.ErrHelp).
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil && !errors.Is(err, flag.ErrHelp) {
		return usageError{err}
	} else if err != nil {
		return err
	}
	return nil
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

// urlsVar defines a urlsFlag with its default.
func urlsVar(fs *flag.FlagSet, p *[]url.URL, name, value, usage string) {
	if err := (*urlsFlag)(p).Set(value); err != nil {
		panic(err)
	}
	fs.Var((*urlsFlag)(p), name, usage)
}

func flavourVar(fs *flag.FlagSet, p *hostfile.Flavour) {
	fs.StringVar((*string)(p), "hostfile-flavour", constants.FlavourOpenMPI,
		"hostfile syntax: "+strings.Join(constants.HostfileFormats, ", ")+" (openmpi: host slots=N; the others: host:N)")
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
}

// daemonFlags are the flags serve and join share.
type daemonFlags struct {
	opts                *sidecar.Options
	logFormat, logLevel string
}

func addDaemonFlags(fs *flag.FlagSet, o *sidecar.Options) *daemonFlags {
	d := &daemonFlags{opts: o}
	m := &o.Member
	fs.StringVar(&o.HealthAddr, "health-addr", fmt.Sprintf(":%d", constants.SidecarHealthPort), "address of /healthz, /readyz and /metrics (empty: none)")
	fs.StringVar(&d.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&d.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&m.FilesDir, "files-dir", "", "directory to keep "+constants.HostfileName+", "+constants.DiscoverHostsName+", the PyTorch preStop script "+constants.LeaveScriptName+" and, with --install-helper, a copy of this binary in (empty: write no files)")
	// Only a launcher runs the copy (`rdzv-sidecar wait|hosts` in an image that lacks it). It is tens of MiB
	// written before the member registers, so every other pod would pay for it in start time and node disk.
	fs.BoolVar(&m.InstallHelper, "install-helper", false, "copy this binary into --files-dir as "+constants.SidecarBinaryName+", for a launcher that runs `"+constants.SidecarBinaryName+" wait|hosts`")
	flavourVar(fs, &m.Flavour)
	fs.BoolVar(&m.Register, "register", true, "register this pod as a member (false for an MPI launcher and other non-members)")
	fs.StringVar(&m.Member.Host, "member-host", os.Getenv(constants.EnvMemberHost), "this pod's stable DNS name (default $"+constants.EnvMemberHost+")")
	fs.IntVar(&m.Member.Slots, "member-slots", 1, "slots (processes/accelerators) of this member")
	fs.StringVar(&m.Member.Group, "member-group", "worker", "worker group of this member")
	fs.IntVar(&m.Member.Index, "member-index", 0, "index of this member within its group")
	fs.StringVar(&m.Member.Pod, "member-pod", os.Getenv(constants.EnvPodName), "this pod's name (default $"+constants.EnvPodName+"): how the serving sidecar names it to the webhook when hangs are blamed on it")
	fs.StringVar(&m.Member.Node, "member-node", os.Getenv(constants.EnvNodeName), "the node this pod runs on (default $"+constants.EnvNodeName+"): copies of in-memory checkpoints go to other nodes first")
	fs.StringVar(&m.Prefix, "members-prefix", constants.MembersPrefix, "etcd v3 key prefix of the membership")
	cp := &o.Checkpoint
	fs.StringVar(&cp.Dir, "checkpoint-dir", "", "the memory-backed directory this pod's trainer saves in-memory checkpoints into (elastic_training.checkpoint, $"+constants.EnvCheckpointDir+"): announce its saves in the job's store, keep copies of other pods' and serve them (empty: off; needs --register)")
	fs.StringVar(&cp.Addr, "checkpoint-addr", fmt.Sprintf(":%d", constants.CheckpointPort), "address of the checkpoint server: the peers' copies, and on loopback the trainer's loads ($"+constants.EnvCheckpointURL+")")
	fs.StringVar(&cp.Local, "checkpoint-local", "", "a Unix socket where the trainer's loads are served instead of --checkpoint-addr's loopback, which then serves the peers only (host networking: the node's loopback is every host-network pod's; $"+constants.EnvCheckpointURL+" is then unix:<path>)")
	fs.IntVar(&cp.Replicas, "checkpoint-replicas", 1, "copies of each piece of a save on other pods, on other nodes first")
	cp.Memory = 1 << 30
	fs.Func("checkpoint-memory", "bytes --checkpoint-dir may hold, this pod's saves and the copies together (a quantity: 1Gi, 512Mi; default 1Gi)", func(v string) error {
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Sign() <= 0 {
			return fmt.Errorf("%q is not a positive quantity of bytes (1Gi, 512Mi)", v)
		}
		cp.Memory = q.Value()
		return nil
	})
	fs.StringVar(&o.Progress.Addr, "progress-addr", "", "loopback UDP address (or unix:<path> of a datagram socket: host networking) where this pod's ranks say their steps (elastic_training.progress, $"+constants.EnvProgressAddr+"; a line `et1 <rank> <step> [<total> [<pid>]]` from a shell): reported to the serving sidecar, which restarts a hung round, or without --run-id into the job's etcd, where an MPI launcher's supervise stops a hung run (empty: off)")
	fs.StringVar(&o.Progress.RunID, "run-id", "", "the job's rendezvous run id (the agents' --rdzv-id), whose rounds the progress is of (empty: no torchrun rendezvous; the reports go into the job's etcd)")
	fs.DurationVar(&m.LeaseTTL, "lease-ttl", constants.DefaultLeaseTTL*time.Second, "lease TTL of the registration: a member killed without deregistering is dropped after this long (whole seconds)")
	return d
}

// run parses args, gives the options a logger (tagged with the mode) and a
// metrics registry, and runs fn until SIGTERM or SIGINT.
func (d *daemonFlags) run(fs *flag.FlagSet, args []string, stderr io.Writer, fn func(context.Context) error) error {
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	log, err := sidecar.NewLogger(stderr, d.logFormat, d.logLevel)
	if err != nil {
		return err
	}
	d.opts.Log = log.With("mode", fs.Name())
	d.opts.MemoryLimit = setMemoryLimit(d.opts.Log, d.opts.Checkpoint.Share())
	d.opts.Metrics = prometheus.NewRegistry()
	ctx, stop := signalContext()
	defer stop()
	return fn(ctx)
}

// setMemoryLimit gives the Go heap a soft limit of 90 % of the container's
// memory limit (its cgroup's) less what the checkpoint volume may hold
// (membudget.Budget.GoLimit: a memory emptyDir's pages count against the same
// limit), unless GOMEMLIMIT is set, and returns the container's limit (0: none
// known). Go collects when the heap has doubled since the last collection, so
// without it serve's heap passes the container's limit long before its live
// data does: the v2 store keeps the last 1,000 writes, and at 1,024 nodes
// torch's etcd-v2 state is 140 KB a write; 1,000 members' leases and watches
// are as much again (docs/scale.md). With it, the collector works harder
// instead of the kernel killing the job's rendezvous.
func setMemoryLimit(log *slog.Logger, checkpoints int64) int64 {
	limit, err := memlimit.FromCgroup()
	if err != nil || limit == 0 || limit > math.MaxInt64/2 {
		if !errors.Is(err, memlimit.ErrNoLimit) {
			log.Warn("the container's memory limit could not be read; the Go heap has no soft limit", "err", err)
		}
		return 0
	}
	if os.Getenv("GOMEMLIMIT") != "" {
		return int64(limit)
	}
	goLimit := membudget.GoLimit(int64(limit), checkpoints)
	if goLimit <= 0 {
		log.Warn("the container's memory limit does not hold the checkpoints; the Go heap has no soft limit", "limit", limit, "checkpoint_memory", checkpoints)
		return int64(limit)
	}
	debug.SetMemoryLimit(goLimit)
	log.Info("Go heap soft limit set to 90% of the container's memory limit less the checkpoints", "gomemlimit", goLimit, "limit", limit, "checkpoint_memory", checkpoints)
	return int64(limit)
}

func addClientFlags(fs *flag.FlagSet, c *etcdclient.Config) {
	fs.StringVar(&c.Endpoints, "endpoints", os.Getenv(constants.EnvRdzvEndpoint), "comma-separated client URLs of the rendezvous server (default $"+constants.EnvRdzvEndpoint+")")
	fs.DurationVar(&c.DialTimeout, "dial-timeout", 5*time.Second, "timeout of one connection attempt")
	fs.StringVar(&c.CAFile, "cacert", "", "CA bundle to verify the server's TLS certificate")
	fs.StringVar(&c.CertFile, "cert", "", "client TLS certificate")
	fs.StringVar(&c.KeyFile, "key", "", "client TLS key")
}

// addQueryFlags defines the flags wait and hosts share.
func addQueryFlags(fs *flag.FlagSet, q *podcmd.QueryConfig, timeout time.Duration, timeoutUsage string) {
	addClientFlags(fs, &q.Client)
	fs.StringVar(&q.Prefix, "members-prefix", constants.MembersPrefix, "etcd v3 key prefix of the membership")
	flavourVar(fs, &q.Flavour)
	fs.DurationVar(&q.Timeout, "timeout", timeout, timeoutUsage)
}

func serveCmd(args []string, _, stderr io.Writer) error {
	fs := newFlagSet("serve", "Run the job's rendezvous: embedded etcd serving the v3 API and the etcd v2 keys API on one client port, and torch's c10d TCPStore on another.", stderr)
	var cfg sidecar.ServeConfig
	fs.StringVar(&cfg.Etcd.Name, "name", "rdzv", "etcd member name")
	fs.StringVar(&cfg.Etcd.DataDir, "data-dir", constants.DataDir, "etcd data directory")
	urlsVar(fs, &cfg.Etcd.ListenClientURLs, "listen-client-urls", "http://0.0.0.0:2379", "URLs to serve clients on (v3 gRPC, v2 keys API)")
	urlsVar(fs, &cfg.Etcd.AdvertiseClientURLs, "advertise-client-urls", "http://localhost:2379", "client URLs to advertise (python-etcd uses them from /v2/machines as its failover list: give a name pods can reach, never localhost in a cluster)")
	urlsVar(fs, &cfg.Etcd.ListenPeerURLs, "listen-peer-urls", "http://127.0.0.1:2380", "URL for etcd's peer port (single-member cluster; keep it on loopback)")
	fs.StringVar(&cfg.Etcd.CertFile, "cert-file", "", "client TLS certificate (enables https on the client port)")
	fs.StringVar(&cfg.Etcd.KeyFile, "key-file", "", "client TLS key")
	fs.StringVar(&cfg.Etcd.TrustedCAFile, "trusted-ca-file", "", "CA that client certificates must be signed by")
	fs.BoolVar(&cfg.Etcd.ClientCertAuth, "client-cert-auth", false, "require client certificates signed by --trusted-ca-file")
	fs.DurationVar(&cfg.MaxDirTTL, "v2-max-dir-ttl", 0, "cap on v2 directory TTLs (0: none); a directory still lives while keys under it are written")
	fs.IntVar(&cfg.V2Limits.MaxValueLen, "v2-max-value-bytes", v2api.DefaultMaxValueLen, "largest v2 value; a larger one is refused (etcd error 209)")
	fs.IntVar(&cfg.V2Limits.MaxKeyLen, "v2-max-key-bytes", v2api.DefaultMaxKeyLen, "longest v2 key; a longer one is refused (etcd error 209)")
	fs.Int64Var(&cfg.V2Limits.MaxBytes, "v2-max-bytes", 0, "most bytes the v2 store holds: keys, values, and values replaced or deleted that etcd's 1,000-event history still holds; the last eighth is kept for torch's keys; a write past it is refused (etcd error 300; 0: its share of the memory limit)")
	fs.Int64Var(&cfg.V2Limits.MaxReplyBytes, "v2-max-reply-bytes", 0, "most bytes of v2 replies built and not yet written to their clients, all clients together; a reply past it is refused (etcd error 300; 0: its share of the memory limit)")
	fs.BoolVar(&cfg.Etcd.UnsafeNoFsync, "unsafe-no-fsync", false, "skip fsync (tests; the store is rebuilt by the agents anyway)")
	fs.StringVar(&cfg.Etcd.LogLevel, "etcd-log-level", "warn", "log level of etcd's own (zap) logs")
	fs.DurationVar(&cfg.Etcd.ReadyTimeout, "ready-timeout", time.Minute, "give up if etcd is not ready within this")
	fs.BoolVar(&cfg.Hang.Enabled, "hang", true, "restart a round of the elastic-training backend whose ranks reported progress and then none advanced for --hang-timeout (a Warning Event TrainingHung names the rank that stopped first)")
	fs.DurationVar(&cfg.Hang.Timeout, "hang-timeout", 0, "time without any rank's progress that is a hang (0: the larger of 60s and ten median steps)")
	fs.IntVar(&cfg.Hang.Replace.After, "hang-replace-after", 2, "hangs blamed on one pod (its ranks frozen or absent) before the webhook at --replace-url is asked to replace it (0: never)")
	fs.StringVar(&cfg.Hang.Replace.URL, "replace-url", "", "the webhook's URL for replacing a pod of the job (https://.../replace-pod; empty: hangs restart the round and nothing more), asked with this pod's token for the webhook in "+constants.TokenDir+"/"+podreplace.TokenPath)
	replaceCA := fs.String("replace-ca", os.Getenv(constants.EnvWebhookCA), "the CA (PEM) of the webhook's serving certificate (default $"+constants.EnvWebhookCA+")")
	fs.StringVar(&cfg.EventsJob, "events-job", "", "record each torch rendezvous round as an Event on this Job of the pod's namespace (needs the pod's token in "+constants.TokenDir+" and RBAC: create events, get the Job)")
	fs.Func("backend", "the job's torchrun rendezvous backend ("+strings.Join(constants.Backends, ", ")+"): only its handlers see the stores' writes (the elastic-training backend's rounds; torch's c10d state for the view and the survivors' restarter; torch's etcd state for the view); empty: every backend's", func(v string) error {
		if v != "" && !slices.Contains(constants.Backends, v) {
			return fmt.Errorf("%q is not one of %s", v, strings.Join(constants.Backends, ", "))
		}
		cfg.Backend = v
		return nil
	})
	fs.BoolVar(&cfg.RestartSurvivors, "restart-survivors", true, "when a participant's pod leaves the membership (its lease ended: its node is lost), drop it from torch's c10d round and put a placeholder on the wait list, so that the survivors restart at once (torch itself leaves them in the collective until its timeout)")
	fs.Func("force-delete-lost-pods-of", "comma-separated StatefulSets of the job's members: when such a member leaves the membership and Kubernetes then evicts its pod from a lost node, force-delete the pod so that the StatefulSet replaces it (needs the pod's token in "+constants.TokenDir+" and RBAC: get and delete those pods)", func(v string) error {
		names, err := naming.StatefulSets(v)
		cfg.ForceDeleteLostOf = names
		return err
	})
	// The stores' quotas: by default each its share of the container's memory limit (internal/membudget).
	fs.Int64Var(&cfg.C10dQuotas.Bytes, "c10d-max-bytes", 0, "most bytes the c10d store holds: keys, values and queued elements, each with "+strconv.Itoa(tcpstore.ItemCost)+" more for its cost; a write past it closes the writer's connection (0: its share of the memory limit)")
	fs.Int64Var(&cfg.C10dQuotas.WaitBytes, "c10d-max-waiting-bytes", 0, "most bytes the keys that the c10d store's clients wait for cost together (WAIT, BARRIER: each key's length and "+strconv.Itoa(tcpstore.WaitKeyCost)+", once per client); a wait past it closes the waiter's connection (0: its share of the memory limit)")
	fs.Int64Var(&cfg.C10dQuotas.ReplyBytes, "c10d-max-reply-bytes", 0, "most bytes of c10d replies not yet written to their clients, all clients together; a request whose reply would pass it closes the client's connection (0: its share of the memory limit)")
	fs.IntVar(&cfg.C10dQuotas.Connections, "c10d-max-connections", 0, "most open c10d client connections, "+strconv.Itoa(tcpstore.ConnCost>>10)+" KiB each; more are closed as they come (0: its share of the memory limit)")
	fs.StringVar(&cfg.C10dAddr, "c10d-addr", fmt.Sprintf(":%d", constants.C10dPort), `address of the torch c10d TCPStore (torchrun --rdzv-backend=c10d with is_host=false); "" turns it off`)
	fs.StringVar(&cfg.Lease.Name, "lease", "", "serve only while this pod holds the Kubernetes Lease of this name in its namespace, and meanwhile point the EndpointSlice of this name (the rendezvous Service's) at --pod-ip; until then follow the pod that serves, at --advertise-client-urls, as `join` does (needs the pod's token in "+constants.TokenDir+" and RBAC: get and patch that Lease and EndpointSlice); empty: serve at once")
	fs.BoolVar(&cfg.Lease.Standby, "standby", false, "with --lease: a standby, which tries for the Lease only once it has been up for the Lease's duration (the first candidate serves first)")
	fs.BoolVar(&cfg.Lease.VerifyStore, "c10d-verify", false, "with --lease: while another pod serves, carry this pod's trainer's store connections only to a store that names itself a pod of this job (as join --c10d-verify)")
	fs.StringVar(&cfg.Lease.C10dUpstream, "c10d-upstream", "", "with --lease: the c10d store as the job's pods reach it (the rendezvous Service's host:port), where this pod's trainer's connections go while another pod serves; empty: --advertise-client-urls' host at --c10d-addr's port")
	fs.StringVar(&cfg.Lease.Identity, "pod-name", os.Getenv(constants.EnvPodName), "this pod's name, the Lease's holder (default $"+constants.EnvPodName+")")
	fs.StringVar(&cfg.Lease.Address, "pod-ip", os.Getenv(constants.EnvPodIP), "this pod's IP, the rendezvous Service's endpoint while it holds the Lease (default $"+constants.EnvPodIP+")")
	d := addDaemonFlags(fs, &cfg.Options)
	return d.run(fs, args, stderr, func(ctx context.Context) error {
		cfg.Hang.Replace.CA = []byte(*replaceCA)
		cfg.Hang.Replace.TokenFile = filepath.Join(constants.TokenDir, podreplace.TokenPath)
		return sidecar.Serve(ctx, cfg)
	})
}

func joinCmd(args []string, _, stderr io.Writer) error {
	fs := newFlagSet("join", "Register this pod (lease-bound, deregistered at once on SIGTERM) and keep the hostfile and discover_hosts.sh in --files-dir current.", stderr)
	var cfg sidecar.JoinConfig
	addClientFlags(fs, &cfg.Client)
	fs.StringVar(&cfg.C10d.Addr, "c10d-addr", "", `where the trainer reaches the job's c10d store (e.g. 127.0.0.1:29400): this sidecar carries those connections to --c10d-upstream while this pod is registered, and closes them when its registration ends, so that a store lost with its node fails torch's agent at once instead of leaving it blocked on a silent connection; "" = off`)
	fs.StringVar(&cfg.C10d.Upstream, "c10d-upstream", "", "the job's c10d store (host:port of the rendezvous Service), for --c10d-addr")
	fs.BoolVar(&cfg.C10d.Verify, "c10d-verify", false, "carry the trainer's store connections only to a store that names itself a pod of this pod's job (a name under --member-host's parent domain), dialled there, never where the rendezvous Service leads; refused connections are closed, logged and counted (elastic_training_sidecar_c10d_proxy_refused_total)")
	fs.DurationVar(&cfg.C10d.Wait, "c10d-wait", time.Minute, "how long a new store connection waits for this pod to be registered and the store to answer (torch's own store timeout is 60 s)")
	fs.IntVar(&cfg.C10d.MaxConns, "c10d-max-connections", 64, "most store connections carried at once; more are closed as they come")
	d := addDaemonFlags(fs, &cfg.Options)
	return d.run(fs, args, stderr, func(ctx context.Context) error { return sidecar.Join(ctx, cfg) })
}

func waitCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("wait", "Wait until at least --members members are registered, then print them (one host per line, in --hostfile-flavour).", stderr)
	var cfg podcmd.WaitConfig
	addQueryFlags(fs, &cfg.QueryConfig, 5*time.Minute, "give up after this long (exit status 1)")
	fs.IntVar(&cfg.Members, "members", 1, "how many members to wait for")
	fs.BoolVar(&cfg.Quiet, "quiet", false, "print nothing on success")
	if err := parse(fs, args); err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	return podcmd.Wait(ctx, cfg, stdout, stderr)
}

func superviseCmd(args []string, _, stderr io.Writer) error {
	fs := newFlagSet("supervise", "Run the command after -- (mpirun, mpiexec) and pass on its exit status; if a member registered when it started leaves first (its node lost, or scaled away), or within --loss-window after the command failed, or its ranks said their progress and none advanced for --hang-timeout, stop the command's process group and exit with status "+fmt.Sprint(podcmd.ExitMemberLost)+", so that a launcher script runs it again on the hosts that remain.", stderr)
	var cfg podcmd.SuperviseConfig
	addQueryFlags(fs, &cfg.QueryConfig, 30*time.Second, "timeout of the first listing of the members")
	addStopFlags(fs, &cfg.Grace, &cfg.LossWindow)
	addHangFlags(fs, &cfg.Hang)
	if err := parse(fs, args); err != nil {
		return err
	}
	if cfg.Command = fs.Args(); len(cfg.Command) == 0 {
		return usageError{errors.New("no command: rdzv-sidecar supervise [flags] -- mpirun ...")}
	}
	ctx, stop := signalContext()
	defer stop()
	return exitWith(podcmd.Supervise(ctx, cfg, stderr))
}

// addStopFlags are supervise's and launch's: how the command is stopped, and
// how a failed run is judged.
func addStopFlags(fs *flag.FlagSet, grace, lossWindow *time.Duration) {
	fs.DurationVar(grace, "grace", 5*time.Second, "time the command has after SIGTERM before SIGKILL")
	fs.DurationVar(lossWindow, "loss-window", 10*time.Second, "when the command fails, how long to wait for a member it started with to leave, which makes the status "+fmt.Sprint(podcmd.ExitMemberLost)+" after all (a scale-down stops a worker's sshd before its sidecar deregisters); 0: none")
}

// addHangFlags are supervise's and launch's: when the ranks' progress (reported by the workers' sidecars into the
// job's etcd) is a hang.
func addHangFlags(fs *flag.FlagSet, cfg *podcmd.HangConfig) {
	fs.BoolFunc("hang", "stop the command (exit status "+fmt.Sprint(podcmd.ExitMemberLost)+": run it again) when its ranks said their progress (elastic_training.progress, or a line to $"+constants.EnvProgressAddr+") and none advanced for --hang-timeout; the log names the rank that stopped first (default true)",
		func(v string) error {
			on, err := strconv.ParseBool(v)
			cfg.Off = !on
			return err
		})
	fs.DurationVar(&cfg.Timeout, "hang-timeout", 0, "time without any rank's progress that is a hang (0: the larger of 60s and ten median steps)")
}

// exitWith passes a command's exit status on as this process's.
func exitWith(code int, err error) error {
	if err != nil {
		return err
	}
	if code != 0 {
		return exitCode(code)
	}
	return nil
}

func launchCmd(args []string, _, stderr io.Writer) error {
	fs := newFlagSet("launch", "Wait for at least --members members, registered unchanged for --settle, then run the command after -- (mpirun, mpiexec) under supervise once the hostfile lists every member and each answers on --ssh-port; when a member leaves during a run, or its ranks hang (--hang-timeout), run it again the same way, on the members there are then (up to --restarts times), and with --rerun-on-join when one joins. The MPI launcher's default (the job chart's mpi.launcher.waitForWorkers).", stderr)
	var cfg podcmd.LaunchConfig
	addQueryFlags(fs, &cfg.QueryConfig, 10*time.Minute, "how long to wait for the members, and then for the hostfile and their SSH ports before each run (exit status 1)")
	fs.IntVar(&cfg.Members, "members", 1, "how many members a run needs (the job's minimum): each run waits for them")
	fs.DurationVar(&cfg.Settle, "settle", 3*time.Second, "how long the membership must stay unchanged before a run (more members may be coming)")
	fs.StringVar(&cfg.Hostfile, "hostfile", os.Getenv(constants.EnvHostfile), "the hostfile this pod's sidecar writes (default $"+constants.EnvHostfile+")")
	fs.IntVar(&cfg.SSHPort, "ssh-port", 22, "port every member must answer on before a run (0: no check)")
	fs.IntVar(&cfg.Restarts, "restarts", 10, "how many times the command runs again after a member left during a run, or a run hung")
	fs.BoolVar(&cfg.RerunOnJoin, "rerun-on-join", false, "stop a run when a member joins and run the command again on every member (a scale-up; not counted against --restarts)")
	fs.BoolVar(&cfg.Once, "once", false, "run the command once, unsupervised (a launcher that follows the membership itself: horovodrun --host-discovery-script)")
	addStopFlags(fs, &cfg.Grace, &cfg.LossWindow)
	addHangFlags(fs, &cfg.Hang)
	if err := parse(fs, args); err != nil {
		return err
	}
	if cfg.Command = fs.Args(); len(cfg.Command) == 0 {
		return usageError{errors.New("no command: rdzv-sidecar launch [flags] -- mpirun ...")}
	}
	if cfg.Hostfile == "" {
		return usageError{errors.New("--hostfile (or $" + constants.EnvHostfile + ", which the webhook sets) is required")}
	}
	ctx, stop := signalContext()
	defer stop()
	return exitWith(podcmd.Launch(ctx, cfg, stderr))
}

func progressCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("progress", "Wait until the serving sidecar's /rendezvous shows a complete torch round of at least --nodes agents, every one alive, that has held for --stable (exit status 1 with the reason otherwise).", stderr)
	cfg := podcmd.ProgressConfig{Interval: 2 * time.Second}
	fs.StringVar(&cfg.URL, "url", "", "the serving sidecar's http://<job>-rdzv:2381/rendezvous")
	fs.IntVar(&cfg.Nodes, "nodes", 1, "the fewest agents (torchrun nodes) the round must have")
	fs.DurationVar(&cfg.Stable, "stable", 30*time.Second, "how long the round must have held")
	fs.DurationVar(&cfg.MaxHeartbeatAge, "max-heartbeat-age", 30*time.Second, "an agent silent for longer is gone")
	fs.DurationVar(&cfg.Timeout, "timeout", 4*time.Minute, "give up after this long (exit status 1)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if cfg.URL == "" {
		return errors.New("--url is required")
	}
	ctx, stop := signalContext()
	defer stop()
	return podcmd.Progress(ctx, cfg, stdout)
}

func startedCmd(args []string, _, stderr io.Writer) error {
	fs := newFlagSet("started", "Wait until --url answers 200 (exit status 1 after --timeout). The webhook makes it the sidecar's postStart hook: the kubelet starts the trainer in its next sync of the pod, where a startup probe waits for the probe's next tick.", stderr)
	var cfg podcmd.StartedConfig
	fs.StringVar(&cfg.URL, "url", "", "the sidecar's http://127.0.0.1:<health port>/startz")
	fs.DurationVar(&cfg.Timeout, "timeout", time.Minute, "give up after this long (exit status 1: the kubelet restarts the sidecar)")
	fs.DurationVar(&cfg.Interval, "interval", 20*time.Millisecond, "time between tries")
	if err := parse(fs, args); err != nil {
		return err
	}
	if cfg.URL == "" {
		return errors.New("--url is required")
	}
	ctx, stop := signalContext()
	defer stop()
	return podcmd.Started(ctx, cfg)
}

func hostsCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("hosts", "Print the registered members as a hostfile.", stderr)
	var cfg podcmd.QueryConfig
	addQueryFlags(fs, &cfg, 10*time.Second, "timeout of the request")
	if err := parse(fs, args); err != nil {
		return err
	}
	return podcmd.Hosts(context.Background(), cfg, stdout)
}

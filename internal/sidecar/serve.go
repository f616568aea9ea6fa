// Package sidecar is the rendezvous sidecar's two modes and their wiring:
// serve (the job's rendezvous: embedded etcd with the v3 API and the v2 keys
// API on one client port, torch's c10d TCPStore on another, the handlers of
// the job's backend on their writes, the view of the rounds on the health
// port, the Lease) and join (register this pod, keep the files current,
// carry the trainer's store connections), with their health endpoints and
// metrics. The commands a pod runs from the installed binary are
// internal/podcmd's.
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/elastic-training/elastic-training/internal/atomicfile"
	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/embedetcd"
	"github.com/elastic-training/elastic-training/internal/etcdclient"
	"github.com/elastic-training/elastic-training/internal/incluster"
	"github.com/elastic-training/elastic-training/internal/lostpods"
	"github.com/elastic-training/elastic-training/internal/rdzv/c10drounds"
	"github.com/elastic-training/elastic-training/internal/servinglease"
	"github.com/elastic-training/elastic-training/internal/tcpstore"
	"github.com/elastic-training/elastic-training/internal/torchbackends/survivors"
	"github.com/elastic-training/elastic-training/internal/torchbackends/torchrounds"
	"github.com/elastic-training/elastic-training/internal/torchbackends/v2api"
	"github.com/elastic-training/elastic-training/internal/torchview"
	"github.com/elastic-training/elastic-training/internal/torchview/jobevents"
)

// v2SnapshotFile holds the v2 keys between a graceful shutdown and the next
// start (the v2 store lives in memory).
const v2SnapshotFile = "v2-keys.json"

// ServeConfig configures serve mode.
type ServeConfig struct {
	Options
	// Etcd is the embedded etcd (its Log is Options.Log).
	Etcd embedetcd.Config
	// MaxDirTTL caps v2 directory TTLs (see v2api's dirttl.go).
	MaxDirTTL time.Duration
	// V2Limits bound the v2 keys API's keys, values and store (zero fields: v2api's defaults).
	V2Limits v2api.Limits
	// C10dAddr is where torch's c10d TCPStore is served ("" = not at all).
	C10dAddr string
	// C10dQuotas bound the c10d store (zero fields: tcpstore's defaults).
	C10dQuotas tcpstore.Quotas
	// Backend is the job's torchrun rendezvous backend (constants.Backend*): only its handlers see the stores'
	// writes. "" wires every backend's, for a pod whose command line does not say (before the webhook passed it).
	Backend string
	// RestartSurvivors: with torch's c10d backend, the c10d store's writes go to a survivors.Restarter.
	RestartSurvivors bool
	// EventsJob names the Job on which each torch rendezvous round is recorded
	// as an Event ("" = none), with the in-cluster token in constants.TokenDir.
	EventsJob string
	// ForceDeleteLostOf names the job's member StatefulSets whose pods, once
	// Kubernetes evicts them from a lost node, are force-deleted so that they
	// are replaced (internal/lostpods), with the in-cluster token.
	ForceDeleteLostOf []string
	// Lease makes this pod one of the job's candidates (internal/servinglease);
	// zero: it serves at once, alone.
	Lease LeaseConfig
	// Hang: what the elastic-training backend's rounds do when the ranks' progress stops (hang.go).
	Hang HangConfig
}

// LeaseConfig makes the serving sidecar a candidate: it serves only while it
// holds the Kubernetes Lease Name (with the in-cluster token), and points the
// EndpointSlice Name, the rendezvous Service's, at Address meanwhile. Until
// then it follows the pod that serves, as a joining sidecar does.
type LeaseConfig struct {
	Name              string // "" = no lease: serve at once
	Identity, Address string // this pod's name and IP
	// Standby: let the first candidate (worker 0) serve first. A standby tries
	// for the Lease only once it has been up for the Lease's duration.
	Standby bool
	// C10dUpstream is the c10d store as the job's pods reach it (the
	// rendezvous Service's host:port), where the trainer's connections go
	// while another pod serves; "": the advertised client URL's host, at the
	// port of C10dAddr.
	C10dUpstream string
	// VerifyStore: while another pod serves, carry the trainer's connections
	// only to a store that names itself a pod of this job (C10dProxyConfig.Verify).
	VerifyStore bool
}

// uses says whether the job may use backend, and so whether that backend's handlers are wired.
func (c ServeConfig) uses(backend string) bool { return c.Backend == "" || c.Backend == backend }

// legacyV2 says whether torch's etcd backends may write the v2 keys: only their writes are torch's pickled state.
func (c ServeConfig) legacyV2() bool {
	return c.uses(constants.BackendEtcdV2) || c.uses(constants.BackendEtcd)
}

func (c ServeConfig) checkTLS() error {
	if (c.Etcd.CertFile == "") != (c.Etcd.KeyFile == "") {
		return errors.New("--cert-file and --key-file go together")
	}
	return nil
}

// Serve runs the job's rendezvous until ctx ends (SIGTERM) or etcd fails.
// With Member.Register or Member.FilesDir this process is a member too. With
// a Lease it first follows the pod that serves until it holds the Lease, and
// returns servinglease.ErrSteppedDown (wrapped) when it must stop serving: the
// container restarts, and follows whoever serves then.
func Serve(ctx context.Context, cfg ServeConfig) error {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Lease.Name == "" {
		return serve(ctx, cfg, nil, time.Time{})
	}
	cand, err := candidate(cfg)
	if err != nil {
		return err
	}
	jc, err := followConfig(cfg)
	if err != nil {
		return err
	}
	h, err := cand.Follow(ctx, joinFollower(jc), cfg.Lease.Standby)
	if err != nil || ctx.Err() != nil {
		return err
	}
	if h.Released {
		// The pod that served gave the rendezvous up a moment ago: the pods still registered with it (its keep-alives
		// stopped) must let go of it, and close their trainers' connections, before they can reach this one;
		// otherwise a registration that ends late would cut an agent out of this store's first round.
		h.NotBefore = h.At.Add(cfg.Member.LeaseTTL)
		cfg.Log.Info("the previous holder gave the rendezvous up: the Service points here once every registration with it has ended",
			"previous_holder", h.From, "at", h.NotBefore.Format(time.RFC3339Nano))
	}
	return serve(ctx, cfg, cand, h.NotBefore)
}

// serve runs the rendezvous; cand, if not nil, holds the Lease and points the
// Service here (not before publish) while it does.
func serve(ctx context.Context, cfg ServeConfig, cand *servinglease.Candidate, publish time.Time) error {
	mets, err := cfg.begin(false, cfg.checkTLS)
	if err != nil {
		return err
	}
	if err := cfg.applyBudget(); err != nil {
		return err
	}
	log := cfg.Log
	events, stopEvents := roundEvents(cfg.EventsJob, log)
	defer stopEvents()
	st := &memberState{}
	view := torchview.New(torchview.Config{Log: log, Metrics: cfg.Metrics, Events: events, Slots: st.slots})
	// torch's own backends' rounds, read from their stores' writes; the elastic-training backend tells the view itself.
	torch := torchrounds.New(view)
	cfg.Etcd.Log = log
	etcd := embedetcd.New(cfg.Etcd)
	var onV2Write func(key, value string)
	if cfg.legacyV2() {
		onV2Write = torch.V2Write
	}
	v2 := v2api.New(v2api.Config{ClusterID: etcd.ClusterID, ClientURLs: etcd.ClientURLs, Raft: etcd.Raft,
		MaxDirTTL: cfg.MaxDirTTL, Metrics: mets.v2, OnWrite: onV2Write, Logger: log, Limits: cfg.V2Limits})
	if err := restoreV2(v2, cfg.Etcd.DataDir, log); err != nil {
		return err
	}

	defer etcd.Close()
	if err := etcd.Start(ctx, v2.Handlers()); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// Who hears of the membership's changes (a member that left: its node may be lost), in membershipFanOut's order.
	var members membershipFanOut
	if cand != nil {
		members = append(members, cand)
	}
	if reaper := lostPods(rctx, cfg.ForceDeleteLostOf, log); reaper != nil {
		defer func() { cancel(); reaper.Wait() }()
		members = append(members, reaper)
	}
	wg.Go(func() { v2.RunExpiry(rctx, 100*time.Millisecond) })
	if cfg.C10dAddr != "" {
		listeners, err := startC10d(rctx, &wg, cfg, view, events, torch, cand, etcd, st)
		if err != nil {
			return err
		}
		members = append(members, listeners...)
	}
	cfg.Member.Listener = members
	if cfg.Checkpoint.Dir != "" {
		cli := etcd.Client()
		defer cli.Close()
		if err := startCheckpoints(rctx, &wg, cfg.Checkpoint, cli, cfg.Member.Member.Host, st, log); err != nil {
			return err
		}
	}
	if w, ok := events.(warner); ok {
		cli := etcd.Client()
		wg.Go(func() { defer cli.Close(); watchIncidents(rctx, cli, w, log.With("component", "checkpoints")) })
	}
	if cfg.Progress.Addr != "" && (cfg.C10dAddr != "" || cfg.Progress.RunID == "") {
		var cli *clientv3.Client
		if cfg.Progress.RunID == "" {
			cli = etcd.Client()
			defer cli.Close()
		}
		if err := startProgress(rctx, &wg, cfg.Progress, loopbackOf(cfg.C10dAddr), cli, cfg.Member.Member.Host, log); err != nil {
			return err
		}
	}
	if cfg.Member.active() {
		cli := etcd.Client()
		wg.Go(func() { defer cli.Close(); runMember(rctx, cli, cfg.Member, log, st, mets) })
	}
	ready := func() (bool, string) {
		if !etcd.Ready() {
			return false, "etcd not ready"
		}
		if cfg.Member.active() {
			return st.ready(cfg.Member.Register)
		}
		return true, "ok"
	}
	// Only now that the store listens: /startz starts the trainer (health.go).
	stopHealth, err := startHealth(cfg.HealthAddr, ready, cfg.Metrics, map[string]http.Handler{"/rendezvous": view}, log)
	if err != nil {
		return err
	}
	defer stopHealth()

	// Everything serves: point the Service here, and keep the Lease.
	stepDown := make(chan error, 1)
	if cand != nil {
		wg.Go(func() {
			if err := cand.Lead(rctx, publish); err != nil {
				stepDown <- err
			}
		})
	}

	stopErr, err := waitServing(ctx, etcd, stepDown, log)
	if err != nil {
		return err
	}
	cancel()
	wg.Wait()
	v2.Close()
	saveV2(v2, cfg.Etcd.DataDir, log)
	etcd.Close()
	if cand != nil && stopErr == nil {
		// Only now that nothing serves: a standby may take over at once.
		cand.Release()
	}
	log.Info("rendezvous server stopped")
	return stopErr
}

// startC10d serves torch's c10d store at cfg.C10dAddr, after etcd is ready so
// that a c10d client never meets a sidecar that answers but is not ready.
// Every write goes to the job's backend's handlers: the elastic-training backend's
// rounds, or for torch's c10d backend the view of its pickled state and,
// with RestartSurvivors, the survivors' restarter. Those that write to the
// store join the fan-out once the store exists (before it serves: no write
// comes earlier), and are returned to hear of the membership's changes while
// this pod serves.
func startC10d(ctx context.Context, wg *sync.WaitGroup, cfg ServeConfig, view *torchview.Tracker, events torchview.Recorder, torch *torchrounds.Follower, cand *servinglease.Candidate, etcd *embedetcd.Server, st *memberState) ([]MembershipListener, error) {
	log := cfg.Log
	var writes storeWriteFanOut
	if cfg.uses(constants.BackendC10d) {
		writes = append(writes, torch)
	}
	c10d := tcpstore.Config{Log: log.With("component", "c10d"), Metrics: cfg.Metrics, Quotas: cfg.C10dQuotas,
		OnSet: writes.C10dWrite, OnCompareSet: writes.C10dWrite}
	srv, err := tcpstore.New(c10d)
	if err != nil {
		return nil, err
	}
	var listeners []MembershipListener
	if cfg.uses(constants.BackendElasticTraining) {
		// The job's status on its Job (kubectl get job; internal/jobstatus), where the rounds are recorded as Events.
		status := &jobStatus{now: time.Now}
		hang := cfg.Hang.rounds(events, cfg.Metrics)
		hang.OnHang = chainHang(hang.OnHang, status.onHang)
		w, _ := events.(warner)
		rep, err := newReplacer(ctx, cfg.Hang.Replace, st.listed, w, log.With("component", "replace"))
		if err != nil {
			return nil, err
		}
		if rep != nil {
			hang.OnHang = chainHang(hang.OnHang, rep.onHang)
		}
		rounds := c10drounds.New(c10drounds.Config{Store: srv, Members: st.listed, Member: st.member, Log: log.With("component", "rendezvous"),
			OnState: func(run string, s c10drounds.State) {
				view.ElasticTrainingState(run, s.Round.Number, s.Round.Participants, s.Waiting, s.Ended, s.Closed)
				status.onState(run, s)
			},
			Hang: hang})
		wg.Go(func() { <-ctx.Done(); rounds.Stop() })
		gauges := newJobGauges(cfg.Metrics)
		wg.Go(func() {
			tick(ctx, time.Second, func() {
				rounds.Tick()
				if st, ok := status.status(rounds.Progress); ok {
					gauges.set(st)
				}
			})
		})
		if cfg.EventsJob != "" {
			if patch := patchJob(cfg.EventsJob, log); patch != nil {
				wg.Go(func() { status.writeStatus(ctx, rounds.Progress, patch, log.With("component", "status")) })
			}
		}
		writes = append(writes, rounds)
		listeners = append(listeners, whileServing{cand: cand, next: rounds})
	}
	if cfg.RestartSurvivors && cfg.uses(constants.BackendC10d) {
		host, _ := os.Hostname() // the pod's name: what the wait list shows of the placeholder
		r := survivors.New(survivors.Config{Store: srv, Name: host, Log: log.With("component", "survivors"), Metrics: cfg.Metrics})
		writes = append(writes, r)
		listeners = append(listeners, whileServing{cand: cand, next: r})
	}
	if err := serveC10d(ctx, wg, cfg.C10dAddr, srv, c10d); err != nil {
		return nil, err
	}
	if host := cfg.Member.Member.Host; host != "" {
		cli := etcd.Client()
		err := announceServer(ctx, cli, host, cfg.C10dAddr)
		cli.Close()
		if err != nil {
			return nil, err
		}
	}
	return listeners, nil
}

// waitServing waits until ctx ends (nil, nil), etcd fails (its error as
// err) or the Lease's holder must step down (the reason as stopErr).
func waitServing(ctx context.Context, etcd *embedetcd.Server, stepDown <-chan error, log *slog.Logger) (stopErr, err error) {
	select {
	case <-ctx.Done():
		log.Info("shutting down: deregistering, ending v2 waits, stopping etcd")
		return nil, nil
	case err := <-etcd.Err():
		return nil, fmt.Errorf("etcd: %w", err)
	case stopErr := <-stepDown:
		log.Error("stepping down: this pod stops serving the rendezvous, and restarts to follow the pod that serves", "err", stopErr)
		return stopErr, nil
	}
}

// candidate is this pod's rendezvous candidate, with the in-cluster clients.
func candidate(cfg ServeConfig) (*servinglease.Candidate, error) {
	l := cfg.Lease
	leases, err := incluster.CoordinationV1()
	if err != nil {
		return nil, fmt.Errorf("--lease %s needs the pod's API token: %w", l.Name, err)
	}
	slices, err := incluster.DiscoveryV1()
	if err != nil {
		return nil, fmt.Errorf("--lease %s needs the pod's API token: %w", l.Name, err)
	}
	return servinglease.New(servinglease.Config{API: servinglease.NewAPI(leases, slices, l.Name), Identity: l.Identity, Address: l.Address,
		Duration: servinglease.DefaultDuration, Retry: servinglease.DefaultRetry, Confirm: servinglease.DefaultConfirm,
		Log: cfg.Log.With("component", "lease", "lease", l.Name)})
}

// joinFollower is the join a candidate runs while another pod serves
// (servinglease.Candidate.Follow).
type joinFollower JoinConfig

func (f joinFollower) Follow(ctx context.Context, registered func(bool), abandon <-chan struct{}) error {
	jc := JoinConfig(f)
	jc.Member.OnRegistered = func() { registered(true) }
	jc.Member.OnLost = func() { registered(false) }
	jc.Member.Abandon = abandon
	return Join(ctx, jc)
}

// followConfig is the join a candidate runs while another pod serves: it
// reaches the rendezvous as every pod does, at the advertised client URL (the
// Service), with the server's TLS files as its client's, and, when it serves
// c10d, carries its trainer's store connections from loopback at that port.
func followConfig(cfg ServeConfig) (JoinConfig, error) {
	jc := JoinConfig{Options: cfg.Options}
	jc.Metrics = prometheus.NewRegistry() // serve registers its own later
	var eps []string
	for _, u := range cfg.Etcd.AdvertiseClientURLs {
		eps = append(eps, u.String())
	}
	jc.Client = etcdclient.Config{Endpoints: strings.Join(eps, ","), CAFile: cfg.Etcd.TrustedCAFile, CertFile: cfg.Etcd.CertFile, KeyFile: cfg.Etcd.KeyFile}
	if cfg.C10dAddr != "" && len(cfg.Etcd.AdvertiseClientURLs) > 0 {
		_, port, err := net.SplitHostPort(cfg.C10dAddr)
		if err != nil {
			return JoinConfig{}, fmt.Errorf("--c10d-addr: %w", err)
		}
		up := cfg.Lease.C10dUpstream
		if up == "" {
			up = net.JoinHostPort(cfg.Etcd.AdvertiseClientURLs[0].Hostname(), port)
		}
		jc.C10d = C10dProxyConfig{Addr: net.JoinHostPort("127.0.0.1", port), Upstream: up, Verify: cfg.Lease.VerifyStore && cfg.Member.Register, Wait: time.Minute, MaxConns: 64}
	}
	return jc, nil
}

// lostPods is the reaper of the StatefulSets' pods lost with their node; nil
// when there are none to watch or no token (logged: the pods wait for someone
// to delete them, as Kubernetes leaves them).
func lostPods(ctx context.Context, statefulSets []string, log *slog.Logger) *lostpods.Reaper {
	if len(statefulSets) == 0 {
		return nil
	}
	log = log.With("component", "lost-pods")
	kc, err := incluster.CoreV1()
	if err != nil {
		log.Warn("cannot force-delete pods lost with their node: no API access", "statefulsets", strings.Join(statefulSets, ","), "err", err)
		return nil
	}
	return lostpods.New(ctx, lostpods.Config{API: lostpods.NewAPI(kc), StatefulSets: statefulSets, Log: log})
}

// roundEvents records torch's rounds as Events on the Job job (--events-job),
// with the pod's own token; it returns nil and a no-op when job is empty or
// no in-cluster client can be made, after a warning: serving goes on without
// Events (a missing permission shows later, as jobevents logs): the
// rendezvous matters more than its Events.
func roundEvents(job string, log *slog.Logger) (torchview.Recorder, func()) {
	if job == "" {
		return nil, func() {}
	}
	kc, err := incluster.CoreV1()
	if err != nil {
		log.Warn("recording no rendezvous Events", "err", fmt.Errorf("events on Job %s: %w", job, err))
		return nil, func() {}
	}
	ev := jobevents.New(jobevents.NewAPI(kc), job, log.With("component", "events"))
	return ev, ev.Stop
}

// restoreV2 takes back the v2 keys a graceful shutdown left in the data dir
// (once: the file is removed, so a crash never resurrects old state) and
// makes the directory torch 2.4/2.5's etcd-v2 backend fails without ("Key
// not found : /torch/elastic/store"; fixed upstream later).
func restoreV2(v2 *v2api.Server, dataDir string, log *slog.Logger) error {
	snapPath := filepath.Join(dataDir, v2SnapshotFile)
	if data, err := os.ReadFile(snapPath); err == nil {
		if err := v2.Restore(data); err != nil {
			log.Warn("ignoring the v2 snapshot of the last shutdown", "err", err)
		} else {
			log.Info("restored v2 keys saved at the last graceful shutdown", "index", v2.Store().Index())
		}
		os.Remove(snapPath)
	}
	if err := v2.EnsureDir("/torch/elastic/store"); err != nil {
		return fmt.Errorf("prepare v2 store: %w", err)
	}
	return nil
}

// saveV2 leaves the v2 keys in the data dir for the next start.
func saveV2(v2 *v2api.Server, dataDir string, log *slog.Logger) {
	if data, err := v2.Snapshot(); err != nil {
		log.Warn("could not save the v2 keys", "err", err)
	} else if _, err := atomicfile.Write(dataDir, v2SnapshotFile, data, 0o600); err != nil {
		log.Warn("could not save the v2 keys", "err", err)
	}
}

// serveC10d serves torch's c10d TCPStore on addr until ctx ends. Its keys
// live in memory only: after a restart the agents find an empty store and
// form a new round, as torch's own store hosted by an agent would make them.
func serveC10d(ctx context.Context, wg *sync.WaitGroup, addr string, srv *tcpstore.Server, cfg tcpstore.Config) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("c10d store: %w", err)
	}
	q := cfg.Quotas
	cfg.Log.Info("c10d store listening", "addr", ln.Addr().String(), "max_bytes", q.Bytes, "max_connections", q.Connections)
	wg.Go(func() {
		if err := srv.Serve(ctx, ln); err != nil {
			cfg.Log.Error("c10d store stopped", "err", err)
		}
	})
	return nil
}

// Package embedetcd is the job's embedded etcd: one member whose client port
// also serves the handlers it is given (the v2 keys API that torch's etcd
// backends use), with etcd's own logs in the sidecar's slog stream.
package embedetcd

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elastic-training/elastic-training/internal/membudget"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
)

// maxStreams is the streams one client connection may hold open: a sidecar's are its lease's keep-alive and one
// watch stream that carries every watch; etcd's default is 2^32.
const maxStreams = 64

// Config configures the member.
type Config struct {
	Name string
	// DataDir holds etcd's data in its subdirectory etcd.
	DataDir             string
	ListenClientURLs    []url.URL
	AdvertiseClientURLs []url.URL
	ListenPeerURLs      []url.URL
	// Client TLS (all empty = plain HTTP; a certificate makes the client
	// URLs https).
	CertFile, KeyFile, TrustedCAFile string
	ClientCertAuth                   bool
	UnsafeNoFsync                    bool
	LogLevel                         string // etcd's own (zap) logs; "" = warn
	ReadyTimeout                     time.Duration
	Log                              *slog.Logger
	// Limits bound what its clients can make it hold (membudget.Budget.EtcdLimits; zero: etcd's own, as in tests
	// that start a bare member).
	Limits membudget.EtcdLimits
}

// Server is the member, from before it starts (its handlers may need its
// cluster id and raft index) until Close.
type Server struct {
	cfg     Config
	etcd    atomic.Pointer[embed.Etcd]
	closing atomic.Bool
	close   func()
}

// New returns a member that Start starts.
func New(cfg Config) *Server {
	if cfg.LogLevel == "" {
		cfg.LogLevel = "warn"
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = time.Minute
	}
	return &Server{cfg: cfg, close: func() {}}
}

// embedConfig is etcd's configuration of the member.
func (s *Server) embedConfig(handlers map[string]http.Handler) (*embed.Config, error) {
	cfg := s.cfg
	ec := embed.NewConfig()
	ec.Name = cfg.Name
	// A directory of its own, which etcd makes 0700: the data dir is the pod's emptyDir, whose mount point the
	// sidecar's user cannot chmod, and etcd warns at every start about a data dir that others may read.
	ec.Dir = filepath.Join(cfg.DataDir, "etcd")
	ec.ListenClientUrls = slices.Clone(cfg.ListenClientURLs)
	if cfg.CertFile != "" {
		for i := range ec.ListenClientUrls {
			ec.ListenClientUrls[i].Scheme = "https"
		}
	}
	ec.AdvertiseClientUrls = cfg.AdvertiseClientURLs
	ec.ListenPeerUrls = cfg.ListenPeerURLs
	ec.AdvertisePeerUrls = cfg.ListenPeerURLs
	ec.InitialCluster = ec.InitialClusterFromName(cfg.Name)
	// One member and no peers: no election to lose to a slow network, so the first one need not wait. etcd
	// fast-forwards a lone member's election ticks, but its randomised timeout still leaves 1 to 10 ticks of
	// 100 ms before the store serves (0.8 s measured in a pod), and every pod of the job waits for it at install
	// and at a standby's takeover. 20 ms ticks and the shortest election timeout etcd accepts (5 ticks) leave 20
	// to 100 ms; leases keep their TTL (etcd's least is 1 s with these, ours 2 s or more).
	ec.TickMs, ec.ElectionMs = tickMs, 5*tickMs
	// etcd serves expvar (the command line, memory stats) on the client port,
	// which every pod of the job reaches: not there. A user handler on the
	// same path takes precedence over etcd's own.
	ec.UserHandlers = maps.Clone(handlers)
	if ec.UserHandlers == nil {
		ec.UserHandlers = map[string]http.Handler{}
	}
	ec.UserHandlers["/debug/"] = http.NotFoundHandler()
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	zl, err := etcdLogger(cfg.LogLevel, cfg.Log.With("component", "etcd").Handler(), &s.closing)
	if err != nil {
		return nil, fmt.Errorf("--etcd-log-level: %w", err)
	}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zl)
	ec.ClientTLSInfo.CertFile = cfg.CertFile
	ec.ClientTLSInfo.KeyFile = cfg.KeyFile
	ec.ClientTLSInfo.TrustedCAFile = cfg.TrustedCAFile
	ec.ClientTLSInfo.ClientCertAuth = cfg.ClientCertAuth
	// A rendezvous store holds little: keep the backend and the history small.
	ec.AutoCompactionMode = embed.CompactorModeRevision
	ec.AutoCompactionRetention = "1000"
	ec.SnapshotCount = 10000
	if l := cfg.Limits; l.SnapshotCount > 0 {
		// Every pod of the job reaches the client port: a request is bounded in bytes, and so the raft log that the
		// heap keeps between snapshots, in entries of at most that. The database keeps etcd's quota
		// (membudget's EtcdLimits says why).
		ec.MaxRequestBytes = uint(l.MaxRequestBytes)
		ec.SnapshotCount, ec.SnapshotCatchUpEntries = l.SnapshotCount, l.SnapshotCatchUp
		ec.MaxConcurrentStreams = maxStreams
	}
	return ec, nil
}

// Start starts etcd with handlers on its client port and waits until it is
// ready. It returns ctx's error when ctx ends first.
func (s *Server) Start(ctx context.Context, handlers map[string]http.Handler) error {
	ec, err := s.embedConfig(handlers)
	if err != nil {
		return err
	}
	start := time.Now()
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	s.etcd.Store(e)
	s.close = sync.OnceFunc(func() { // embed's Close is not idempotent
		// The server first, at once: it answers no keep-alive after this, so every other pod's registration ends
		// within its TTL (its c10d proxy lets go). Then embed's Close, which stops the gRPC servers gracefully and
		// so waits up to the request timeout (5 s and two election timeouts) for every other pod's watch stream:
		// nothing is left to save by then (the server has closed its data), and a pod deleted with a short grace
		// period would be killed waiting, so it is given a second.
		e.Server.HardStop()
		done := make(chan struct{})
		go func() { defer close(done); e.Close() }()
		select {
		case <-done:
		case <-time.After(closeWait):
			s.cfg.Log.Info("etcd's servers still wait for clients' streams; leaving them to the process's exit")
		}
	})
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(s.cfg.ReadyTimeout):
		e.Server.Stop()
		return fmt.Errorf("start etcd: not ready after %s", s.cfg.ReadyTimeout)
	case err := <-e.Err():
		return fmt.Errorf("start etcd: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	s.cfg.Log.Info("rendezvous server ready", "client_urls", fmt.Sprint(s.ClientURLs()), "data_dir", s.cfg.DataDir,
		"cluster_id", s.ClusterID(), "startup", time.Since(start).Round(time.Millisecond).String(),
		"apis", "etcd v3 + etcd v2 keys (/v2/keys)")
	return nil
}

// ClientURLs are the advertised client URLs.
func (s *Server) ClientURLs() []string {
	urls := make([]string, len(s.cfg.AdvertiseClientURLs))
	for i, u := range s.cfg.AdvertiseClientURLs {
		urls[i] = u.String()
	}
	return urls
}

// ClusterID is etcd's cluster id; "" before Start.
func (s *Server) ClusterID() string {
	if e := s.etcd.Load(); e != nil {
		return e.Server.Cluster().ID().String()
	}
	return ""
}

// Raft is etcd's committed index and term; zero before Start.
func (s *Server) Raft() (index, term uint64) {
	if e := s.etcd.Load(); e != nil {
		return e.Server.CommittedIndex(), e.Server.Term()
	}
	return 0, 0
}

// Ready says whether etcd serves.
func (s *Server) Ready() bool {
	e := s.etcd.Load()
	if e == nil {
		return false
	}
	select {
	case <-e.Server.ReadyNotify():
		return true
	default:
		return false
	}
}

// Err reports etcd failing after Start.
func (s *Server) Err() <-chan error { return s.etcd.Load().Err() }

// Client is an in-process v3 client.
func (s *Server) Client() *clientv3.Client { return v3client.New(s.etcd.Load().Server) }

// tickMs is raft's heartbeat tick (embedConfig).
const tickMs = 20

// closeWait bounds Close's wait for etcd's gRPC servers (see Start).
const closeWait = time.Second

// Close stops etcd, quietly: embed reports every listener it closes as an
// error, which would read as a failure in `kubectl logs`.
func (s *Server) Close() {
	s.closing.Store(true)
	s.close()
}

package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/mutate"
	"github.com/elastic-training/elastic-training/internal/podreplace"
)

// Options configure Run.
type Options struct {
	// Host and Port of the HTTPS admission server.
	Host string
	Port int
	// CertDir holds tls.crt and tls.key; they are reloaded when they change.
	CertDir string
	// HealthAddr serves /healthz and /readyz over plain HTTP (ready once the HTTPS server answers).
	HealthAddr string
	// MetricsAddr serves Prometheus /metrics over plain HTTP; empty or "0" disables it.
	MetricsAddr string
	// EnableHTTP2 offers HTTP/2 to the API server. Off by default, as in
	// kubebuilder's scaffolding: HTTP/2 stream resets (CVE-2023-44487,
	// CVE-2023-39325) cost a server more than a client, and the API server
	// speaks HTTP/1.1 to webhooks as well.
	EnableHTTP2 bool
	Config      mutate.Config
	// Events, if not nil, records denials and warnings on the pods' Jobs and StatefulSets.
	Events record.EventRecorder
	// Metrics registers the webhook's metrics and is what /metrics serves.
	Metrics ctrlmetrics.RegistererGatherer
	Log     logr.Logger
	// Ready, if not nil, is closed once every listener is up (for tests and benchmarks).
	Ready chan<- struct{}
	// BodyTimeout bounds reading one admission request's body; 0: DefaultBodyTimeout.
	BodyTimeout time.Duration
	// Replace, if not nil, serves podreplace.Path beside the admission route, on the same TLS port behind the same
	// Service (a podreplace.Server). Config.PodReplacement.URL is what serving sidecars are told to call: with it,
	// each admission gives them CertDir's ca.crt as it is then; without it, or without the file, they never ask.
	Replace http.Handler
}

// DefaultBodyTimeout is how long the webhook waits for an admission request's body: the API server sends it at
// once, and its own call times out after the webhook's timeoutSeconds (5 s by default, at most 30 s). A client that
// sends its headers and then trickles or withholds the body is cut off then, instead of holding a connection and
// a goroutine for as long as it likes (controller-runtime's server bounds only the headers).
const DefaultBodyTimeout = 30 * time.Second

// withBodyDeadline sets the connection's read deadline for the request's body before h reads it.
func withBodyDeadline(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(d)) // HTTP/2 streams have none to set
		h.ServeHTTP(w, r)
	})
}

// Run serves the admission webhook, health and metrics until ctx is done.
func Run(ctx context.Context, o Options) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	srv := crwebhook.NewServer(crwebhook.Options{
		Host:    o.Host,
		Port:    o.Port,
		CertDir: o.CertDir,
		TLSOpts: []func(*tls.Config){func(c *tls.Config) {
			c.MinVersion = tls.VersionTLS12
			if !o.EnableHTTP2 {
				c.NextProtos = []string{"http/1.1"}
			}
		}},
	})
	if o.Metrics == nil {
		o.Metrics = prometheus.NewRegistry()
	}
	mutator, err := NewPodMutator(o.Config, o.Metrics, o.Events)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	if o.BodyTimeout <= 0 {
		o.BodyTimeout = DefaultBodyTimeout
	}
	if o.Config.PodReplacement.URL != "" {
		// Read per admission, not once: a rotation (ours, cert-manager's) rewrites it, and a pod given an old CA
		// would distrust the webhook for its whole life.
		mutator.ca = &caFile{path: filepath.Join(o.CertDir, constants.TLSCAName), log: o.Log.WithName("ca")}
	}
	srv.Register(PathMutatePods, withBodyDeadline(&admission.Webhook{Handler: mutator}, o.BodyTimeout))
	if o.Replace != nil {
		srv.Register(podreplace.Path, withBodyDeadline(o.Replace, o.BodyTimeout))
	}

	errs := make(chan error, 3)
	go func() { errs <- srv.Start(ctx) }()

	started := srv.StartedChecker()
	health := http.NewServeMux()
	health.Handle("/healthz", http.StripPrefix("/healthz", &healthz.Handler{Checks: map[string]healthz.Checker{"ping": healthz.Ping}}))
	health.Handle("/readyz", http.StripPrefix("/readyz", &healthz.Handler{Checks: map[string]healthz.Checker{"webhook": started}}))
	healthLn, err := net.Listen("tcp", o.HealthAddr)
	if err != nil {
		return fmt.Errorf("listen health %s: %w", o.HealthAddr, err)
	}
	servers := []*http.Server{{Handler: health, ReadHeaderTimeout: 5 * time.Second}}
	listeners := []net.Listener{healthLn}
	if o.MetricsAddr != "" && o.MetricsAddr != "0" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(o.Metrics, promhttp.HandlerOpts{}))
		ln, err := net.Listen("tcp", o.MetricsAddr)
		if err != nil {
			healthLn.Close()
			return fmt.Errorf("listen metrics %s: %w", o.MetricsAddr, err)
		}
		servers = append(servers, &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second})
		listeners = append(listeners, ln)
	}
	for i := range servers {
		go func() {
			if err := servers[i].Serve(listeners[i]); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errs <- err
			}
		}()
	}
	o.Log.Info("serving", "webhook", net.JoinHostPort(o.Host, fmt.Sprint(o.Port)), "health", healthLn.Addr().String(),
		"metrics", o.MetricsAddr, "sidecarImage", o.Config.SidecarImage)

	if o.Ready != nil {
		go func() {
			for ctx.Err() == nil {
				if started(nil) == nil {
					close(o.Ready)
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errs:
		cancel()
	}
	shutdown, done := context.WithTimeout(context.Background(), 5*time.Second)
	defer done()
	for _, s := range servers {
		_ = s.Shutdown(shutdown)
	}
	return runErr
}

package sidecar

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// healthMux serves /healthz (the process runs), /startz (the trainer may
// start), /readyz (ready() says whether this sidecar does its job yet),
// Prometheus /metrics (ours from reg and etcd's, which etcd's packages
// register in prometheus' default registry) and the extra routes.
//
// /startz answers as soon as the server does: startHealth comes only after
// the sidecar installed its files and listens where the trainer's agent
// connects (serve: its store; join: the proxy that holds the trainer's store
// connections until this pod is registered). A trainer whose agent waits for
// the store itself (the elastic-training backend) starts on it, and so imports
// torch while the store starts and this pod registers (docs/contract.md).
func healthMux(ready func() (bool, string), reg prometheus.Gatherer, extra map[string]http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	for path, h := range extra {
		mux.Handle(path, h)
	}
	answerOK := func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) }
	mux.HandleFunc("/healthz", answerOK)
	mux.HandleFunc("/startz", answerOK)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, why := ready()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		w.Write([]byte(why + "\n"))
	})
	mux.Handle("/metrics", promhttp.HandlerFor(prometheus.Gatherers{reg, prometheus.DefaultGatherer}, promhttp.HandlerOpts{}))
	return mux
}

// handlerTimeout bounds every answer of the health port.
const handlerTimeout = 10 * time.Second

// readOnly serves h to GET and HEAD only, each within handlerTimeout: the
// port is open to the kubelet, Prometheus and the API server's proxy, and
// nothing on it changes anything.
func readOnly(h http.Handler) http.Handler {
	h = http.TimeoutHandler(h, handlerTimeout, "timed out\n")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "only GET and HEAD", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// startHealth serves healthMux on addr ("" = none) in the background; it
// listens at once, so a port conflict is an error, not a log line. stop
// closes the server.
func startHealth(addr string, ready func() (bool, string), reg prometheus.Gatherer, extra map[string]http.Handler, log *slog.Logger) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health server: %w", err)
	}
	hs := &http.Server{Handler: readOnly(healthMux(ready, reg, extra)), ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: handlerTimeout + 5*time.Second, IdleTimeout: time.Minute,
		MaxHeaderBytes: 16 << 10}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("health server failed", "err", err)
		}
	}()
	return func() { hs.Close() }, nil
}

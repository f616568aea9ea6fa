package sidecar

import (
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// healthMux serves /healthz (the process runs), /readyz (ready() says
// whether this sidecar does its job yet) and Prometheus /metrics.
func healthMux(ready func() (bool, string)) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, why := ready()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		w.Write([]byte(why + "\n"))
	})
	mux.Handle("/metrics", promhttp.Handler())
	return mux
}

func listen(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

package v2api

import "github.com/prometheus/client_golang/prometheus"

// Metrics counts v2 API use. A nil *Metrics counts nothing.
type Metrics struct {
	Requests    *prometheus.CounterVec
	ActiveWaits prometheus.Gauge
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "rdzv_sidecar", Subsystem: "v2", Name: "requests_total",
			Help: "etcd v2 keys API requests by operation and outcome (ok or error_<etcd error code>).",
		}, []string{"op", "outcome"}),
		ActiveWaits: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "rdzv_sidecar", Subsystem: "v2", Name: "active_waits",
			Help: "Open long-poll wait=true requests.",
		}),
	}
	reg.MustRegister(m.Requests, m.ActiveWaits)
	return m
}

func (m *Metrics) request(op, outcome string) {
	if m != nil {
		m.Requests.WithLabelValues(op, outcome).Inc()
	}
}

func (m *Metrics) waitStarted() {
	if m != nil {
		m.ActiveWaits.Inc()
	}
}

func (m *Metrics) waitEnded() {
	if m != nil {
		m.ActiveWaits.Dec()
	}
}

package v2api

import "github.com/prometheus/client_golang/prometheus"

// Metrics counts v2 API use. A nil *Metrics counts nothing.
type Metrics struct {
	Requests    *prometheus.CounterVec
	ActiveWaits prometheus.Gauge
	Refused     *prometheus.CounterVec
	StoreBytes  prometheus.Gauge
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "elastic_training_sidecar", Subsystem: "v2", Name: "requests_total",
			Help: "etcd v2 keys API requests by operation and outcome (ok or error_<etcd error code>).",
		}, []string{"op", "outcome"}),
		ActiveWaits: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "elastic_training_sidecar", Subsystem: "v2", Name: "active_waits",
			Help: "Open long-poll wait=true requests.",
		}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "elastic_training_sidecar", Subsystem: "v2", Name: "refused_total",
			Help: "v2 requests refused by a bound of the sidecar: too_large (a key or value), store_full (--v2-max-bytes), replies_full (--v2-max-reply-bytes).",
		}, []string{"reason"}),
		StoreBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "elastic_training_sidecar", Subsystem: "v2", Name: "store_bytes",
			Help: "What the v2 store holds against --v2-max-bytes: its keys, values and nodes, and the values replaced or deleted that its event history still holds.",
		}),
	}
	reg.MustRegister(m.Requests, m.ActiveWaits, m.Refused, m.StoreBytes)
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

func (m *Metrics) refused(reason string) {
	if m != nil {
		m.Refused.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) storeBytes(n int64) {
	if m != nil {
		m.StoreBytes.Set(float64(n))
	}
}

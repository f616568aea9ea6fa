package tcpstore

import "github.com/prometheus/client_golang/prometheus"

// metrics are registered in the Registerer of Config.Metrics, all named
// elastic_training_sidecar_tcpstore_*.
type metrics struct {
	connections prometheus.Gauge
	ops         [numOps]prometheus.Counter
	refused     *prometheus.CounterVec
	waiters     prometheus.Gauge
	waitingKeys prometheus.Gauge
	keys        prometheus.Gauge
	storeBytes  prometheus.Gauge
	bytesIn     prometheus.Counter
	bytesOut    prometheus.Counter
}

// Reasons for refusing a client (the refused counter's label).
const (
	refusedNoValidate = "no_validate"
	refusedBadMagic   = "bad_magic"
	refusedUnknownOp  = "unknown_op"
	refusedTooLarge   = "too_large"
	refusedNotNumber  = "not_a_number"
	refusedStoreFull  = "store_full"
	refusedConnLimit  = "too_many_connections"
	refusedSlowReader = "slow_reader"
	refusedWaitQuota  = "too_many_waiting_keys"
	refusedReplyQuota = "replies_full"
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "elastic_training_sidecar", Subsystem: "tcpstore", Name: name, Help: help}
	}
	ops := prometheus.NewCounterVec(prometheus.CounterOpts(opts("ops_total", "Requests served, by message type.")), []string{"op"})
	m := &metrics{
		connections: prometheus.NewGauge(prometheus.GaugeOpts(opts("connections", "Open client connections."))),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts(opts("refused_total",
			"Connections closed for a protocol error, a quota or a client that does not read, by reason.")), []string{"reason"}),
		waiters: prometheus.NewGauge(prometheus.GaugeOpts(opts("waiters",
			"Clients waiting in WAIT or BARRIER for keys to appear."))),
		waitingKeys: prometheus.NewGauge(prometheus.GaugeOpts(opts("waiting_keys",
			"Keys the waiting clients wait for, together (their cost's quota is --c10d-max-waiting-bytes)."))),
		keys: prometheus.NewGauge(prometheus.GaugeOpts(opts("keys", "Keys in the store (queues not counted)."))),
		storeBytes: prometheus.NewGauge(prometheus.GaugeOpts(opts("store_bytes",
			"Bytes of the keys and values in the store, queues included, each with its cost (the quota is --c10d-max-bytes)."))),
		bytesIn:  prometheus.NewCounter(prometheus.CounterOpts(opts("received_bytes_total", "Bytes read from clients."))),
		bytesOut: prometheus.NewCounter(prometheus.CounterOpts(opts("sent_bytes_total", "Bytes written to clients."))),
	}
	for i := range m.ops {
		m.ops[i] = ops.WithLabelValues(Op(i).String())
	}
	for _, r := range []string{refusedNoValidate, refusedBadMagic, refusedUnknownOp, refusedTooLarge, refusedNotNumber,
		refusedStoreFull, refusedConnLimit, refusedSlowReader, refusedWaitQuota, refusedReplyQuota} {
		m.refused.WithLabelValues(r)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.connections, ops, m.refused, m.waiters, m.waitingKeys, m.keys, m.storeBytes, m.bytesIn, m.bytesOut} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

package sidecar

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/elastic-training/elastic-training/internal/v2api"
)

// metrics are ours; etcd's own are in the same (default) registry because
// embed registers there.
type metrics struct {
	members           prometheus.Gauge
	membershipChanges prometheus.Counter
	filesWritten      prometheus.Counter
	rounds            *prometheus.CounterVec
	v2                *v2api.Metrics
}

var (
	metricsOnce sync.Once
	theMetrics  *metrics
)

// getMetrics registers our metrics once per process (tests start several
// servers in one process).
func getMetrics() *metrics {
	metricsOnce.Do(func() {
		reg := prometheus.DefaultRegisterer
		m := &metrics{
			members: prometheus.NewGauge(prometheus.GaugeOpts{
				Namespace: "rdzv_sidecar", Name: "members",
				Help: "Members currently registered under the job's prefix.",
			}),
			membershipChanges: prometheus.NewCounter(prometheus.CounterOpts{
				Namespace: "rdzv_sidecar", Name: "membership_changes_total",
				Help: "Membership changes observed.",
			}),
			filesWritten: prometheus.NewCounter(prometheus.CounterOpts{
				Namespace: "rdzv_sidecar", Name: "files_written_total",
				Help: "Times the hostfile/discovery script were rewritten.",
			}),
			rounds: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: "rdzv_sidecar", Name: "rendezvous_rounds_total",
				Help: "torch rendezvous rounds completed, by backend.",
			}, []string{"backend"}),
		}
		reg.MustRegister(m.members, m.membershipChanges, m.filesWritten, m.rounds)
		m.v2 = v2api.NewMetrics(reg)
		theMetrics = m
	})
	return theMetrics
}

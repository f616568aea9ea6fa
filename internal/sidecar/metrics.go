package sidecar

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/elastic-training/elastic-training/internal/torchbackends/v2api"
)

// metrics are ours, registered in the registry the caller passes
// (Options.Metrics), as are the c10d store's and the view's; etcd registers
// its own in prometheus' default registry.
type metrics struct {
	members           prometheus.Gauge
	membershipChanges prometheus.Counter
	filesWritten      prometheus.Counter
	v2                *v2api.Metrics
}

func newMetrics(reg prometheus.Registerer) *metrics {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "elastic_training_sidecar", Name: name, Help: help}
	}
	m := &metrics{
		members:           prometheus.NewGauge(prometheus.GaugeOpts(opts("members", "Members currently registered under the job's prefix."))),
		membershipChanges: prometheus.NewCounter(prometheus.CounterOpts(opts("membership_changes_total", "Membership changes observed."))),
		filesWritten:      prometheus.NewCounter(prometheus.CounterOpts(opts("files_written_total", "Times the hostfile/discovery script were rewritten."))),
	}
	reg.MustRegister(m.members, m.membershipChanges, m.filesWritten)
	m.v2 = v2api.NewMetrics(reg)
	return m
}

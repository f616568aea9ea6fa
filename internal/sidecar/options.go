package sidecar

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

// Options is what serve and join share.
type Options struct {
	HealthAddr string // /healthz, /readyz and /metrics; "" = no health server
	Member     MemberConfig
	Log        *slog.Logger // nil: slog.Default()
	// Metrics is where the sidecar registers its metrics; /metrics serves
	// them with etcd's (prometheus' default registry). nil: a new registry.
	Metrics *prometheus.Registry
	// Checkpoint: this pod's part of the job's in-memory checkpoints (checkpoints.go).
	Checkpoint CheckpointConfig
	// Progress: this pod's ranks' steps, heard and reported to the serving sidecar (progress.go).
	Progress ProgressConfig
	// MemoryLimit is the container's memory limit (its cgroup's); 0: none known. serve divides it among its
	// stores' quotas (internal/membudget).
	MemoryLimit int64
}

// begin does what serve and join do before they start: check the member
// flags, then the mode's own (check), install the files and register the
// metrics.
func (o *Options) begin(requireHost bool, check func() error) (*metrics, error) {
	if err := o.Member.check(requireHost); err != nil {
		return nil, err
	}
	if err := check(); err != nil {
		return nil, err
	}
	if err := o.Checkpoint.check(o.Member); err != nil {
		return nil, err
	}
	if err := o.Progress.check(); err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if err := installFiles(o.Member.FilesDir, o.Member.InstallHelper, o.Log); err != nil {
		return nil, err
	}
	if o.Metrics == nil {
		o.Metrics = prometheus.NewRegistry()
	}
	return newMetrics(o.Metrics), nil
}

// NewLogger is the sidecar's logger: slog text or JSON on w, at level.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: %q is not text or json", format)
}

package embedetcd

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// etcdLogger builds the zap logger embed uses: it hands etcd's entries to
// the sidecar's slog handler h (one log format on the stream), keeps those at
// level and above, and is silent once shutdown has begun (embed reports every
// listener it closes as an error, which would read as a failure in
// `kubectl logs`).
func etcdLogger(level string, h slog.Handler, closing *atomic.Bool) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, err
	}
	return zap.New(&slogCore{level: lvl, h: h, closing: closing}), nil
}

// slogCore is a zapcore.Core that writes to a slog.Handler. It filters by
// its own level (--etcd-log-level), not the handler's (--log-level): Handle
// is called without asking the handler's Enabled.
type slogCore struct {
	level   zapcore.Level
	h       slog.Handler
	closing *atomic.Bool
}

func (c *slogCore) Enabled(l zapcore.Level) bool { return !c.closing.Load() && c.level.Enabled(l) }

func (c *slogCore) With(fs []zapcore.Field) zapcore.Core {
	return &slogCore{level: c.level, h: c.h.WithAttrs(zapAttrs(fs)), closing: c.closing}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	if l, ok := demoted(e, fs); ok && l < e.Level {
		if e.Level = l; !c.level.Enabled(l) {
			return nil
		}
	}
	lvl := slog.LevelError
	switch e.Level {
	case zapcore.DebugLevel:
		lvl = slog.LevelDebug
	case zapcore.InfoLevel:
		lvl = slog.LevelInfo
	case zapcore.WarnLevel:
		lvl = slog.LevelWarn
	}
	r := slog.NewRecord(e.Time, lvl, e.Message, 0)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	if e.Caller.Defined {
		r.AddAttrs(slog.String("caller", e.Caller.TrimmedPath()))
	}
	r.AddAttrs(zapAttrs(fs)...)
	if e.Stack != "" {
		r.AddAttrs(slog.String("stacktrace", e.Stack))
	}
	return c.h.Handle(context.Background(), r)
}

func (c *slogCore) Sync() error { return nil }

// demoted is the level that a warning or error of etcd deserves here when every healthy start of the job's store
// logs it (ok): the first lines a user reads in `kubectl logs -c rdzv-sidecar` must not be alarms that mean nothing.
func demoted(e zapcore.Entry, fs []zapcore.Field) (zapcore.Level, bool) {
	switch e.Message {
	case "failed to update storage version", "Failed to detect schema version":
		// The storage-version monitor runs when the cluster version is first set, before the backend's first commit
		// has written the raft term it reads, and writes the version on its next tick (4 s later); etcd's
		// maintainers call it harmless and silenced it only in their own tests (etcd-io/etcd#18978, #19040).
		// TestHealthyStartLogsNoWarning waits for that write. Any other cause keeps its level.
		for _, f := range fs {
			if err, ok := f.Interface.(error); ok && f.Type == zapcore.ErrorType && strings.Contains(err.Error(), "missing term information") {
				return zapcore.DebugLevel, true
			}
		}
	case "Running http and grpc server on single port. This is not recommended for production.":
		// By design: the client port serves the v2 keys API (torch's etcd backends) beside etcd's gRPC.
		return zapcore.DebugLevel, true
	case "simple token is not cryptographically signed":
		// The store runs without etcd's auth (the pods reach it through their NetworkPolicy, or with client TLS):
		// no token of any kind is ever issued.
		return zapcore.DebugLevel, true
	}
	return 0, false
}

// zapAttrs turns zap fields into slog attributes, in the fields' order; what
// a field adds under other keys (zap.Error's errorVerbose) follows, sorted.
// Nested objects and namespaces become groups.
func zapAttrs(fs []zapcore.Field) []slog.Attr {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fs {
		f.AddTo(enc)
	}
	attrs := make([]slog.Attr, 0, len(enc.Fields))
	seen := make(map[string]bool, len(enc.Fields))
	add := func(k string) {
		if v, ok := enc.Fields[k]; ok && !seen[k] {
			seen[k] = true
			attrs = append(attrs, slog.Attr{Key: k, Value: slogValue(v)})
		}
	}
	for _, f := range fs {
		add(f.Key)
	}
	for _, k := range slices.Sorted(maps.Keys(enc.Fields)) {
		add(k)
	}
	return attrs
}

func slogValue(v any) slog.Value {
	m, ok := v.(map[string]any)
	if !ok {
		return slog.AnyValue(v)
	}
	attrs := make([]slog.Attr, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		attrs = append(attrs, slog.Attr{Key: k, Value: slogValue(m[k])})
	}
	return slog.GroupValue(attrs...)
}

package sidecar

import (
	"os"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// etcdLogger builds the zap logger embed uses: JSON on stderr at level, and
// silent once shutdown has begun (embed reports every listener it closes as
// an error, which would read as a failure in `kubectl logs`).
func etcdLogger(level string, closing *atomic.Bool) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, err
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(os.Stderr), lvl)
	return zap.New(&quietOnClose{Core: core, closing: closing}), nil
}

type quietOnClose struct {
	zapcore.Core
	closing *atomic.Bool
}

func (q *quietOnClose) Enabled(l zapcore.Level) bool { return !q.closing.Load() && q.Core.Enabled(l) }

func (q *quietOnClose) With(f []zapcore.Field) zapcore.Core {
	return &quietOnClose{Core: q.Core.With(f), closing: q.closing}
}

func (q *quietOnClose) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if q.closing.Load() {
		return ce
	}
	return q.Core.Check(e, ce)
}

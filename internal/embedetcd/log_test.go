package embedetcd

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// An entry as etcd logs it (etcdserver's "slow request" warning) comes out
// through the sidecar's slog handler, in its format, with every field.
func TestEtcdLogsThroughSlog(t *testing.T) {
	var buf bytes.Buffer
	var closing atomic.Bool
	// The handler's own level (--log-level error) does not hide what passes
	// etcd's (--etcd-log-level warn).
	h := slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError})
	lg, err := etcdLogger("warn", slog.New(h).With("mode", "serve").Handler(), &closing)
	require.NoError(t, err)
	lg = lg.With(zap.String("local-member-id", "8e9e05c52164694d"))

	lg.Info("saved snapshot", zap.Uint64("snapshot-index", 10001)) // below etcd's level
	lg.Warn("apply request took too long",
		zap.Duration("took", 1500*time.Millisecond),
		zap.Duration("expected-duration", 100*time.Millisecond),
		zap.String("prefix", "read-only range "),
		zap.Strings("peer-urls", []string{"http://127.0.0.1:2380"}),
		zap.Error(errors.New("context deadline exceeded")),
	)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 1, "only the warning: %s", buf.String())
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &got))
	require.NotEmpty(t, got["time"])
	delete(got, "time")
	require.Equal(t, map[string]any{
		"level": "WARN", "msg": "apply request took too long", "mode": "serve",
		"local-member-id": "8e9e05c52164694d",
		"took":            float64(1500 * time.Millisecond), "expected-duration": float64(100 * time.Millisecond),
		"prefix": "read-only range ", "peer-urls": []any{"http://127.0.0.1:2380"},
		"error": "context deadline exceeded",
	}, got)

	// Text format, field order kept, nested objects as groups.
	buf.Reset()
	lg, err = etcdLogger("debug", slog.NewTextHandler(&buf, nil), &closing)
	require.NoError(t, err)
	lg.Named("raft").Debug("starting", zap.String("id", "a"), zap.Namespace("peer"), zap.Int("index", 3))
	require.Regexp(t, `^time=\S+ level=DEBUG msg=starting logger=raft id=a peer.index=3\n$`, buf.String())

	// Silent once shutdown has begun.
	buf.Reset()
	closing.Store(true)
	lg.Error("failed to close listener")
	require.Empty(t, buf.String())
}

// What every healthy start logs is demoted below etcd's default level; the same messages with another cause, and
// other warnings, keep theirs.
func TestDemotedEntries(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		err  error
		want bool // logged at the default level (warn)
	}{
		{"failed to update storage version", errors.New("cannot detect storage schema version: missing term information"), false},
		{"Failed to detect schema version", errors.New("missing term information"), false},
		{"failed to update storage version", errors.New("cannot create migration plan: version \"3.5.0\" is not supported"), true},
		{"Running http and grpc server on single port. This is not recommended for production.", nil, false},
		{"simple token is not cryptographically signed", nil, false},
		{"apply request took too long", nil, true},
	} {
		var buf bytes.Buffer
		var closing atomic.Bool
		lg, err := etcdLogger("warn", slog.NewTextHandler(&buf, nil), &closing)
		require.NoError(t, err)
		if tc.err != nil {
			lg.Error(tc.msg, zap.Error(tc.err))
		} else {
			lg.Warn(tc.msg)
		}
		require.Equal(t, tc.want, buf.Len() > 0, "%s (%v): %q", tc.msg, tc.err, buf.String())
	}
}

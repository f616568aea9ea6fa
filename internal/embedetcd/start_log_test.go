package embedetcd

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/server/v3/storage/schema"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

// A healthy start logs no warning or error: the first thing a user reads in `kubectl logs -c rdzv-sidecar` is the
// store's start. etcd's storage-version monitor, which runs as soon as the cluster version is set, used to log
// "failed to update storage version ... missing term information" at ERROR on most starts, before the first commit
// wrote the term; it writes the version on its next tick. The test waits for that write, so it also proves the
// retry that makes the entry harmless.
func TestHealthyStartLogsNoWarning(t *testing.T) {
	rec := &recordHandler{min: slog.LevelWarn}
	u := func(port int) url.URL { return url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", port)} }
	client, peer := u(testenv.FreePort(t)), u(testenv.FreePort(t))
	s := New(Config{Name: "t", DataDir: t.TempDir(), ListenClientURLs: []url.URL{client}, AdvertiseClientURLs: []url.URL{client},
		ListenPeerURLs: []url.URL{peer}, UnsafeNoFsync: true, Log: slog.New(rec), ReadyTimeout: 30 * time.Second})
	defer s.Close()
	require.NoError(t, s.Start(context.Background(), nil))
	be := s.etcd.Load().Server.Backend()
	require.Eventually(t, func() bool { return schema.ReadStorageVersion(be.ReadTx()) != nil }, 30*time.Second, 50*time.Millisecond,
		"etcd never wrote its storage version")
	require.Empty(t, rec.lines(), "a healthy start logged warnings or errors")
}

// recordHandler keeps the records at min and above, as text.
type recordHandler struct {
	min slog.Level
	mu  sync.Mutex
	got []string
}

func (h *recordHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.min }
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *recordHandler) WithGroup(string) slog.Handler                { return h }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level < h.min {
		return nil
	}
	line := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return a.Key != "stacktrace" })
	h.mu.Lock()
	h.got = append(h.got, line)
	h.mu.Unlock()
	return nil
}

func (h *recordHandler) lines() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.got...)
}

package embedetcd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

// The client port serves etcd's APIs and the handlers given, not etcd's
// expvar page (the process's command line and memory), which every pod of
// the job can reach.
func TestClientPortServesNoDebug(t *testing.T) {
	u := func(port int) url.URL { return url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", port)} }
	client, peer := u(testenv.FreePort(t)), u(testenv.FreePort(t))
	s := New(Config{Name: "t", DataDir: t.TempDir(), ListenClientURLs: []url.URL{client}, AdvertiseClientURLs: []url.URL{client},
		ListenPeerURLs: []url.URL{peer}, UnsafeNoFsync: true, Log: slog.New(slog.DiscardHandler), ReadyTimeout: 30 * time.Second})
	defer s.Close()
	ours := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ours") })
	require.NoError(t, s.Start(context.Background(), map[string]http.Handler{"/v2/keys": ours}))
	require.True(t, s.Ready())
	require.NotEmpty(t, s.ClusterID())

	get := func(path string) (int, string) {
		resp, err := http.Get(client.String() + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, _ := get("/debug/vars")
	require.Equal(t, http.StatusNotFound, code)
	code, body := get("/v2/keys")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ours", body)
	code, _ = get("/health")
	require.Equal(t, http.StatusOK, code)
}

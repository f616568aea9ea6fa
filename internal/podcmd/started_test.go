package podcmd

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestStarted(t *testing.T) {
	// A port where nothing listens yet: the hook runs as the sidecar starts.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedURL := "http://" + l.Addr().String() + "/startz"
	require.NoError(t, l.Close())

	for _, tc := range []struct {
		name    string
		answers []int // the status of each GET, the last one repeated
		url     string
		wantErr string
		calls   int // the GETs made, when the sidecar answers
	}{
		{name: "answers at once", answers: []int{200}, calls: 1},
		{name: "starts after two tries", answers: []int{503, 503, 200}, calls: 3},
		{name: "never starts", answers: []int{503}, wantErr: "the sidecar did not start within 50ms: GET http://"},
		{name: "nothing listens", url: closedURL, wantErr: "the sidecar did not start within 50ms: Get \"" + closedURL + "\": dial tcp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				n := int(calls.Add(1))
				w.WriteHeader(tc.answers[min(n, len(tc.answers))-1])
			}))
			defer srv.Close()
			cfg := StartedConfig{URL: srv.URL + "/startz", Timeout: 50 * time.Millisecond, Interval: time.Millisecond}
			if tc.url != "" {
				cfg.URL = tc.url
			}
			if tc.wantErr == "" {
				cfg.Timeout = time.Minute
			}
			err := Started(context.Background(), cfg)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.calls, int(calls.Load()))
		})
	}
	require.ErrorContains(t, Started(context.Background(), StartedConfig{URL: closedURL, Timeout: time.Second}), "--interval must be > 0")
}

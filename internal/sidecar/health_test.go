package sidecar

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// The health port changes nothing: every method but GET and HEAD is refused.
func TestHealthReadOnly(t *testing.T) {
	h := readOnly(healthMux(func() (bool, string) { return true, "ok" }, prometheus.NewRegistry(), nil))
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(m, "/readyz", strings.NewReader("x")))
		require.Equal(t, http.StatusMethodNotAllowed, rec.Code, m)
		require.Equal(t, "GET, HEAD", rec.Header().Get("Allow"))
	}
	for _, m := range []string{"GET", "HEAD"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(m, "/readyz", nil))
		require.Equal(t, http.StatusOK, rec.Code, m)
	}
}

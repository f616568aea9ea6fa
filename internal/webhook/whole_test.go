package webhook

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestWholeResponse(t *testing.T) {
	big := strings.Repeat("x", 5000) // over net/http's 2 KiB before it chunks
	for _, tc := range []struct {
		name       string
		handler    http.HandlerFunc
		wantStatus int
		wantBody   string
	}{
		{"implicit 200", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(big[:100]))
			_, _ = w.Write([]byte(big[100:]))
		}, http.StatusOK, big},
		{"status kept, the first one wins", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusBadRequest)
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("bad"))
		}, http.StatusBadRequest, "bad"},
		{"nothing written", func(http.ResponseWriter, *http.Request) {}, http.StatusOK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(wholeResponse(tc.handler))
			defer srv.Close()
			resp, err := http.Post(srv.URL, "application/json", strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			assert.Equal(t, tc.wantStatus, resp.StatusCode)
			assert.Equal(t, tc.wantBody, string(body))
			assert.Empty(t, resp.TransferEncoding, "chunked")
			assert.Equal(t, int64(len(tc.wantBody)), resp.ContentLength)
		})
	}
}

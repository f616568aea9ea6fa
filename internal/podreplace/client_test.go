package podreplace

import (
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/testcert"
)

// The client sends the token as the kubelet last wrote it, trusts only the given CA, and brings back the webhook's
// word on a refusal.
func TestClient(t *testing.T) {
	var got []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		req, err := ParseRequest(mustRead(t, r))
		require.NoError(t, err)
		if req.Pod == "refused" {
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(Response{Message: `pod "refused" is not of job j`})
			return
		}
		_ = json.NewEncoder(w).Encode(Response{Pod: req.Pod, Node: "n1", Message: "deleted"})
	}))
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	tok := filepath.Join(t.TempDir(), TokenPath)
	require.NoError(t, os.WriteFile(tok, []byte("first\n"), 0o600))

	c, err := NewClient(srv.URL+Path, ca, tok)
	require.NoError(t, err)
	resp, err := c.Replace(t.Context(), Request{Pod: "j-w-1-abcde", Reason: "2 hangs"})
	require.NoError(t, err)
	require.Equal(t, Response{Pod: "j-w-1-abcde", Node: "n1", Message: "deleted"}, resp)

	require.NoError(t, os.WriteFile(tok, []byte("rotated"), 0o600))
	_, err = c.Replace(t.Context(), Request{Pod: "refused"})
	require.EqualError(t, err, `the webhook refused (403 Forbidden): pod "refused" is not of job j`)
	require.Equal(t, []string{"POST /replace-pod Bearer first", "POST /replace-pod Bearer rotated"}, got)

	// A server whose certificate another CA signed: not trusted, nothing is sent.
	pair, err := testcert.New("127.0.0.1")
	require.NoError(t, err)
	cert, err := tls.X509KeyPair(pair.Cert, pair.Key)
	require.NoError(t, err)
	other := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("a request reached an untrusted server") }))
	other.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	other.StartTLS()
	defer other.Close()
	c, err = NewClient(other.URL+Path, ca, tok)
	require.NoError(t, err)
	_, err = c.Replace(t.Context(), Request{Pod: "x"})
	require.ErrorContains(t, err, "certificate")
}

func mustRead(t *testing.T, r *http.Request) []byte {
	t.Helper()
	b := make([]byte, MaxRequestBytes+1)
	n, _ := r.Body.Read(b)
	return b[:n]
}

// The one check of the URL a serving sidecar asks at: the webhook's start (mutate.Config.Validate) and the
// sidecar's client both use it.
func TestCheckURL(t *testing.T) {
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"https://elastic-training-webhook.elastic-training-system.svc:443/replace-pod", true},
		{"https://10.0.0.5:9443/replace-pod", true},
		{"http://elastic-training-webhook.elastic-training-system.svc/replace-pod", false},
		{"elastic-training-webhook.elastic-training-system.svc:443/replace-pod", false},
		{"https:///replace-pod", false},
		{"https://user:pw@host/replace-pod", false},
		{"https://host/replace-pod?x=1", false},
		{"https://host/replace-pod#x", false},
		{"https://ho st/", false},
	} {
		err := CheckURL(tc.url)
		if tc.ok {
			require.NoError(t, err, tc.url)
		} else {
			require.ErrorContains(t, err, "want https://", tc.url)
		}
	}
}

package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/elastic-training/elastic-training/internal/mutate"
	"github.com/elastic-training/elastic-training/internal/mutate/mutatetest"
	"github.com/elastic-training/elastic-training/internal/testcert"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

type testServer struct {
	url, health string
	client      *http.Client
	certDir     string
}

func start(t *testing.T) *testServer {
	t.Helper()
	return startWith(t, nil)
}

// startWith starts the server with the test's options, changed by opts when it is not nil.
func startWith(t *testing.T, opts func(*Options)) *testServer {
	t.Helper()
	pair, err := testcert.New("127.0.0.1")
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, pair.WriteDir(dir))
	cfg := mutate.DefaultConfig()
	cfg.SidecarImage = "example.com/rdzv-sidecar:v0.1.0"
	cfg.WebhookNamespace = "elastic-training-system"
	port, hport := testenv.FreePort(t), testenv.FreePort(t)
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	o := Options{Host: "127.0.0.1", Port: port, CertDir: dir, HealthAddr: fmt.Sprintf("127.0.0.1:%d", hport),
		MetricsAddr: "127.0.0.1:0", Config: cfg, Log: logr.Discard(), Ready: ready}
	if opts != nil {
		opts(&o)
	}
	go func() { done <- Run(ctx, o) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("webhook stopped: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("webhook not ready in 20 s")
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pair.CA)
	return &testServer{
		url:     fmt.Sprintf("https://127.0.0.1:%d", port),
		health:  fmt.Sprintf("http://127.0.0.1:%d", hport),
		client:  &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 10 * time.Second},
		certDir: dir,
	}
}

func review(t *testing.T, s *testServer, path string, pod *corev1.Pod) *admissionv1.AdmissionResponse {
	t.Helper()
	raw, err := json.Marshal(pod)
	require.NoError(t, err)
	ar := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID("uid-1"), Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: "team-a",
			Operation: admissionv1.Create, Object: runtimeRaw(raw),
		},
	}
	body, err := json.Marshal(ar)
	require.NoError(t, err)
	resp, err := s.client.Post(s.url+path, "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	out := admissionv1.AdmissionReview{}
	require.NoError(t, json.Unmarshal(b, &out))
	require.NotNil(t, out.Response)
	require.Equal(t, types.UID("uid-1"), out.Response.UID)
	return out.Response
}

func readPod(t *testing.T, file string) *corev1.Pod { return mutatetest.ReadPod(t, file) }

func TestServer(t *testing.T) {
	s := start(t)

	t.Run("mutates a training pod with warnings", func(t *testing.T) {
		r := review(t, s, PathMutatePods, readPod(t, "../mutate/testdata/pytorch-user-values-win.yaml"))
		require.True(t, r.Allowed)
		require.NotNil(t, r.PatchType)
		assert.Contains(t, string(r.Patch), "rdzv-sidecar")
		assert.Contains(t, string(r.Patch), "PET_RDZV_ENDPOINT")
		require.NotEmpty(t, r.Warnings)
		assert.Contains(t, strings.Join(r.Warnings, "\n"), "PET_NNODES")
	})
	t.Run("denies a malformed setting", func(t *testing.T) {
		p := readPod(t, "../mutate/testdata/pytorch-worker3-joins.yaml")
		p.Annotations["elastic-training.io/min-nodes"] = "lots"
		r := review(t, s, PathMutatePods, p)
		require.False(t, r.Allowed)
		assert.Contains(t, r.Result.Message, `elastic-training.io/min-nodes="lots" is invalid`)
	})
	t.Run("leaves other pods alone", func(t *testing.T) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nginx"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "nginx"}}}}
		r := review(t, s, PathMutatePods, p)
		require.True(t, r.Allowed)
		assert.Empty(t, r.Patch)
	})
	t.Run("health, readiness and metrics", func(t *testing.T) {
		for _, p := range []string{"/healthz", "/readyz"} {
			resp, err := http.Get(s.health + p)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode, p)
		}
	})
	t.Run("reloads a renewed certificate", func(t *testing.T) {
		pair, err := testcert.New("127.0.0.1")
		require.NoError(t, err)
		require.NoError(t, pair.WriteDir(s.certDir))
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pair.CA)
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 5 * time.Second}
		require.Eventually(t, func() bool {
			resp, err := c.Get(s.url + PathMutatePods)
			if err != nil {
				return false
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return true
		}, 20*time.Second, 100*time.Millisecond, "new certificate not served")
	})
}

func runtimeRaw(b []byte) runtime.RawExtension { return runtime.RawExtension{Raw: b} }

// TestServerHTTP2 checks what a client that offers both protocols (as the API
// server does) gets: HTTP/1.1 unless HTTP/2 is enabled.
func TestServerHTTP2(t *testing.T) {
	for _, tc := range []struct {
		name        string
		enableHTTP2 bool
		wantProto   string
	}{
		{"default: HTTP/1.1 only", false, "HTTP/1.1"},
		{"enabled", true, "HTTP/2.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startWith(t, func(o *Options) { o.EnableHTTP2 = tc.enableHTTP2 })
			tr := s.client.Transport.(*http.Transport).Clone()
			tr.ForceAttemptHTTP2 = true
			resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Post(s.url+PathMutatePods, "application/json", strings.NewReader("{}"))
			require.NoError(t, err)
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			assert.Equal(t, tc.wantProto, resp.Proto)
			require.NotNil(t, resp.TLS)
			want := "http/1.1"
			if tc.enableHTTP2 {
				want = "h2"
			}
			assert.Equal(t, want, resp.TLS.NegotiatedProtocol)
		})
	}
}

// A client that sends an admission request's headers and then withholds its body is cut off once BodyTimeout has
// passed, instead of holding its connection for as long as it likes; the server serves the next client.
func TestServerCutsOffAWithheldBody(t *testing.T) {
	s := startWith(t, func(o *Options) { o.BodyTimeout = 300 * time.Millisecond })
	tr := s.client.Transport.(*http.Transport)
	conn, err := tls.Dial("tcp", strings.TrimPrefix(s.url, "https://"), tr.TLSClientConfig.Clone())
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"apiVersion\":", PathMutatePods)
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(20*time.Second))) // the test's own bound, far above the server's
	_, err = io.ReadAll(conn)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server kept the connection open: %v", err)
	r := review(t, s, PathMutatePods, readPod(t, "../mutate/testdata/pytorch-worker3-joins.yaml"))
	assert.True(t, r.Allowed)
}

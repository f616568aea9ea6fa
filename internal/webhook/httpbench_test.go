package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"testing"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/elastic-training/elastic-training/internal/mutate"
	"github.com/elastic-training/elastic-training/internal/testcert"
)

// BenchmarkHTTPS measures one admission round trip over HTTPS per path
// (profile with -cpuprofile to see where the server spends its time).
func BenchmarkHTTPS(b *testing.B) {
	raw, _ := os.ReadFile("../mutate/testdata/pytorch-worker0-serves-rdzv.yaml")
	pod := &corev1.Pod{}
	if err := yaml.Unmarshal(raw, pod); err != nil {
		b.Fatal(err)
	}
	podJSON, _ := json.Marshal(pod)
	body, _ := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "u", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Namespace: "team-a", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: podJSON}},
	})
	pair, _ := testcert.New("127.0.0.1")
	dir := b.TempDir()
	if err := pair.WriteDir(dir); err != nil {
		b.Fatal(err)
	}
	cfg := mutate.DefaultConfig()
	cfg.SidecarImage = "example.com/rdzv-sidecar:v0.1.0"
	port := freePort(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	go Run(ctx, Options{Host: "127.0.0.1", Port: port, CertDir: dir, HealthAddr: "127.0.0.1:0", Config: cfg, Log: logr.Discard(), Ready: ready})
	<-ready
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pair.CA)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	for _, path := range []string{PathNoop, PathMutatePods} {
		b.Run(path[1:], func(b *testing.B) {
			for b.Loop() {
				resp, err := c.Post(fmt.Sprintf("https://127.0.0.1:%d%s", port, path), "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}

package webhook

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/podreplace"
)

const replaceURL = "https://elastic-training-webhook.elastic-training-system.svc:443" + podreplace.Path

// replacingPod is a serving pod that may ask for replacements when the webhook says where and with which CA.
const replacingPod = "../mutate/testdata/pytorch-own-host-replace-after.yaml"

// Each admission gives a serving sidecar the CA as the file holds it then; without one, the pod gets no means to
// ask (no URL, no CA, no token for the webhook) and is otherwise mutated as before.
func TestMutatorGivesTheCurrentCA(t *testing.T) {
	path := filepath.Join(t.TempDir(), constants.TLSCAName)
	cfg := goldenConfig()
	cfg.PodReplacement.URL = replaceURL
	cfg.PodReplacement.CA = []byte("a CA given in the configuration is never used: the file's is")
	mutator, err := NewPodMutator(cfg, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	mutator.ca = &caFile{path: path, log: logr.Discard()}
	pod := readPod(t, replacingPod)
	pod.Namespace = "team-a"
	admitted := func() *corev1.Pod {
		t.Helper()
		raw, err := json.Marshal(pod)
		require.NoError(t, err)
		resp := (&admission.Webhook{Handler: mutator}).Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			UID: "uid-1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: "team-a",
			Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
		}})
		require.True(t, resp.Allowed, "%+v", resp.Result)
		out := &corev1.Pod{}
		require.NoError(t, json.Unmarshal(applyPatch(t, resp, raw), out))
		return out
	}
	// What the serving sidecar got: its webhook CA, its --replace-url, the webhook token's audience.
	given := func(p *corev1.Pod) string {
		var got []string
		for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
			for _, e := range c.Env {
				if e.Name == constants.EnvWebhookCA {
					got = append(got, "ca="+e.Value)
				}
			}
			for _, a := range c.Args {
				if strings.HasPrefix(a, "--replace-url=") {
					got = append(got, a)
				}
			}
		}
		for _, v := range p.Spec.Volumes {
			if v.Name == constants.TokenVolumeName && v.Projected != nil {
				for _, s := range v.Projected.Sources {
					if s.ServiceAccountToken != nil && s.ServiceAccountToken.Audience != "" {
						got = append(got, "token="+s.ServiceAccountToken.Audience)
					}
				}
			}
		}
		return strings.Join(got, " ")
	}

	none := admitted()
	require.Empty(t, given(none), "no CA file: nothing to ask with")
	require.NotEmpty(t, none.Spec.Volumes, "and mutated all the same")
	ca1, ca2 := newCA(t), newCA(t)
	require.NoError(t, os.WriteFile(path, ca1, 0o644))
	want := fmt.Sprintf("ca=%s --replace-url=%s token=%s", ca1, replaceURL, podreplace.Audience)
	require.Equal(t, want, given(admitted()))
	require.NoError(t, os.Remove(path))
	require.NoError(t, os.WriteFile(path, ca2, 0o644))
	require.Equal(t, strings.Replace(want, string(ca1), string(ca2), 1), given(admitted()), "a rotated CA, from the next admission on")

	// Without the URL the file is not read: the configuration's CA alone never turns the feature on.
	cfg.PodReplacement.URL = ""
	mutator.config = cfg
	require.Empty(t, given(admitted()))
}

// The replacement route is served on the admission port only when given, with the same bound on a withheld body;
// Run points the mutator at CertDir's ca.crt.
func TestServerReplaceRoute(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s %s %q %v", r.Method, r.URL.Path, b, err))
		mu.Unlock()
		if err != nil {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"message":"seen"}`))
	})

	off := start(t)
	resp, err := off.client.Post(off.url+podreplace.Path, "application/json", strings.NewReader(`{"pod":"p"}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "not served without a handler")
	r := review(t, off, PathMutatePods, readPod(t, replacingPod))
	require.True(t, r.Allowed)
	assert.NotContains(t, string(r.Patch), "--replace-url", "no URL: serving sidecars never ask")

	s := startWith(t, func(o *Options) {
		o.Replace = handler
		o.Config.PodReplacement.URL = replaceURL
		o.BodyTimeout = 300 * time.Millisecond
	})
	resp, err = s.client.Post(s.url+podreplace.Path, "application/json", strings.NewReader(`{"pod":"p"}`))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.JSONEq(t, `{"message":"seen"}`, string(b))

	// testcert's directory has a ca.crt, as the chart's, cert-manager's and the rotator's have.
	ca, err := os.ReadFile(filepath.Join(s.certDir, constants.TLSCAName))
	require.NoError(t, err)
	r = review(t, s, PathMutatePods, readPod(t, replacingPod))
	require.True(t, r.Allowed)
	assert.Contains(t, string(r.Patch), "--replace-url="+replaceURL)
	caJSON, err := json.Marshal(string(ca))
	require.NoError(t, err)
	assert.Contains(t, string(r.Patch), string(caJSON[1:len(caJSON)-1]), "the CA of the certificate directory")

	tr := s.client.Transport.(*http.Transport)
	conn, err := tls.Dial("tcp", strings.TrimPrefix(s.url, "https://"), tr.TLSClientConfig.Clone())
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"pod\":", podreplace.Path)
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(20*time.Second)))
	_, err = io.ReadAll(conn)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server kept the connection open: %v", err)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 2)
	assert.Equal(t, `POST /replace-pod "{\"pod\":\"p\"}" <nil>`, seen[0])
	assert.Contains(t, seen[1], "i/o timeout", "the withheld body was cut off by the deadline")
}

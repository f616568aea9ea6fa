package sidecar_test

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/tcpstore/tcpstoretest"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

// A trainer's sidecar that verifies (join --c10d-verify, what the webhook sets for a PyTorch c10d job) never carries
// its agent's store connections to a store that does not name itself a pod of the job: one that names a host
// elsewhere, or none at all (what a store someone pointed the rendezvous Service at would be). The connection is
// closed at once, the refusal logged and counted, and the store never sees a byte. The same join without
// --c10d-verify carries the connection to that store (what the check stops). A store that names a pod of the job is
// dialled at that name: on the cluster (test/e2e, every c10d PyTorch job), where the job's pod names resolve.
func TestVerifyingSidecarRefusesAStoreOfAnotherJob(t *testing.T) {
	const self = "llm-worker-1.llm.ml.svc.cluster.local"
	for _, c := range []struct {
		name, serverHost, want string
	}{
		{"names a host elsewhere", "evil.example.com", `evil\.example\.com:\d+\\?" as its server: \\?"evil\.example\.com\\?" is not a pod of this pod's job`},
		{"names another job's pod", "other-worker-0.other.ml.svc.cluster.local", `is not a pod of this pod's job`},
		{"names no server", "", `the store does not name the pod that serves it`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var extra []string
			if c.serverHost != "" {
				extra = []string{"--member-host=" + c.serverHost, "--register=false"}
			}
			s := startServe(t, extra...)
			proxy := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			j, health := startJoinHealth(t, s.URL, self, 1, "", "--c10d-addr="+proxy, "--c10d-upstream="+s.C10d, "--c10d-verify")
			for range 3 {
				_, err := tcpstoretest.Dial(proxy)
				require.Error(t, err, "the proxy carried a connection to a store that is not the job's")
			}
			testenv.WaitOutput(t, j, "refusing to carry the trainer's store connections", 10*time.Second)
			assert.Regexp(t, regexp.MustCompile(c.want), j.Output())
			assert.Equal(t, 3, metric(t, health, "elastic_training_sidecar_c10d_proxy_refused_total"), "every refused connection counted")
			assert.Zero(t, metric(t, s.Health, "elastic_training_sidecar_tcpstore_received_bytes_total"), "the store saw nothing of the trainer")

			// Without --c10d-verify the same store gets the connection: the check is what stops it.
			plain := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			startJoin(t, s.URL, "llm-worker-2.llm.ml.svc.cluster.local", 1, "", "--c10d-addr="+plain, "--c10d-upstream="+s.C10d)
			cl, err := tcpstoretest.Dial(plain)
			require.NoError(t, err)
			cl.Close()
			assert.NotZero(t, metric(t, s.Health, "elastic_training_sidecar_tcpstore_received_bytes_total"))
		})
	}
}

// metric reads one unlabelled sample from a sidecar's /metrics.
func metric(t *testing.T, health, name string) int {
	t.Helper()
	b := metricsBody(t, health)
	m := regexp.MustCompile(`(?m)^` + name + ` ([0-9.e+]+)$`).FindSubmatch(b)
	require.NotNil(t, m, "no %s in /metrics of %s", name, health)
	v, err := strconv.ParseFloat(string(m[1]), 64)
	require.NoError(t, err)
	return int(v)
}

// metricsBody is serve's /metrics.
func metricsBody(t *testing.T, health string) []byte {
	t.Helper()
	resp, err := http.Get("http://" + health + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return b
}

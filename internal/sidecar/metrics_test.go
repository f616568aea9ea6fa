package sidecar

import (
	"encoding/base64"
	"io"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/torchbackends/torchrounds"
	"github.com/elastic-training/elastic-training/internal/torchview"
)

// Each caller's registry gets the metrics (several sidecars in one process
// do not collide), and /metrics serves them with the default registry's,
// where etcd registers its own.
func TestMetricsInTheCallersRegistry(t *testing.T) {
	for range 2 {
		reg := prometheus.NewRegistry()
		m := newMetrics(reg)
		m.members.Set(3)
		torchrounds.New(torchview.New(torchview.Config{Metrics: reg})).V2Write("/torch/elastic/store/"+
			base64.StdEncoding.EncodeToString([]byte("torch.rendezvous.r.0/MASTER_ADDR")), "")
		m.v2.ActiveWaits.Set(0)

		rec := httptest.NewRecorder()
		healthMux(func() (bool, string) { return true, "ok" }, reg, nil).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		require.Equal(t, 200, rec.Code)
		body, _ := io.ReadAll(rec.Body)
		for _, want := range []string{
			"elastic_training_sidecar_members 3", "elastic_training_sidecar_membership_changes_total 0", "elastic_training_sidecar_files_written_total 0",
			`elastic_training_sidecar_rendezvous_rounds_total{backend="etcd-v2"} 1`, "elastic_training_sidecar_v2_active_waits 0",
			"go_goroutines", // prometheus' default registry
		} {
			require.Contains(t, string(body), want)
		}
	}
}

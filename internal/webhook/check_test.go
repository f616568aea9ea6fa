package webhook

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastic-training/elastic-training/internal/testcert"
)

// TestCheck runs `webhook check` (the webhook chart's helm test) against the real server: it passes with the
// serving certificate's CA, and fails, saying why, with another CA and on a URL nothing serves.
func TestCheck(t *testing.T) {
	s := start(t)
	var out bytes.Buffer
	cfg := CheckConfig{URL: s.url + "/mutate-pods", CAFile: filepath.Join(s.certDir, "ca.crt"), Timeout: 20 * time.Second}
	require.NoError(t, Check(context.Background(), cfg, &out))
	require.Contains(t, out.String(), "OK: the webhook mutated a training pod (elastic-training.io/mutated=sidecar=join,slots=1, sidecar image example.com/rdzv-sidecar:v0.1.0, gate elastic-training.io/webhook removed)")

	other, err := testcert.New("127.0.0.1")
	require.NoError(t, err)
	otherCA := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(otherCA, other.CA, 0o644))
	cfg.CAFile, cfg.Timeout = otherCA, time.Second
	require.ErrorContains(t, Check(context.Background(), cfg, &out), "certificate signed by unknown authority")

	cfg.CAFile, cfg.URL = filepath.Join(s.certDir, "ca.crt"), s.url+"/no-such-path"
	require.ErrorContains(t, Check(context.Background(), cfg, &out), "404")
}

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestResourcesFlag(t *testing.T) {
	var r corev1.ResourceRequirements
	f := resourcesFlag{&r}
	require.NoError(t, f.Set(`{"requests":{"cpu":"50m"},"limits":{"cpu":"1","memory":"512Mi"}}`))
	assert.True(t, r.Limits.Cpu().Equal(resource.MustParse("1")))
	assert.True(t, r.Requests.Cpu().Equal(resource.MustParse("50m")))
	assert.JSONEq(t, `{"requests":{"cpu":"50m"},"limits":{"cpu":"1","memory":"512Mi"}}`, f.String())
	for _, bad := range []string{`{"limits":{"cpu":"one"}}`, `{"limit":{"cpu":"1"}}`, `cpu=1`, ``} {
		err := f.Set(bad)
		assert.Error(t, err, "%q", bad)
	}
	assert.True(t, r.Limits.Cpu().Equal(resource.MustParse("1")), "a refused value changes nothing")
}

func TestCheckCmdUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	if rc := checkCmd(nil, &out, &errOut); rc != 2 || !strings.Contains(errOut.String(), "--url and --ca-file are required") {
		t.Fatalf("check without flags: rc %d, stderr %q", rc, errOut.String())
	}
	errOut.Reset()
	if rc := checkCmd([]string{"--url=https://127.0.0.1:1/mutate-pods", "--ca-file=/nonexistent"}, &out, &errOut); rc != 1 || !strings.Contains(errOut.String(), "the CA") {
		t.Fatalf("check with a missing CA: rc %d, stderr %q", rc, errOut.String())
	}
}

// The replacement server is built from controller-runtime's config, as the event recorder is; its metric is
// registered where the webhook's others are.
func TestReplaceServer(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600))
	t.Setenv("KUBECONFIG", kc)
	reg := prometheus.NewRegistry()
	s, err := replaceServer(nil, logr.Discard(), reg)
	require.NoError(t, err)
	require.NotNil(t, s)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, mfs, 1)
	assert.Equal(t, "elastic_training_webhook_pod_replacements_total", mfs[0].GetName())
	_, err = replaceServer(nil, logr.Discard(), reg)
	require.ErrorContains(t, err, "registering", "a second one in the same registry")
}

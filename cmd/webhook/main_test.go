package main

import (
	"bytes"
	"strings"
	"testing"

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

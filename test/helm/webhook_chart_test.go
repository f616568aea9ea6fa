package helm_test

// The webhook add-on's chart, charts/elastic-training-webhook, rendered client-side (chartrender) as release
// elastic-training-webhook in namespace elastic-training-system.

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

const (
	webhookChartDir = "../../charts/elastic-training-webhook"
	webhookRelease  = "elastic-training-webhook"
	webhookNS       = "elastic-training-system"
)

// renderWebhookChart renders the webhook chart as an install or, given the objects an earlier revision left in the
// cluster (cluster not nil), as an upgrade: the chart's lookup calls see them (this is how the generated CA is kept).
func renderWebhookChart(values map[string]any, cluster []map[string]any) (*chartrender.Rendered, error) {
	o := chartrender.Options{Release: webhookRelease, Namespace: webhookNS, Cluster: cluster}
	if cluster != nil {
		o.Revision = 2
	}
	return chartrender.RenderDir(webhookChartDir, values, o)
}

func renderWebhook(t *testing.T, values map[string]any) *chartrender.Rendered {
	t.Helper()
	r, err := renderWebhookChart(values, nil)
	require.NoError(t, err)
	return r
}

func convert[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	require.NotNil(t, u)
	out := new(T)
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out))
	return out
}

func cert(t *testing.T, b64 string) *x509.Certificate {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(b64)
	require.NoError(t, err)
	block, _ := pem.Decode(raw)
	require.NotNil(t, block)
	c, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	return c
}

func TestWebhookChartDefaults(t *testing.T) {
	r := renderWebhook(t, nil)
	name := "elastic-training-webhook"

	dep := convert[appsv1.Deployment](t, r.Find("Deployment", name))
	assert.Equal(t, int32(2), *dep.Spec.Replicas)
	pod := dep.Spec.Template.Spec
	assert.False(t, *pod.AutomountServiceAccountToken, "the webhook needs no API access")
	assert.Len(t, pod.TopologySpreadConstraints, 2)
	c := pod.Containers[0]
	assert.Contains(t, c.Args, "--webhook-namespace="+webhookNS)
	assert.Contains(t, c.Args, "--sidecar-image=ghcr.io/elastic-training/rdzv-sidecar:0.1.0")
	assert.Contains(t, c.Args, "--default-last-call-timeout=2")
	assert.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
	assert.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	assert.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	assert.Equal(t, "ALL", string(c.SecurityContext.Capabilities.Drop[0]))
	require.NotNil(t, r.Find("PodDisruptionBudget", name))
	require.NotNil(t, r.Find("Service", name))
	assert.Nil(t, r.Find("Role", ""), "no RBAC")
	assert.Nil(t, r.Find("ClusterRole", ""), "no RBAC")

	mwc := convert[admissionregistrationv1.MutatingWebhookConfiguration](t, r.Find("MutatingWebhookConfiguration", name))
	require.Len(t, mwc.Webhooks, 1)
	wh := mwc.Webhooks[0]
	assert.Equal(t, admissionregistrationv1.SideEffectClassNone, *wh.SideEffects)
	assert.Equal(t, admissionregistrationv1.Fail, *wh.FailurePolicy)
	assert.Equal(t, int32(5), *wh.TimeoutSeconds)
	assert.Equal(t, admissionregistrationv1.NeverReinvocationPolicy, *wh.ReinvocationPolicy)
	require.Len(t, wh.Rules, 1)
	assert.Equal(t, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, wh.Rules[0].Operations)
	assert.Equal(t, []string{"pods"}, wh.Rules[0].Resources)
	assert.Equal(t, "elastic-training.io/job", wh.ObjectSelector.MatchExpressions[0].Key)
	assert.Equal(t, []string{"kube-system", webhookNS}, wh.NamespaceSelector.MatchExpressions[0].Values)
	require.NotNil(t, wh.ClientConfig.Service)
	assert.Equal(t, "/mutate-pods", *wh.ClientConfig.Service.Path)

	// The generated serving certificate is signed by the caBundle and names the Service.
	secret := r.Find("Secret", name+"-tls")
	require.NotNil(t, secret)
	data := secret.Object["data"].(map[string]any)
	assert.Equal(t, base64.StdEncoding.EncodeToString(wh.ClientConfig.CABundle), data["ca.crt"])
	pool := x509.NewCertPool()
	pool.AddCert(cert(t, data["ca.crt"].(string)))
	_, err := cert(t, data["tls.crt"].(string)).Verify(x509.VerifyOptions{
		DNSName: name + "." + webhookNS + ".svc", Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	require.NoError(t, err)
	assert.Contains(t, r.Notes, "rollout status deploy/"+name)
}

func TestWebhookChartURLMode(t *testing.T) {
	r := renderWebhook(t, map[string]any{"webhook": map[string]any{"url": "https://127.0.0.1:30443/mutate-pods", "failurePolicy": "Ignore", "timeoutSeconds": 10, "reinvocationPolicy": "IfNeeded"}})
	mwc := convert[admissionregistrationv1.MutatingWebhookConfiguration](t, r.Find("MutatingWebhookConfiguration", ""))
	wh := mwc.Webhooks[0]
	assert.Equal(t, "https://127.0.0.1:30443/mutate-pods", *wh.ClientConfig.URL)
	assert.Nil(t, wh.ClientConfig.Service)
	assert.Equal(t, admissionregistrationv1.Ignore, *wh.FailurePolicy)
	assert.Equal(t, int32(10), *wh.TimeoutSeconds)
	assert.Equal(t, admissionregistrationv1.IfNeededReinvocationPolicy, *wh.ReinvocationPolicy)
	data := r.Find("Secret", "").Object["data"].(map[string]any)
	c := cert(t, data["tls.crt"].(string))
	require.Len(t, c.IPAddresses, 1)
	assert.Equal(t, "127.0.0.1", c.IPAddresses[0].String())
}

func TestWebhookChartCertManager(t *testing.T) {
	r := renderWebhook(t, map[string]any{"tls": map[string]any{"certManager": map[string]any{"enabled": true}}})
	assert.Nil(t, r.Find("Secret", ""), "cert-manager writes the Secret")
	require.NotNil(t, r.Find("Certificate", "elastic-training-webhook"))
	require.NotNil(t, r.Find("Issuer", "elastic-training-webhook-ca"))
	mwc := r.Find("MutatingWebhookConfiguration", "")
	assert.Equal(t, webhookNS+"/elastic-training-webhook", mwc.GetAnnotations()["cert-manager.io/inject-ca-from"])
	wh := convert[admissionregistrationv1.MutatingWebhookConfiguration](t, mwc).Webhooks[0]
	assert.Empty(t, wh.ClientConfig.CABundle)

	r = renderWebhook(t, map[string]any{"tls": map[string]any{"certManager": map[string]any{"enabled": true, "issuerRef": map[string]any{"name": "corp-ca", "kind": "ClusterIssuer"}}}})
	assert.Nil(t, r.Find("Issuer", ""), "a given issuer is used as is")
	crt := r.Find("Certificate", "elastic-training-webhook")
	assert.Equal(t, "corp-ca", crt.Object["spec"].(map[string]any)["issuerRef"].(map[string]any)["name"])
}

func TestWebhookChartValuesFlowIntoFlags(t *testing.T) {
	r := renderWebhook(t, map[string]any{
		"extraAccelerators": []any{"example.com/tpu", "xilinx.com/fpga"},
		"defaults":          map[string]any{"rdzvBackend": "c10d", "mpiFlavour": "mpich"},
		"webhook":           map[string]any{"excludeNamespaces": []any{"monitoring"}},
		"metrics":           map[string]any{"enabled": false},
	})
	dep := convert[appsv1.Deployment](t, r.Find("Deployment", ""))
	args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " ")
	for _, want := range []string{"--extra-accelerator=example.com/tpu", "--extra-accelerator=xilinx.com/fpga",
		"--default-rdzv-backend=c10d", "--default-mpi-flavour=mpich", "--metrics-addr=0"} {
		assert.Contains(t, args, want)
	}
	wh := convert[admissionregistrationv1.MutatingWebhookConfiguration](t, r.Find("MutatingWebhookConfiguration", "")).Webhooks[0]
	assert.Contains(t, wh.NamespaceSelector.MatchExpressions[0].Values, "monitoring")
}

func TestWebhookChartSchemaRejects(t *testing.T) {
	cases := map[string]struct {
		values map[string]any
		want   string
	}{
		"typo at top level":      {map[string]any{"replicas": 3}, "replicas"},
		"typo in webhook":        {map[string]any{"webhook": map[string]any{"timeout": 5}}, "timeout"},
		"failure policy case":    {map[string]any{"webhook": map[string]any{"failurePolicy": "fail"}}, "failurePolicy"},
		"timeout above 30":       {map[string]any{"webhook": map[string]any{"timeoutSeconds": 60}}, "timeoutSeconds"},
		"plain http url":         {map[string]any{"webhook": map[string]any{"url": "http://127.0.0.1:9443/x"}}, "url"},
		"unknown backend":        {map[string]any{"defaults": map[string]any{"rdzvBackend": "zookeeper"}}, "rdzvBackend"},
		"zero last call timeout": {map[string]any{"defaults": map[string]any{"lastCallTimeout": 0}}, "lastCallTimeout"},
		"unknown flavour":        {map[string]any{"defaults": map[string]any{"mpiFlavour": "open-mpi"}}, "mpiFlavour"},
		"bad accelerator name":   {map[string]any{"extraAccelerators": []any{"tpu"}}, "extraAccelerators"},
		"zero replicas":          {map[string]any{"replicaCount": 0}, "replicaCount"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := renderWebhookChart(tc.values, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestWebhookChartCAKeptAcrossUpgrades(t *testing.T) {
	first := renderWebhook(t, nil)
	secret := first.Find("Secret", "elastic-training-webhook-tls")
	require.NotNil(t, secret)
	again := renderWebhook(t, nil)
	assert.NotEqual(t, secret.Object["data"], again.Find("Secret", "").Object["data"], "a fresh install generates a new CA")

	up, err := renderWebhookChart(map[string]any{"replicaCount": 3}, []map[string]any{secret.Object})
	require.NoError(t, err)
	assert.Equal(t, secret.Object["data"], up.Find("Secret", "").Object["data"], "an upgrade keeps the CA and certificate")
	wh := convert[admissionregistrationv1.MutatingWebhookConfiguration](t, up.Find("MutatingWebhookConfiguration", "")).Webhooks[0]
	assert.Equal(t, secret.Object["data"].(map[string]any)["ca.crt"], base64.StdEncoding.EncodeToString(wh.ClientConfig.CABundle))
}

package helm_test

// The webhook add-on's chart, charts/elastic-training-webhook, rendered client-side (chartrender) as release
// elastic-training-webhook in namespace elastic-training-system.

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/strvals"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
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
	assert.True(t, *pod.AutomountServiceAccountToken, "a token to create Events (events.enabled)")
	assert.Contains(t, pod.Containers[0].Args, "--events")
	assert.Len(t, pod.TopologySpreadConstraints, 2)
	c := pod.Containers[0]
	assert.Contains(t, c.Args, "--webhook-namespace="+webhookNS)
	assert.Contains(t, c.Args, "--sidecar-image=ghcr.io/elastic-training/rdzv-sidecar:0.2.0")
	assert.Contains(t, c.Args, "--default-last-call-timeout=2")
	assert.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
	assert.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	assert.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	assert.Equal(t, "ALL", string(c.SecurityContext.Capabilities.Drop[0]))
	// Pod replacement (docs/hangs.md): its URL behind the Service, which the serving certificate covers; tokens
	// reviewed, pods read and deleted, nothing else.
	assert.Contains(t, c.Args, "--pod-replacement-url=https://"+name+"."+webhookNS+".svc:443/replace-pod")
	repl := convert[rbacv1.ClusterRole](t, r.Find("ClusterRole", name+"-pod-replacement"))
	assert.Equal(t, []rbacv1.PolicyRule{
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "delete"}},
	}, repl.Rules)
	replBinding := convert[rbacv1.ClusterRoleBinding](t, r.Find("ClusterRoleBinding", name+"-pod-replacement"))
	assert.Equal(t, name, replBinding.Subjects[0].Name)
	assert.Equal(t, name+"-pod-replacement", replBinding.RoleRef.Name)
	require.NotNil(t, r.Find("PodDisruptionBudget", name))
	require.NotNil(t, r.Find("Service", name))
	checkRotatorDefaults(t, r, name)
	// The rest with the chart's own certificate (tls.rotator.enabled=false).
	noRotator := map[string]any{"tls": map[string]any{"rotator": map[string]any{"enabled": false}}}
	r = renderWebhook(t, noRotator)
	assert.Nil(t, r.Find("Role", ""), "no namespaced RBAC")
	role := convert[rbacv1.ClusterRole](t, r.Find("ClusterRole", name+"-events"))
	require.Len(t, role.Rules, 1, "Events only")
	assert.Equal(t, []string{"events"}, role.Rules[0].Resources)
	assert.Equal(t, []string{"create", "patch"}, role.Rules[0].Verbs)
	binding := convert[rbacv1.ClusterRoleBinding](t, r.Find("ClusterRoleBinding", name+"-events"))
	assert.Equal(t, name, binding.Subjects[0].Name)

	// Without Events and rotation: no RBAC at all, no token.
	r = renderWebhook(t, merge(noRotator, map[string]any{"events": map[string]any{"enabled": false}, "podReplacement": map[string]any{"enabled": false}}))
	dep = convert[appsv1.Deployment](t, r.Find("Deployment", name))
	assert.False(t, *dep.Spec.Template.Spec.AutomountServiceAccountToken, "no API access without events")
	assert.NotContains(t, dep.Spec.Template.Spec.Containers[0].Args, "--events")
	assert.Nil(t, r.Find("ClusterRole", name+"-events"), "no RBAC of the webhook's own without events")
	assert.Nil(t, r.Find("ClusterRoleBinding", name+"-events"))
	assert.Nil(t, r.Find("ClusterRole", name+"-cert-rotation"))
	assert.Nil(t, r.Find("ClusterRole", name+"-pod-replacement"))
	assert.Nil(t, r.Find("ClusterRoleBinding", name+"-pod-replacement"))
	assert.NotContains(t, strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "), "--pod-replacement-url")
	// Pod replacement alone needs the token (its TokenReviews and deletions), and no other right.
	r = renderWebhook(t, merge(noRotator, map[string]any{"events": map[string]any{"enabled": false}}))
	dep = convert[appsv1.Deployment](t, r.Find("Deployment", name))
	assert.True(t, *dep.Spec.Template.Spec.AutomountServiceAccountToken, "a token to review tokens and delete pods")
	assert.Nil(t, r.Find("ClusterRole", name+"-events"))
	require.NotNil(t, r.Find("ClusterRole", name+"-pod-replacement"))
	r = renderWebhook(t, noRotator)

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

// checkRotatorDefaults: by default the webhook keeps its certificate itself: an empty Opaque Secret for the
// rotator to fill, no caBundle rendered (the rotator injects it, and Helm keeps what neither manifest has), the
// rotation's flags naming that Secret, this webhook configuration and the Service's names, the certificate written
// to an emptyDir, and RBAC for that one Secret and that one webhook configuration, with the token to use it.
func checkRotatorDefaults(t *testing.T, r *chartrender.Rendered, name string) {
	t.Helper()
	secret := r.Find("Secret", name+"-serving-cert")
	require.NotNil(t, secret)
	assert.Equal(t, "Opaque", secret.Object["type"])
	assert.Nil(t, secret.Object["data"], "no key material rendered: stable across re-renders")
	assert.Nil(t, r.Find("Secret", name+"-tls"))
	wh := convert[admissionregistrationv1.MutatingWebhookConfiguration](t, r.Find("MutatingWebhookConfiguration", name)).Webhooks[0]
	assert.Empty(t, wh.ClientConfig.CABundle, "the rotator injects the CA")

	dep := convert[appsv1.Deployment](t, r.Find("Deployment", name))
	pod := dep.Spec.Template.Spec
	assert.True(t, *pod.AutomountServiceAccountToken)
	svc := name + "." + webhookNS + ".svc"
	for _, want := range []string{"--cert-rotation-secret=" + webhookNS + "/" + name + "-serving-cert", "--cert-rotation-webhook=" + name,
		"--cert-dns-names=" + svc + "," + svc + ".cluster.local," + name + "," + name + "." + webhookNS,
		"--ca-validity=87600h", "--cert-validity=8760h", "--cert-lookahead=2160h", "--cert-check-interval=12h", "--cert-dir=/etc/elastic-training-webhook/tls"} {
		assert.Contains(t, pod.Containers[0].Args, want)
	}
	require.Len(t, pod.Volumes, 1)
	require.NotNil(t, pod.Volumes[0].EmptyDir, "the webhook writes the certificate itself")
	assert.False(t, pod.Containers[0].VolumeMounts[0].ReadOnly)

	role := convert[rbacv1.Role](t, r.Find("Role", name+"-cert-rotation"))
	require.Len(t, role.Rules, 2)
	assert.Equal(t, []string{"get", "list", "watch"}, role.Rules[0].Verbs)
	assert.Equal(t, []string{name + "-serving-cert"}, role.Rules[1].ResourceNames, "it writes only its own Secret")
	cr := convert[rbacv1.ClusterRole](t, r.Find("ClusterRole", name+"-cert-rotation"))
	require.Len(t, cr.Rules, 2)
	assert.Equal(t, []string{"mutatingwebhookconfigurations"}, cr.Rules[1].Resources)
	assert.Equal(t, []string{name}, cr.Rules[1].ResourceNames, "it writes only its own webhook configuration")
	for _, kind := range []string{"RoleBinding", "ClusterRoleBinding"} {
		b := r.Find(kind, name+"-cert-rotation")
		require.NotNil(t, b, kind)
		assert.Equal(t, name, convert[rbacv1.RoleBinding](t, b).Subjects[0].Name)
	}
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
		"monitor interval zero":  {map[string]any{"defaults": map[string]any{"monitorInterval": 0}}, "monitorInterval"},
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
	helmTLS := map[string]any{"tls": map[string]any{"rotator": map[string]any{"enabled": false}}}
	first := renderWebhook(t, helmTLS)
	secret := first.Find("Secret", "elastic-training-webhook-tls")
	require.NotNil(t, secret)
	again := renderWebhook(t, helmTLS)
	assert.NotEqual(t, secret.Object["data"], again.Find("Secret", "").Object["data"], "a fresh install generates a new CA")

	up, err := renderWebhookChart(merge(helmTLS, map[string]any{"replicaCount": 3}), []map[string]any{secret.Object})
	require.NoError(t, err)
	assert.Equal(t, secret.Object["data"], up.Find("Secret", "").Object["data"], "an upgrade keeps the CA and certificate")
	wh := convert[admissionregistrationv1.MutatingWebhookConfiguration](t, up.Find("MutatingWebhookConfiguration", "")).Webhooks[0]
	assert.Equal(t, secret.Object["data"].(map[string]any)["ca.crt"], base64.StdEncoding.EncodeToString(wh.ClientConfig.CABundle))
}

// keptTLS is what a first install of the defaults leaves in the cluster: rendered against it, the chart reuses the
// Secret's CA and certificate (lookup) instead of generating new ones, which keeps the many renders below fast.
var keptTLS = sync.OnceValues(func() ([]map[string]any, error) {
	r, err := renderWebhookChart(nil, nil)
	if err != nil {
		return nil, err
	}
	return r.Cluster(webhookNS), nil
})

// renderWebhookKept renders values as an upgrade of the default install (keptTLS).
func renderWebhookKept(t *testing.T, values map[string]any) (*chartrender.Rendered, error) {
	t.Helper()
	cluster, err := keptTLS()
	require.NoError(t, err)
	return renderWebhookChart(values, cluster)
}

// webhookSets turns --set style assignments into values; a "json:" prefix is --set-json (numbers stay numbers,
// as in a values file).
func webhookSets(t *testing.T, sets ...string) map[string]any {
	t.Helper()
	vals := map[string]any{}
	for _, s := range sets {
		parse := strvals.ParseInto
		if j, ok := strings.CutPrefix(s, "json:"); ok {
			s, parse = j, strvals.ParseJSON
		}
		require.NoError(t, parse(s, vals), "--set %s", s)
	}
	return vals
}

// webhookPod is the rendered Deployment's pod spec and its webhook container.
func webhookPod(t *testing.T, r *chartrender.Rendered) (corev1.PodSpec, corev1.Container) {
	t.Helper()
	dep := convert[appsv1.Deployment](t, r.Find("Deployment", ""))
	pod := dep.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	return pod, pod.Containers[0]
}

// assertRestricted checks the pod against the restricted Pod Security Standard's container and pod rules
// (https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted).
func assertRestricted(t *testing.T, pod corev1.PodSpec) {
	t.Helper()
	assert.False(t, pod.HostNetwork || pod.HostPID || pod.HostIPC, "host namespaces")
	for _, v := range pod.Volumes {
		assert.Nil(t, v.HostPath, "volume %s: hostPath", v.Name)
	}
	psc := pod.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
		sc := c.SecurityContext
		require.NotNil(t, sc, "container %s: no securityContext", c.Name)
		nonRoot := psc.RunAsNonRoot != nil && *psc.RunAsNonRoot
		if sc.RunAsNonRoot != nil {
			nonRoot = *sc.RunAsNonRoot
		}
		assert.True(t, nonRoot, "container %s: runAsNonRoot", c.Name)
		for _, uid := range []*int64{psc.RunAsUser, sc.RunAsUser} {
			assert.True(t, uid == nil || *uid != 0, "container %s: runAsUser 0", c.Name)
		}
		seccomp := psc.SeccompProfile
		if sc.SeccompProfile != nil {
			seccomp = sc.SeccompProfile
		}
		if assert.NotNil(t, seccomp, "container %s: seccompProfile", c.Name) {
			assert.Contains(t, []corev1.SeccompProfileType{corev1.SeccompProfileTypeRuntimeDefault, corev1.SeccompProfileTypeLocalhost}, seccomp.Type, "container %s", c.Name)
		}
		assert.True(t, sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation, "container %s: allowPrivilegeEscalation must be false", c.Name)
		assert.False(t, sc.Privileged != nil && *sc.Privileged, "container %s: privileged", c.Name)
		if assert.NotNil(t, sc.Capabilities, "container %s: capabilities", c.Name) {
			assert.Contains(t, sc.Capabilities.Drop, corev1.Capability("ALL"), "container %s: capabilities.drop", c.Name)
			for _, add := range sc.Capabilities.Add {
				assert.Equal(t, corev1.Capability("NET_BIND_SERVICE"), add, "container %s: capabilities.add", c.Name)
			}
		}
	}
}

func TestWebhookChartDefaultSecurityIsRestricted(t *testing.T) {
	r := renderWebhook(t, nil)
	pod, c := webhookPod(t, r)
	assertRestricted(t, pod)
	assert.Equal(t, int64(65532), *pod.SecurityContext.RunAsUser)
	assert.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	assert.Empty(t, pod.ImagePullSecrets)
	assert.Empty(t, c.Env)
	assert.Equal(t, "elastic-training-webhook", pod.ServiceAccountName)
	sa := r.Find("ServiceAccount", "elastic-training-webhook")
	require.NotNil(t, sa)
	assert.Equal(t, false, sa.Object["automountServiceAccountToken"])
	assert.Nil(t, r.Find("ServiceMonitor", ""), "no ServiceMonitor unless metrics.serviceMonitor.enabled")
	assert.Equal(t, []string{"--zap-log-level=info", "--events", "--pod-replacement-url=https://elastic-training-webhook." + webhookNS + ".svc:443/replace-pod"},
		c.Args[len(c.Args)-3:], "the chart's own args end with the log level, --events and --pod-replacement-url")
}

// TestWebhookChartValues: each value a cluster admin expects from cert-manager, ingress-nginx or Kueue charts
// renders where it should.
func TestWebhookChartValues(t *testing.T) {
	cases := []struct {
		desc  string
		sets  []string
		check func(t *testing.T, r *chartrender.Rendered)
	}{
		{"imagePullSecrets in the Deployment", []string{"imagePullSecrets[0].name=regcred", "imagePullSecrets[1].name=mirror"}, func(t *testing.T, r *chartrender.Rendered) {
			pod, _ := webhookPod(t, r)
			assert.Equal(t, []corev1.LocalObjectReference{{Name: "regcred"}, {Name: "mirror"}}, pod.ImagePullSecrets)
			assert.NotContains(t, strings.Join(pod.Containers[0].Args, " "), "regcred", "not passed on to training pods")
		}},
		{"sidecar resources as the webhook's JSON flags", []string{`json:sidecar.resources={"serve":{"requests":{"cpu":"50m"},"limits":{"cpu":"1","memory":"512Mi"}},"join":{"limits":{"cpu":"200m"}}}`}, func(t *testing.T, r *chartrender.Rendered) {
			_, c := webhookPod(t, r)
			assert.Contains(t, c.Args, `--sidecar-serve-resources={"limits":{"cpu":"1","memory":"512Mi"},"requests":{"cpu":"50m"}}`)
			assert.Contains(t, c.Args, `--sidecar-join-resources={"limits":{"cpu":"200m"}}`)
		}},
		{"sidecar resources empty: the webhook's defaults, no flag", nil, func(t *testing.T, r *chartrender.Rendered) {
			_, c := webhookPod(t, r)
			assert.NotContains(t, strings.Join(c.Args, " "), "-resources=")
		}},
		{"extraArgs appended after the chart's args", []string{"extraArgs={--zap-encoder=console,--enable-http2}"}, func(t *testing.T, r *chartrender.Rendered) {
			_, c := webhookPod(t, r)
			n := len(c.Args)
			require.Greater(t, n, 5)
			assert.Equal(t, []string{"--zap-log-level=info", "--events", "--pod-replacement-url=https://elastic-training-webhook." + webhookNS + ".svc:443/replace-pod",
				"--zap-encoder=console", "--enable-http2"}, c.Args[n-5:])
		}},
		{"pod replacement at webhook.url's host when the webhook runs outside", []string{"webhook.url=https://10.0.0.5:9443/mutate-pods"}, func(t *testing.T, r *chartrender.Rendered) {
			_, c := webhookPod(t, r)
			assert.Contains(t, c.Args, "--pod-replacement-url=https://10.0.0.5:9443/replace-pod")
		}},
		{"extraArgs quoted", []string{`json:extraArgs=["--host=", "--zap-log-level=debug: yes"]`}, func(t *testing.T, r *chartrender.Rendered) {
			_, c := webhookPod(t, r)
			assert.Equal(t, []string{"--host=", "--zap-log-level=debug: yes"}, c.Args[len(c.Args)-2:])
		}},
		{"extraEnv in the webhook container", []string{`json:extraEnv=[{"name":"GOMEMLIMIT","value":"100MiB"},{"name":"NODE","valueFrom":{"fieldRef":{"fieldPath":"spec.nodeName"}}}]`}, func(t *testing.T, r *chartrender.Rendered) {
			_, c := webhookPod(t, r)
			require.Len(t, c.Env, 2)
			assert.Equal(t, corev1.EnvVar{Name: "GOMEMLIMIT", Value: "100MiB"}, c.Env[0])
			assert.Equal(t, "spec.nodeName", c.Env[1].ValueFrom.FieldRef.FieldPath)
		}},
		{"extraVolumes and extraVolumeMounts after the chart's own", []string{`json:extraVolumes=[{"name":"scratch","emptyDir":{}}]`, `json:extraVolumeMounts=[{"name":"scratch","mountPath":"/tmp"}]`}, func(t *testing.T, r *chartrender.Rendered) {
			pod, c := webhookPod(t, r)
			require.Len(t, pod.Volumes, 2)
			assert.Equal(t, "tls", pod.Volumes[0].Name)
			assert.Equal(t, "scratch", pod.Volumes[1].Name)
			assert.NotNil(t, pod.Volumes[1].EmptyDir)
			require.Len(t, c.VolumeMounts, 2)
			assert.Equal(t, "/etc/elastic-training-webhook/tls", c.VolumeMounts[0].MountPath)
			assert.Equal(t, corev1.VolumeMount{Name: "scratch", MountPath: "/tmp"}, c.VolumeMounts[1])
		}},
		{"priorityClassName kept", []string{"priorityClassName=system-cluster-critical"}, func(t *testing.T, r *chartrender.Rendered) {
			pod, _ := webhookPod(t, r)
			assert.Equal(t, "system-cluster-critical", pod.PriorityClassName)
		}},
		{"serviceAccount name and annotations", []string{"serviceAccount.name=webhook-sa", "serviceAccount.annotations.example\\.com/owner=platform"}, func(t *testing.T, r *chartrender.Rendered) {
			sa := r.Find("ServiceAccount", "webhook-sa")
			require.NotNil(t, sa)
			assert.Equal(t, map[string]string{"example.com/owner": "platform"}, sa.GetAnnotations())
			pod, _ := webhookPod(t, r)
			assert.Equal(t, "webhook-sa", pod.ServiceAccountName)
			assert.True(t, *pod.AutomountServiceAccountToken, "events.enabled")
			binding := r.Find("ClusterRoleBinding", "elastic-training-webhook-events")
			require.NotNil(t, binding)
			assert.Contains(t, fmt.Sprint(binding.Object["subjects"]), "webhook-sa")
		}},
		{"serviceAccount not created, existing one named", []string{"serviceAccount.create=false", "serviceAccount.name=shared"}, func(t *testing.T, r *chartrender.Rendered) {
			assert.Nil(t, r.Find("ServiceAccount", ""))
			pod, _ := webhookPod(t, r)
			assert.Equal(t, "shared", pod.ServiceAccountName)
			assert.True(t, *pod.AutomountServiceAccountToken, "a token for Events (events.enabled), in whichever ServiceAccount")
		}},
		{"serviceAccount not created, none named: default", []string{"serviceAccount.create=false"}, func(t *testing.T, r *chartrender.Rendered) {
			assert.Nil(t, r.Find("ServiceAccount", ""))
			pod, _ := webhookPod(t, r)
			assert.Equal(t, "default", pod.ServiceAccountName)
		}},
		{"podSecurityContext merged into the restricted default", []string{"podSecurityContext.runAsUser=10001", "podSecurityContext.fsGroup=10001"}, func(t *testing.T, r *chartrender.Rendered) {
			pod, _ := webhookPod(t, r)
			assert.Equal(t, int64(10001), *pod.SecurityContext.RunAsUser)
			assert.Equal(t, int64(10001), *pod.SecurityContext.FSGroup)
			assert.Equal(t, int64(65532), *pod.SecurityContext.RunAsGroup)
			assertRestricted(t, pod)
		}},
		{"podSecurityContext keys dropped with null (OpenShift picks the UID)", []string{"podSecurityContext.runAsUser=null", "podSecurityContext.runAsGroup=null"}, func(t *testing.T, r *chartrender.Rendered) {
			pod, _ := webhookPod(t, r)
			assert.Nil(t, pod.SecurityContext.RunAsUser)
			assert.Nil(t, pod.SecurityContext.RunAsGroup)
			assertRestricted(t, pod)
		}},
		{"securityContext merged into the restricted default", []string{"securityContext.readOnlyRootFilesystem=false", "securityContext.runAsUser=10002"}, func(t *testing.T, r *chartrender.Rendered) {
			pod, c := webhookPod(t, r)
			assert.False(t, *c.SecurityContext.ReadOnlyRootFilesystem)
			assert.Equal(t, int64(10002), *c.SecurityContext.RunAsUser)
			assertRestricted(t, pod)
		}},
		{"ServiceMonitor when enabled", []string{"metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.interval=15s", "metrics.serviceMonitor.labels.release=kube-prometheus-stack"}, func(t *testing.T, r *chartrender.Rendered) {
			sm := r.Find("ServiceMonitor", "elastic-training-webhook")
			require.NotNil(t, sm)
			assert.Equal(t, "monitoring.coreos.com/v1", sm.GetAPIVersion())
			assert.Equal(t, webhookNS, sm.GetNamespace())
			assert.Equal(t, "kube-prometheus-stack", sm.GetLabels()["release"])
			assert.Equal(t, "admission-webhook", sm.GetLabels()["app.kubernetes.io/component"], "the chart's labels too")
			eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
			require.Len(t, eps, 1)
			ep := eps[0].(map[string]any)
			assert.Equal(t, "metrics", ep["port"])
			assert.Equal(t, "/metrics", ep["path"])
			assert.Equal(t, "15s", ep["interval"])
			ns, _, _ := unstructured.NestedStringSlice(sm.Object, "spec", "namespaceSelector", "matchNames")
			assert.Equal(t, []string{webhookNS}, ns)
			// It selects the Service, whose port named metrics it scrapes.
			sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
			require.NotEmpty(t, sel)
			svc := convert[corev1.Service](t, r.Find("Service", "elastic-training-webhook"))
			for k, v := range sel {
				assert.Equal(t, v, svc.Labels[k], "Service label %s", k)
			}
			assert.True(t, slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "metrics" }))
			assert.Contains(t, r.Notes, "ServiceMonitor elastic-training-webhook")
		}},
		{"PrometheusRule and the Grafana dashboard when enabled", []string{"metrics.prometheusRule.enabled=true", "metrics.prometheusRule.labels.release=kps", "grafanaDashboard.enabled=true", "grafanaDashboard.namespace=monitoring"}, func(t *testing.T, r *chartrender.Rendered) {
			rule := r.Find("PrometheusRule", "elastic-training-webhook")
			require.NotNil(t, rule)
			assert.Equal(t, "kps", rule.GetLabels()["release"])
			groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
			require.Len(t, groups, 1)
			assert.Contains(t, fmt.Sprint(groups), "ElasticTrainingWebhookErrors")
			cm := convert[corev1.ConfigMap](t, r.Find("ConfigMap", "elastic-training-webhook-dashboard"))
			assert.Equal(t, "monitoring", cm.Namespace)
			assert.Equal(t, "1", cm.Labels["grafana_dashboard"], "what kube-prometheus-stack's Grafana sidecar selects")
			file, err := os.ReadFile(filepath.Join(webhookChartDir, "dashboards", "elastic-training.json"))
			require.NoError(t, err)
			assert.JSONEq(t, string(file), cm.Data["elastic-training.json"], "the chart's dashboard file, as it is")
		}},
		{"no PrometheusRule or dashboard by default", nil, func(t *testing.T, r *chartrender.Rendered) {
			assert.Nil(t, r.Find("PrometheusRule", ""))
			assert.Nil(t, r.Find("ConfigMap", "elastic-training-webhook-dashboard"))
		}},
		{"ServiceMonitor with the Prometheus' default interval", []string{"metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.interval="}, func(t *testing.T, r *chartrender.Rendered) {
			eps, _, _ := unstructured.NestedSlice(r.Find("ServiceMonitor", "").Object, "spec", "endpoints")
			require.Len(t, eps, 1)
			assert.NotContains(t, eps[0].(map[string]any), "interval")
		}},
		{"ServiceMonitor off by default", nil, func(t *testing.T, r *chartrender.Rendered) {
			assert.Nil(t, r.Find("ServiceMonitor", ""))
		}},
		{"global accepted, any content", []string{`json:global={"imageRegistry":"registry.example.com","imagePullSecrets":[{"name":"x"}],"anything":{"nested":[1,2]}}`}, func(t *testing.T, r *chartrender.Rendered) {
			require.NotNil(t, r.Find("Deployment", "elastic-training-webhook"))
		}},
		{"nameOverride in names and the name label", []string{"nameOverride=admission"}, func(t *testing.T, r *chartrender.Rendered) {
			dep := r.Find("Deployment", "elastic-training-webhook-admission")
			require.NotNil(t, dep)
			assert.Equal(t, "admission", dep.GetLabels()["app.kubernetes.io/name"])
			assert.Equal(t, "elastic-training-webhook-0.2.0", dep.GetLabels()["helm.sh/chart"])
		}},
		{"one replica: no PodDisruptionBudget, NOTES says why", []string{"replicaCount=1"}, func(t *testing.T, r *chartrender.Rendered) {
			assert.Nil(t, r.Find("PodDisruptionBudget", ""))
			assert.Contains(t, r.Notes, "PodDisruptionBudget: left out with a single replica")
		}},
		{"one replica, PDB disabled: nothing to say", []string{"replicaCount=1", "podDisruptionBudget.enabled=false"}, func(t *testing.T, r *chartrender.Rendered) {
			assert.Nil(t, r.Find("PodDisruptionBudget", ""))
			assert.NotContains(t, r.Notes, "PodDisruptionBudget")
		}},
		{"three replicas, minAvailable 2", []string{"replicaCount=3", "podDisruptionBudget.minAvailable=2"}, func(t *testing.T, r *chartrender.Rendered) {
			pdb := r.Find("PodDisruptionBudget", "elastic-training-webhook")
			require.NotNil(t, pdb)
			v, _, _ := unstructured.NestedFieldNoCopy(pdb.Object, "spec", "minAvailable")
			assert.EqualValues(t, 2, v)
		}},
		{"two replicas, minAvailable 50%", []string{"podDisruptionBudget.minAvailable=50%"}, func(t *testing.T, r *chartrender.Rendered) {
			require.NotNil(t, r.Find("PodDisruptionBudget", ""))
		}},
		{"metrics off: its port is not bound, so it may equal another", []string{"metrics.enabled=false", "metrics.port=8081"}, func(t *testing.T, r *chartrender.Rendered) {
			_, c := webhookPod(t, r)
			assert.Contains(t, c.Args, "--metrics-addr=0")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			r, err := renderWebhookKept(t, webhookSets(t, tc.sets...))
			require.NoError(t, err, "--set %v", tc.sets)
			tc.check(t, r)
		})
	}
}

// TestWebhookChartLogLevels: every level cmd/webhook's --zap-log-level (controller-runtime's zap flag: debug,
// info, error, panic in any case, or strconv.Atoi > 0) accepts renders as given.
func TestWebhookChartLogLevels(t *testing.T) {
	for _, tc := range []struct{ set, want string }{
		{"logLevel=debug", "debug"},
		{"logLevel=INFO", "INFO"},
		{"logLevel=Error", "Error"},
		{"logLevel=panic", "panic"},
		{"logLevel=1", "1"},                  // --set: int64
		{"json:logLevel=5", "5"},             // values file: float64
		{"json:logLevel=1000000", "1000000"}, // not 1e+06
		{`json:logLevel="+3"`, "+3"},
		{`json:logLevel="007"`, "007"},
		{`json:logLevel="9223372036854775807"`, "9223372036854775807"}, // the largest strconv.Atoi takes
	} {
		t.Run(tc.set, func(t *testing.T) {
			r, err := renderWebhookKept(t, webhookSets(t, tc.set))
			require.NoError(t, err)
			_, c := webhookPod(t, r)
			assert.Contains(t, c.Args, "--zap-log-level="+tc.want)
		})
	}
}

// TestWebhookChartFullnameOverride: every object and every reference between them follows fullnameOverride.
func TestWebhookChartFullnameOverride(t *testing.T) {
	for _, source := range []string{"helm", "rotator", "cert-manager"} {
		certManager := source == "cert-manager"
		t.Run(source, func(t *testing.T) {
			base := []string{fmt.Sprintf("tls.certManager.enabled=%v", certManager), fmt.Sprintf("tls.rotator.enabled=%v", source == "rotator"), "metrics.serviceMonitor.enabled=true"}
			def := renderWebhook(t, webhookSets(t, base...))
			r := renderWebhook(t, webhookSets(t, append(base, "fullnameOverride=et-hook")...))

			// Same objects, each renamed: elastic-training-webhook -> et-hook.
			var want, got []string
			for _, o := range def.Objects {
				want = append(want, o.Kind+"/"+strings.Replace(o.Name, "elastic-training-webhook", "et-hook", 1))
			}
			for _, o := range r.Objects {
				got = append(got, o.Key())
				labels := o.Obj["metadata"].(map[string]any)["labels"].(map[string]any)
				if o.Kind == "Pod" { // the helm test pod: without the Service's selector labels, so never an endpoint
					assert.NotContains(t, labels, "app.kubernetes.io/name", o.Key())
					continue
				}
				assert.Equal(t, "elastic-training-webhook", labels["app.kubernetes.io/name"], o.Key())
			}
			assert.Equal(t, want, got)
			assert.GreaterOrEqual(t, len(got), 7)

			// References.
			pod, _ := webhookPod(t, r)
			assert.Equal(t, "et-hook", pod.ServiceAccountName)
			// Serving sidecars call the Service by the name the serving certificate covers (checked below per source).
			assert.Contains(t, pod.Containers[0].Args, "--pod-replacement-url=https://et-hook."+webhookNS+".svc:443/replace-pod")
			if source == "rotator" {
				assert.Contains(t, strings.Join(pod.Containers[0].Args, " "), "--cert-dns-names=et-hook."+webhookNS+".svc,")
			}
			repl := convert[rbacv1.ClusterRoleBinding](t, r.Find("ClusterRoleBinding", "et-hook-pod-replacement"))
			assert.Equal(t, "et-hook-pod-replacement", repl.RoleRef.Name)
			assert.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Name: "et-hook", Namespace: webhookNS}}, repl.Subjects)
			if source == "rotator" {
				assert.Contains(t, pod.Containers[0].Args, "--cert-rotation-secret="+webhookNS+"/et-hook-serving-cert")
				assert.Contains(t, pod.Containers[0].Args, "--cert-rotation-webhook=et-hook")
				assert.NotNil(t, r.Find("Secret", "et-hook-serving-cert"))
				assert.Equal(t, []string{"et-hook-serving-cert"}, convert[rbacv1.Role](t, r.Find("Role", "et-hook-cert-rotation")).Rules[1].ResourceNames)
				assert.Equal(t, []string{"et-hook"}, convert[rbacv1.ClusterRole](t, r.Find("ClusterRole", "et-hook-cert-rotation")).Rules[1].ResourceNames)
			} else {
				assert.Equal(t, "et-hook-tls", pod.Volumes[0].Secret.SecretName)
			}
			wh := convert[admissionregistrationv1.MutatingWebhookConfiguration](t, r.Find("MutatingWebhookConfiguration", "et-hook")).Webhooks[0]
			assert.Equal(t, "et-hook", wh.ClientConfig.Service.Name)
			assert.Contains(t, r.Notes, "deploy/et-hook")
			if certManager {
				crt := r.Find("Certificate", "et-hook")
				require.NotNil(t, crt)
				secret, _, _ := unstructured.NestedString(crt.Object, "spec", "secretName")
				assert.Equal(t, "et-hook-tls", secret)
				names, _, _ := unstructured.NestedStringSlice(crt.Object, "spec", "dnsNames")
				assert.Contains(t, names, "et-hook."+webhookNS+".svc")
				assert.Equal(t, webhookNS+"/et-hook", r.Find("MutatingWebhookConfiguration", "").GetAnnotations()["cert-manager.io/inject-ca-from"])
			} else if source == "helm" {
				data := r.Find("Secret", "et-hook-tls").Object["data"].(map[string]any)
				c := cert(t, data["tls.crt"].(string))
				assert.Contains(t, c.DNSNames, "et-hook."+webhookNS+".svc")
			}
		})
	}

	// The default names are today's: the release name when it holds the chart name, else <release>-<chart>.
	r, err := chartrender.RenderDir(webhookChartDir, nil, chartrender.Options{Release: "hooks", Namespace: webhookNS})
	require.NoError(t, err)
	require.NotNil(t, r.Find("Deployment", "hooks-elastic-training-webhook"))
}

// TestWebhookChartAsSubchart: a parent chart that depends on this one passes it global values; the schema
// (additionalProperties: false) accepts them.
func TestWebhookChartAsSubchart(t *testing.T) {
	sub, err := loader.Load(webhookChartDir)
	require.NoError(t, err)
	parent := &chart.Chart{
		Metadata: &chart.Metadata{APIVersion: chart.APIVersionV2, Name: "platform", Version: "1.0.0"},
		Values:   map[string]any{"global": map[string]any{"imageRegistry": "registry.example.com"}},
	}
	parent.AddDependency(sub)
	r, err := chartrender.Render(parent, map[string]any{"elastic-training-webhook": map[string]any{"replicaCount": 3}},
		chartrender.Options{Release: "platform", Namespace: webhookNS})
	require.NoError(t, err)
	dep := convert[appsv1.Deployment](t, r.Find("Deployment", "platform-elastic-training-webhook"))
	assert.Equal(t, int32(3), *dep.Spec.Replicas)
}

// TestWebhookChartRefuses: values that would crash the webhook or block the cluster fail at render time with a
// message naming the value and what to set.
func TestWebhookChartRefuses(t *testing.T) {
	const ports = "set one of them to a free port (defaults: webhook.port=9443, healthPort=8081, metrics.port=8080)"
	const levels = "accepts debug, info, error or panic (any case) or an integer verbosity >= 1"
	const pdb = "keeps every replica up, so no node drain could evict one; raise replicaCount, lower podDisruptionBudget.minAvailable (e.g. 1), or set podDisruptionBudget.enabled=false"
	cases := []struct {
		desc string
		sets []string
		want string
	}{
		{"metrics port = health port", []string{"metrics.port=8081"}, "healthPort and metrics.port are both 8081: the webhook listens on each itself and would crash at start with \"address already in use\"; " + ports},
		{"metrics port = health port (values file)", []string{"json:metrics.port=8081"}, "healthPort and metrics.port are both 8081"},
		{"webhook port = health port", []string{"webhook.port=8081"}, "healthPort and webhook.port are both 8081"},
		{"metrics port = webhook port", []string{"metrics.port=9443"}, "metrics.port and webhook.port are both 9443"},
		{"health port = webhook port, metrics off", []string{"metrics.enabled=false", "healthPort=9443"}, "healthPort and webhook.port are both 9443"},
		{"metrics port = the Service's https port", []string{"metrics.port=443"}, "metrics.port is 443, the Service's https port"},
		{"logLevel warn", []string{"logLevel=warn"}, "logLevel warn: the webhook's --zap-log-level " + levels},
		{"logLevel verbose", []string{"logLevel=verbose"}, "logLevel verbose: the webhook's --zap-log-level " + levels},
		{"logLevel empty", []string{"logLevel="}, "logLevel : the webhook's --zap-log-level " + levels},
		{"logLevel 0 as a string", []string{`json:logLevel="0"`}, "logLevel 0: the webhook's --zap-log-level " + levels},
		{"logLevel negative as a string", []string{`json:logLevel="-2"`}, "logLevel -2: the webhook's --zap-log-level"},
		{"logLevel a fraction as a string", []string{`json:logLevel="1.5"`}, "logLevel 1.5: the webhook's --zap-log-level"},
		{"logLevel beyond strconv.Atoi", []string{`json:logLevel="9223372036854775808"`}, "logLevel 9223372036854775808: the webhook's --zap-log-level"},
		{"logLevel 0 (schema)", []string{"logLevel=0"}, "at '/logLevel': minimum: got 0, want 1"},
		{"logLevel a fraction (schema)", []string{"json:logLevel=2.5"}, "at '/logLevel'"},
		{"minAvailable 2 with the default 2 replicas", []string{"podDisruptionBudget.minAvailable=2"}, "podDisruptionBudget.minAvailable 2 with replicaCount 2 " + pdb},
		{"minAvailable = replicaCount", []string{"replicaCount=3", "podDisruptionBudget.minAvailable=3"}, "podDisruptionBudget.minAvailable 3 with replicaCount 3 " + pdb},
		{"minAvailable 100%", []string{"podDisruptionBudget.minAvailable=100%"}, "podDisruptionBudget.minAvailable 100% with replicaCount 2 " + pdb},
		{"minAvailable 51% of 2 rounds up to 2", []string{"podDisruptionBudget.minAvailable=51%"}, "podDisruptionBudget.minAvailable 51% with replicaCount 2"},
		{"minAvailable not a percentage (schema)", []string{`json:podDisruptionBudget.minAvailable="1"`}, "at '/podDisruptionBudget/minAvailable'"},
		{"ServiceMonitor without metrics", []string{"metrics.enabled=false", "metrics.serviceMonitor.enabled=true"}, "metrics.serviceMonitor.enabled needs metrics.enabled=true"},
		{"ServiceMonitor interval not a duration (schema)", []string{"metrics.serviceMonitor.interval=30 seconds"}, "at '/metrics/serviceMonitor/interval'"},
		{"ServiceMonitor typo (schema)", []string{"metrics.serviceMonitor.enable=true"}, "additional properties 'enable' not allowed"},
		{"extra volume named tls", []string{`json:extraVolumes=[{"name":"tls","emptyDir":{}}]`}, `extraVolumes: the volume name "tls" is the chart's own`},
		{"extra mount over the certificate", []string{`json:extraVolumeMounts=[{"name":"x","mountPath":"/etc/elastic-training-webhook/tls/"}]`}, "extraVolumeMounts: /etc/elastic-training-webhook/tls is where the chart mounts the serving certificate"},
		{"extra mount without mountPath (schema)", []string{`json:extraVolumeMounts=[{"name":"x"}]`}, "missing property 'mountPath'"},
		{"imagePullSecrets as plain names (schema)", []string{"imagePullSecrets={regcred}"}, "at '/imagePullSecrets/0'"},
		{"extraArgs not strings (schema)", []string{`json:extraArgs=[{"a":1}]`}, "at '/extraArgs/0'"},
		{"serviceAccount typo (schema)", []string{"serviceAccount.enabled=true"}, "additional properties 'enabled' not allowed"},
		{"fullnameOverride not a DNS label (schema)", []string{"fullnameOverride=Webhook"}, "at '/fullnameOverride'"},
		{"podReplacement.enabled not a bool (schema)", []string{`json:podReplacement.enabled="yes"`}, "at '/podReplacement/enabled'"},
		{"podReplacement typo (schema)", []string{"podReplacement.enable=true"}, "additional properties 'enable' not allowed"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := renderWebhookKept(t, webhookSets(t, tc.sets...))
			require.Error(t, err, "--set %v accepted", tc.sets)
			assert.Contains(t, err.Error(), tc.want)
		})
	}

	t.Run("release name not a DNS-1035 label", func(t *testing.T) {
		_, err := chartrender.RenderDir(webhookChartDir, nil, chartrender.Options{Release: "1hooks", Namespace: webhookNS})
		require.Error(t, err)
		assert.Contains(t, err.Error(), `name "1hooks-elastic-training-webhook" (the release name, or fullnameOverride) must be a DNS-1035 label`)
	})
}

// TestWebhookChartTemplateChecksWithoutSchema: with the schema skipped (helm --skip-schema-validation) the
// templates still refuse a log level the webhook would not start with.
func TestWebhookChartTemplateChecksWithoutSchema(t *testing.T) {
	ch, err := loader.Load(webhookChartDir)
	require.NoError(t, err)
	ch.Schema = nil
	for _, set := range []string{"logLevel=0", "logLevel=-3", "json:logLevel=2.5", "json:logLevel=0"} {
		t.Run(set, func(t *testing.T) {
			_, err := chartrender.Render(ch, webhookSets(t, set), chartrender.Options{Release: webhookRelease, Namespace: webhookNS})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "the webhook's --zap-log-level accepts debug, info, error or panic")
		})
	}
}

// TestWebhookChartCIValues renders, lints (strict) and strictly decodes the chart with its defaults and with every
// charts/elastic-training-webhook/ci/*-values.yaml.
func TestWebhookChartCIValues(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(webhookChartDir, "ci", "*-values.yaml"))
	require.NotEmpty(t, files)
	for _, file := range append([]string{""}, files...) {
		name := "defaults"
		vals := map[string]any{}
		if file != "" {
			name = filepath.Base(file)
			vals = chartrender.ReadValues(t, file)
		}
		t.Run(name, func(t *testing.T) {
			lintStrict(t, webhookChartDir, webhookNS, vals)

			r, err := renderWebhookChart(vals, nil)
			require.NoError(t, err)
			pod, _ := webhookPod(t, r)
			assertRestricted(t, pod)
			// Kinds outside client-go's scheme (cert-manager, Prometheus Operator) are checked by the tests above.
			other := map[string]bool{"cert-manager.io/v1": true, "monitoring.coreos.com/v1": true}
			for _, o := range r.Objects {
				apiVersion, _ := o.Obj["apiVersion"].(string)
				if other[apiVersion] {
					continue
				}
				decodeStrictly(t, o)
			}
		})
	}
}

// TestWebhookChartSchemaDescribes: the values added for cluster admins used to other charts carry a description in
// values.schema.json (editors show it; values.yaml's `# --` comments feed the README).
func TestWebhookChartSchemaDescribes(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(webhookChartDir, "values.schema.json"))
	require.NoError(t, err)
	var root map[string]any
	require.NoError(t, json.Unmarshal(raw, &root))
	for _, path := range []string{
		"global", "nameOverride", "fullnameOverride", "imagePullSecrets",
		"serviceAccount", "serviceAccount.create", "serviceAccount.name", "serviceAccount.annotations",
		"podSecurityContext", "securityContext", "extraArgs", "extraEnv", "extraVolumes", "extraVolumeMounts",
		"priorityClassName", "logLevel", "podDisruptionBudget.minAvailable",
		"metrics.serviceMonitor", "metrics.serviceMonitor.enabled", "metrics.serviceMonitor.interval", "metrics.serviceMonitor.labels",
		"podReplacement", "podReplacement.enabled",
	} {
		node := root
		for _, key := range strings.Split(path, ".") {
			props, _ := node["properties"].(map[string]any)
			node, _ = props[key].(map[string]any)
			require.NotNil(t, node, "values.schema.json has no property %s", path)
		}
		assert.NotEmpty(t, node["description"], "values.schema.json: %s has no description", path)
	}
}

// TestWebhookChartHelmTest: the test pod runs `webhook check` in the webhook's image against the Service, trusting
// only the TLS Secret's ca.crt (the key is not mounted), with the webhook's restricted security contexts; with the
// chart's own certificates and with cert-manager's.
func TestWebhookChartHelmTest(t *testing.T) {
	for _, certManager := range []bool{false, true} {
		t.Run(fmt.Sprintf("certManager=%v", certManager), func(t *testing.T) {
			r := renderWebhook(t, webhookSets(t, fmt.Sprintf("tls.certManager.enabled=%v", certManager)))
			u := r.Find("Pod", "elastic-training-webhook-test")
			require.NotNil(t, u, "no test pod")
			var pod corev1.Pod
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pod))
			assert.Equal(t, "test", pod.Annotations["helm.sh/hook"])
			c := pod.Spec.Containers[0]
			assert.Equal(t, []string{"check", "--url=https://elastic-training-webhook." + webhookNS + ".svc:443/mutate-pods",
				"--ca-file=/etc/elastic-training-webhook/ca/ca.crt", "--timeout=2m"}, c.Args)
			_, webhook := webhookPod(t, r)
			assert.Equal(t, webhook.Image, c.Image)
			assert.Equal(t, webhook.SecurityContext, c.SecurityContext)
			require.Len(t, pod.Spec.Volumes, 1)
			secret := "elastic-training-webhook-tls"
			if !certManager {
				secret = "elastic-training-webhook-serving-cert" // the rotator's, by default
			}
			assert.Equal(t, secret, pod.Spec.Volumes[0].Secret.SecretName)
			assert.Equal(t, []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}, pod.Spec.Volumes[0].Secret.Items)
			assert.False(t, *pod.Spec.AutomountServiceAccountToken)
		})
	}
	r := renderWebhook(t, webhookSets(t, "tests.enabled=false"))
	assert.Nil(t, r.Find("Pod", "elastic-training-webhook-test"))
}

// hostNetwork: the webhook pods listen on their node's address at webhook.port (the control plane reaches nodes
// where it cannot reach the pod network), still resolve cluster names, stay restricted, and the Service targets
// the same port; two replicas never share a node (the scheduler's host-port check and the chart's spread).
func TestWebhookChartHostNetwork(t *testing.T) {
	r := renderWebhook(t, map[string]any{"hostNetwork": true, "webhook": map[string]any{"port": 10260}})
	dep := convert[appsv1.Deployment](t, r.Find("Deployment", webhookRelease))
	spec := dep.Spec.Template.Spec
	assert.True(t, spec.HostNetwork)
	assert.Equal(t, corev1.DNSClusterFirstWithHostNet, spec.DNSPolicy)
	c := spec.Containers[0]
	assert.Contains(t, c.Args, "--port=10260")
	assert.Equal(t, int32(10260), c.Ports[0].ContainerPort)
	require.NotNil(t, c.SecurityContext)
	assert.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop, "no capability: the port is above 1023")
	assert.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	svc := convert[corev1.Service](t, r.Find("Service", webhookRelease))
	assert.Equal(t, "https", svc.Spec.Ports[0].TargetPort.String())
	assert.Equal(t, corev1.UnsatisfiableConstraintAction("DoNotSchedule"), spec.TopologySpreadConstraints[0].WhenUnsatisfiable)

	def := convert[appsv1.Deployment](t, renderWebhook(t, nil).Find("Deployment", webhookRelease))
	assert.False(t, def.Spec.Template.Spec.HostNetwork, "pod network by default")
	assert.Contains(t, def.Spec.Template.Spec.Containers[0].Args, "--version=0.2.0", "the webhook names its release when it denies a newer job chart's pod")
}

// TestJobInstallerRights: the webhook chart gives namespace admins and editors what a job's objects need beyond the
// built-in roles (writing EndpointSlices, Volcano PodGroups and the Prometheus Operator's PodMonitors and
// PrometheusRules, aggregated into admin and edit) and lets the
// authenticated read StorageClasses (the persistence check's lookup); both can be turned off. Proven on the cluster
// by test/e2e/chart's TestServerSideDryRun (as a namespace admin) and test/e2e/workloads' chart-defaults job.
func TestJobInstallerRights(t *testing.T) {
	name := "elastic-training-webhook"
	r := renderWebhook(t, nil)
	role := convert[rbacv1.ClusterRole](t, r.Find("ClusterRole", name+"-job-installer"))
	assert.Equal(t, "true", role.Labels["rbac.authorization.k8s.io/aggregate-to-admin"])
	assert.Equal(t, "true", role.Labels["rbac.authorization.k8s.io/aggregate-to-edit"])
	require.Len(t, role.Rules, 3)
	assert.Equal(t, []string{"discovery.k8s.io"}, role.Rules[0].APIGroups)
	assert.Equal(t, []string{"endpointslices"}, role.Rules[0].Resources)
	assert.Contains(t, role.Rules[0].Verbs, "create")
	assert.Contains(t, role.Rules[0].Verbs, "patch")
	assert.Equal(t, []string{"podgroups"}, role.Rules[1].Resources)
	assert.Equal(t, []string{"monitoring.coreos.com"}, role.Rules[2].APIGroups)
	assert.Equal(t, []string{"podmonitors", "prometheusrules"}, role.Rules[2].Resources, "the job chart's monitoring values")
	reader := convert[rbacv1.ClusterRole](t, r.Find("ClusterRole", name+"-storageclass-reader"))
	assert.Equal(t, []rbacv1.PolicyRule{{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"storageclasses"}, Verbs: []string{"get", "list"}}}, reader.Rules)
	binding := convert[rbacv1.ClusterRoleBinding](t, r.Find("ClusterRoleBinding", name+"-storageclass-reader"))
	assert.Equal(t, []rbacv1.Subject{{Kind: "Group", APIGroup: "rbac.authorization.k8s.io", Name: "system:authenticated"}}, binding.Subjects)

	r = renderWebhook(t, map[string]any{"jobInstallers": map[string]any{"aggregateToNamespaceRoles": false, "storageClassReaders": []any{}}})
	role = convert[rbacv1.ClusterRole](t, r.Find("ClusterRole", name+"-job-installer"))
	assert.NotContains(t, role.Labels, "rbac.authorization.k8s.io/aggregate-to-admin", "bound by the cluster admin instead")
	assert.Nil(t, r.Find("ClusterRoleBinding", name+"-storageclass-reader"))
}

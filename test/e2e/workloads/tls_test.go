package workloads

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/internal/testcert"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

// TestElasticPyTorchTLS runs the elastic PyTorch job with rendezvous TLS (`rendezvous.tls.secretName`) on the
// real cluster: the webhook mounts the Secret, the serving sidecar requires client certificates, the join
// sidecars and torchrun present the Secret's one certificate, the job trains at world 2, scales to 3 and back
// to 2 (the preStop script leaves over https), and `helm test` lists the members through the sidecar's client.
func TestElasticPyTorchTLS(t *testing.T) {
	c := framework.Get(t)
	installWebhook(t, c)
	ns := c.Namespace(t)
	const job, secret = "secure", "secure-rdzv-tls"
	svc := naming.RendezvousService(job)
	pair, err := testcert.NewServerClient(svc, svc+"."+ns+".svc", svc+"."+ns+".svc."+naming.DefaultClusterDomain)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Client.CoreV1().Secrets(ns).Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secret},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{constants.TLSCertName: pair.Cert, constants.TLSKeyName: pair.Key, constants.TLSCAName: pair.CA},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v := jobValues(t, c, pytorchValues, trainScript)
	set(v, "args", []any{"--steps=100000", "--step-seconds=0.5"})
	set(v, "rendezvous.backend", constants.BackendEtcdV2) // c10d, the default, has no TLS
	set(v, "rendezvous.tls.secretName", secret)
	sel := groupSelector(job, "worker")

	c.HelmInstall(t, ns, job, c.RepoPath(jobChart), v)
	waitWorld(t, c, ns, sel, 2, 1, 3*time.Minute)
	pods, err := livePods(t.Context(), c, ns, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		for _, ct := range p.Spec.Containers {
			if ct.Name != trainer {
				continue
			}
			for _, e := range ct.Env {
				if e.Name == "PET_RDZV_CONF" && !strings.Contains(e.Value, "protocol=https") {
					t.Errorf("%s: PET_RDZV_CONF=%q, want protocol=https", p.Name, e.Value)
				}
			}
		}
	}
	rel := c.HelmTest(t, ns, job, 2*time.Minute)
	t.Logf("helm test %s passed (%d hooks)", rel.Name, len(rel.Hooks))

	for _, n := range []int{3, 2} {
		c.HelmUpgrade(t, ns, job, c.RepoPath(jobChart), map[string]any{"workers": map[string]any{"replicas": n}}, framework.ReuseValues())
		d := waitWorld(t, c, ns, sel, n, 1, 2*time.Minute)
		t.Logf("with TLS: helm upgrade --set workers.replicas=%d -> every worker at world %d: %.1fs", n, n, d.Seconds())
	}
	// The serving sidecar says where it listens: https, with client certificates required.
	serving, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: constants.LabelJob + "=" + job + "," + constants.LabelRdzvServer + "=true"})
	if err != nil || len(serving.Items) != 1 {
		t.Fatalf("want one serving pod: %v, err %v", len(serving.Items), err)
	}
	logs := c.PodLogs(t, ns, serving.Items[0].Name, constants.SidecarContainerName)
	if !strings.Contains(logs, "https://") {
		t.Errorf("the serving sidecar's log does not mention an https client URL:\n%s", logs)
	}
	c.HelmUninstall(t, ns, job, 2*time.Minute)
	// The Secret is the user's (this test's), not the chart's: uninstall rightly keeps it.
	if err := c.Client.CoreV1().Secrets(ns).Delete(t.Context(), secret, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEmpty(t, c, ns)
}

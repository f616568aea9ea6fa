package framework

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

// Kueue as the queue tests run it: Kueue's own manager binary (KUEUE_VERSION, built from the module proxy by
// `build.sh kueue`) as a process of this host, with the objects of Kueue's own install (`kubectl kustomize
// config/default` of the module's sources) that a host process needs: the CRDs, the namespace, the webhook
// Secret (Kueue's internal certificate management fills it and puts its CA into the webhook configurations and the
// converting CRDs), the webhook Service without selector and an EndpointSlice to this host, and those webhooks
// that serve Jobs and Kueue's own kinds. The Job webhooks are scoped to namespaces labelled KueueNamespaceLabel:
// they fail closed, and no other test's Jobs should wait on Kueue. Not applied: the Deployment, RBAC (the admin
// kubeconfig), the visibility APIService (its server is off: an unavailable APIService breaks discovery).
const (
	KueueNamespace      = "kueue-system"
	KueueNamespaceLabel = "elastic-training.io/kueue-e2e"
	kueueWebhookService = "kueue-webhook-service"
	kueueWebhookPort    = 9443
	kueueHealthAddr     = "127.0.0.1:18081"
	// KueueQueueLabel names a Job's LocalQueue (what the chart's queue.kueue sets).
	KueueQueueLabel = "kueue.x-k8s.io/queue-name"
)

// kueueConfig is Kueue's Configuration for a host process: no leader election, internal certificates written under
// the run directory, only the batch/job integration, elastic Jobs on (ElasticJobsViaWorkloadSlices is alpha and off
// in v0.17.0), the visibility server off.
const kueueConfig = `apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: ` + KueueNamespace + `
health:
  healthProbeBindAddress: ` + kueueHealthAddr + `
metrics:
  bindAddress: "0"
webhook:
  host: %s
  port: %d
  certDir: %s
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: true
  webhookServiceName: ` + kueueWebhookService + `
  webhookSecretName: kueue-webhook-server-cert
manageJobsWithoutQueueName: false
managedJobsNamespaceSelector:
  matchLabels:
    ` + KueueNamespaceLabel + `: "true"
integrations:
  frameworks: ["batch/job"]
featureGates:
  ElasticJobsViaWorkloadSlices: true
  VisibilityOnDemand: false
`

// StartKueue starts Kueue for the test and stops it when the test ends (its webhooks removed first). It returns
// once Kueue's webhooks answer. Namespaces whose Jobs Kueue may queue carry KueueNamespaceLabel ("true").
func (c *Cluster) StartKueue(t testing.TB) {
	t.Helper()
	ctx := t.Context()
	start := time.Now()
	var out bytes.Buffer
	if err := c.script(&out, "build.sh", "kueue"); err != nil {
		t.Fatalf("build kueue: %v\n%s", err, out.String())
	}
	manifests, err := c.kueueManifests(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(settings["RUN"], "kueue")
	certDir := filepath.Join(dir, "certs")
	if err := os.RemoveAll(certDir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "install.yaml")
	if err := os.WriteFile(file, manifests, 0o600); err != nil {
		t.Fatal(err)
	}
	// Server-side: the Workload CRD is larger than client-side apply's last-applied annotation may be.
	if out, err := c.Kubectl(ctx, "apply", "--server-side", "--force-conflicts", "-f", file); err != nil {
		t.Fatalf("apply Kueue's objects: %v\n%s", err, out)
	}
	cfg := filepath.Join(dir, "config.yaml")
	nodeIP := settings["NODE_IP"]
	if err := os.WriteFile(cfg, fmt.Appendf(nil, kueueConfig, nodeIP, kueueWebhookPort, certDir), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(settings["LOGS"], "kueue.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(c.BinDir, "kueue"), "--config", cfg, "--kubeconfig", c.Kubeconfig, "--zap-log-level=info")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start kueue: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logFile.Close() }()
	t.Cleanup(func() { c.stopKueue(t, cmd, exited, logPath) })

	// Ready once a Job in a labelled namespace is defaulted through Kueue's webhook (the API server reaches it
	// through the Service, over the certificate Kueue made): a dry-run create of a queued Job comes back suspended.
	probe := c.Namespace(t)
	c.LabelKueueNamespace(t, probe)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Labels: map[string]string{KueueQueueLabel: "probe"}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "probe", Image: BusyboxImage}}}}},
	}
	c.WaitFor(t, 3*time.Minute, "Kueue's webhooks (log: "+logPath+")", func(ctx context.Context) (bool, error) {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("kueue exited: %v; last lines of %s:\n%s", err, logPath, lastLines(logPath, 30))
		default:
		}
		if err := c.mountKueueCerts(ctx, certDir); err != nil {
			return false, err
		}
		if err := testenv.CheckHTTP(ctx, "http://"+kueueHealthAddr+"/readyz", http.StatusOK); err != nil {
			return false, err
		}
		got, err := c.Client.BatchV1().Jobs(probe).Create(ctx, job, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, nil //nolint:nilerr // not yet: the webhook is still starting
		}
		return got.Spec.Suspend != nil && *got.Spec.Suspend, nil
	})
	t.Logf("Kueue %s serving in %.1fs (log: %s)", settings["KUEUE_VERSION"], time.Since(start).Seconds(), logPath)
}

// mountKueueCerts does for the host process what the kubelet does for Kueue's pod: it writes the webhook Secret
// that Kueue's certificate rotator filled into Kueue's certificate directory, which the rotator waits for before
// it reports the certificates ready (it only reads them there).
func (c *Cluster) mountKueueCerts(ctx context.Context, certDir string) error {
	if _, err := os.Stat(filepath.Join(certDir, "tls.crt")); err == nil {
		return nil
	}
	sec, err := c.Client.CoreV1().Secrets(KueueNamespace).Get(ctx, "kueue-webhook-server-cert", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if len(sec.Data["tls.crt"]) == 0 || len(sec.Data["tls.key"]) == 0 {
		return errors.New("Kueue has not filled its webhook Secret yet")
	}
	// The key first and the certificate last: the rotator takes the certificate's presence for all of them.
	for _, name := range []string{"tls.key", "ca.crt", "tls.crt"} {
		if err := os.WriteFile(filepath.Join(certDir, name), sec.Data[name], 0o600); err != nil {
			return err
		}
	}
	return nil
}

// LabelKueueNamespace lets Kueue queue the Jobs of ns (KueueNamespaceLabel).
func (c *Cluster) LabelKueueNamespace(t testing.TB, ns string) {
	t.Helper()
	if _, err := c.Kubectl(t.Context(), "label", "namespace", ns, KueueNamespaceLabel+"=true", "--overwrite"); err != nil {
		t.Fatal(err)
	}
}

// stopKueue removes Kueue's webhooks (a Job created while they point at a stopped Kueue would be refused), then
// stops the process: SIGTERM, and SIGKILL if it has not exited within 15 s.
func (c *Cluster) stopKueue(t testing.TB, cmd *exec.Cmd, exited chan error, logPath string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, obj := range []string{"mutatingwebhookconfiguration/kueue-mutating-webhook-configuration", "validatingwebhookconfiguration/kueue-validating-webhook-configuration"} {
		if out, err := c.Kubectl(ctx, "delete", obj, "--ignore-not-found"); err != nil {
			t.Errorf("delete %s: %v %s", obj, err, out)
		}
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		t.Logf("kueue did not stop within 15 s of SIGTERM: killed (log: %s)", logPath)
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
	// Kueue's finalizers (Workloads, queues, flavors) would keep a namespace, and so the next run's sweep, waiting
	// for ever now that nothing removes them.
	for _, kind := range []string{"workloads", "localqueues", "clusterqueues", "resourceflavors"} {
		out, err := c.Kubectl(ctx, "get", kind+".kueue.x-k8s.io", "-A", "-o", `jsonpath={range .items[*]}{.metadata.namespace}{" "}{.metadata.name}{"\n"}{end}`)
		if err != nil {
			t.Errorf("list %s: %v", kind, err)
			continue
		}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			args := []string{"patch", kind + ".kueue.x-k8s.io", f[len(f)-1], "--type=merge", "-p", `{"metadata":{"finalizers":null}}`}
			if len(f) == 2 {
				args = append(args, "-n", f[0])
			}
			if out, err := c.Kubectl(ctx, args...); err != nil {
				t.Errorf("%v %s", err, out)
			}
		}
	}
	if t.Failed() {
		t.Logf("last lines of %s:\n%s", logPath, lastLines(logPath, 60))
	}
}

// kueueManifests renders Kueue's install from the module's sources and keeps what a host process needs (see above).
func (c *Cluster) kueueManifests(ctx context.Context) ([]byte, error) {
	dir, err := moduleDir(ctx, "sigs.k8s.io/kueue@"+settings["KUEUE_VERSION"])
	if err != nil {
		return nil, err
	}
	rendered, err := c.Kubectl(ctx, "kustomize", filepath.Join(dir, "config", "default"))
	if err != nil {
		return nil, fmt.Errorf("render Kueue's install: %w", err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(rendered), 1<<20)
	var keep []map[string]any
	for {
		var o map[string]any
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("Kueue's install: %w", err)
		}
		u := unstructured.Unstructured{Object: o}
		switch u.GetKind() {
		case "CustomResourceDefinition", "Namespace", "Secret":
		case "Service":
			if u.GetName() != kueueWebhookService {
				continue
			}
			unstructured.RemoveNestedField(o, "spec", "selector")
		case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
			if err := scopeKueueWebhooks(o); err != nil {
				return nil, err
			}
		default:
			continue
		}
		keep = append(keep, o)
	}
	keep = append(keep, map[string]any{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata": map[string]any{"name": kueueWebhookService, "namespace": KueueNamespace,
			"labels": map[string]any{"kubernetes.io/service-name": kueueWebhookService}},
		"addressType": "IPv4",
		"endpoints":   []any{map[string]any{"addresses": []any{settings["NODE_IP"]}}},
		"ports":       []any{map[string]any{"port": kueueWebhookPort, "protocol": "TCP"}},
	})
	var b bytes.Buffer
	for _, o := range keep {
		y, err := yaml.Marshal(o)
		if err != nil {
			return nil, err
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	return b.Bytes(), nil
}

// scopeKueueWebhooks keeps the webhooks of Jobs and of Kueue's own kinds, and limits the namespaced ones to
// labelled namespaces.
func scopeKueueWebhooks(o map[string]any) error {
	hooks, _, err := unstructured.NestedSlice(o, "webhooks")
	if err != nil {
		return err
	}
	var kept []any
	for _, h := range hooks {
		w := h.(map[string]any)
		rules, _, _ := unstructured.NestedSlice(w, "rules")
		ours := false
		for _, r := range rules {
			groups, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "apiGroups")
			ours = ours || slices.Contains(groups, "batch") || slices.Contains(groups, "kueue.x-k8s.io")
		}
		if !ours {
			continue
		}
		w["namespaceSelector"] = map[string]any{"matchLabels": map[string]any{KueueNamespaceLabel: "true"}}
		kept = append(kept, w)
	}
	return unstructured.SetNestedSlice(o, kept, "webhooks")
}

// moduleDir downloads a module version through the module proxy (or finds it in the module cache) and returns
// its directory.
func moduleDir(ctx context.Context, modVersion string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", modVersion)
	cmd.Dir = os.TempDir() // outside this module: the version is not one of its requirements
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", modVersion, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %v %s", modVersion, err, m.Error)
	}
	return m.Dir, nil
}

func lastLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

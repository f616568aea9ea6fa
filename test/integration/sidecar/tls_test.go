package sidecar_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/mutate"
	"github.com/elastic-training/elastic-training/internal/testcert"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

// writeCerts writes a CA (ca.crt), a server cert for 127.0.0.1 (server.crt/key) and a client cert (client.crt/key).
func writeCerts(t *testing.T, dir string) {
	t.Helper()
	p, err := testcert.New("127.0.0.1", "localhost")
	require.NoError(t, err)
	require.NoError(t, p.WriteDir(dir))
	for _, f := range []string{"crt", "key"} {
		require.NoError(t, os.Rename(filepath.Join(dir, "tls."+f), filepath.Join(dir, "server."+f)))
	}
}

// Client TLS with client certificates: python-etcd (v2, from the forky root
// filesystem), etcdctl (v3) and join all connect over https; a client without
// a certificate is refused.
func TestTLS(t *testing.T) {
	tr := forky(t)
	certs := t.TempDir()
	writeCerts(t, certs)
	c := func(n string) string { return filepath.Join(certs, n) }
	port := testenv.FreePort(t)
	url := fmt.Sprintf("https://127.0.0.1:%d", port)
	health := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	s := testenv.Start(t, "serve", exec.Command(sidecarBin, "serve", "--data-dir="+filepath.Join(t.TempDir(), "d"),
		"--listen-client-urls="+url, "--advertise-client-urls="+url,
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", testenv.FreePort(t)), "--health-addr="+health,
		"--cert-file="+c("server.crt"), "--key-file="+c("server.key"), "--trusted-ca-file="+c("ca.crt"),
		"--client-cert-auth", "--unsafe-no-fsync"))
	waitReady(t, s, health)

	py := tr.python("-c", fmt.Sprintf(`
import etcd
c = etcd.Client(host="127.0.0.1", port=%d, protocol="https", ca_cert=%q, cert=(%q, %q))
c.write("/tls/k", "v", ttl=30)
print("READ", c.read("/tls/k").value)
`, port, c("ca.crt"), c("client.crt"), c("client.key")))
	out, err := py.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "READ v")

	ctl := exec.Command("/usr/bin/etcdctl", "--endpoints="+url, "--cacert="+c("ca.crt"), "--cert="+c("client.crt"), "--key="+c("client.key"), "put", "/tls/v3", "x")
	ctl.Env = append(os.Environ(), "ETCDCTL_API=3")
	out, err = ctl.CombinedOutput()
	require.NoError(t, err, "%s", out)

	files := t.TempDir()
	startJoin(t, url, "a.job.ns.svc", 2, files, "--cacert="+c("ca.crt"), "--cert="+c("client.crt"), "--key="+c("client.key"))
	testenv.Eventually(t, 10*time.Second, "hostfile over TLS", func() error {
		if got := readFile(filepath.Join(files, "hostfile")); got != "a.job.ns.svc slots=2\n" {
			return fmt.Errorf("hostfile %q", got)
		}
		return nil
	})

	noCert := tr.python("-c", fmt.Sprintf(`
import etcd
c = etcd.Client(host="127.0.0.1", port=%d, protocol="https", ca_cert=%q)
c.read("/tls/k")
`, port, c("ca.crt")))
	out, err = noCert.CombinedOutput()
	require.Error(t, err, "a client without a certificate must be refused: %s", out)
	require.True(t, strings.Contains(string(out), "certificate") || strings.Contains(string(out), "SSL"), "%s", out)
}

// mutatedPod runs the webhook's pure mutation on one of internal/mutate's
// fixture pods, after edit, and returns the sidecar's args and the trainer's env.
func mutatedPod(t *testing.T, fixture string, edit func(p *corev1.Pod)) (args []string, env []corev1.EnvVar) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "internal/mutate/testdata", fixture))
	require.NoError(t, err)
	pod := &corev1.Pod{}
	require.NoError(t, yaml.UnmarshalStrict(b, pod))
	edit(pod)
	cfg := mutate.DefaultConfig()
	cfg.SidecarImage = "example.com/rdzv-sidecar:test"
	res, err := mutate.Mutate(mutate.Input{Pod: pod, Namespace: pod.Namespace, Config: cfg})
	require.NoError(t, err)
	out := res.Pod
	require.Equal(t, constants.SidecarContainerName, out.Spec.InitContainers[0].Name)
	return out.Spec.InitContainers[0].Args, out.Spec.Containers[0].Env
}

// TestWebhookTLSWiring proves that what the webhook computes for a TLS pod
// works against the real programs: `rdzv-sidecar serve` and `join` run with the
// webhook's args, and two real torchrun agents configured only by the
// webhook's PET_* env (one from the serving pod, one from a member) complete a
// rendezvous and an all_reduce over https with client certificates, for both
// etcd backends. Only what a cluster provides is rewritten: the Secret mount
// and emptyDirs become temp dirs, the Service name becomes localhost, the
// fixed ports become free ones, and the serving pod serves without the
// rendezvous Lease (no API server here; the e2e tests hold it).
func TestWebhookTLSWiring(t *testing.T) {
	tr := forky(t)
	for _, backend := range []string{constants.BackendEtcdV2, constants.BackendEtcd} {
		t.Run(backend, func(t *testing.T) {
			certs := t.TempDir()
			p, err := testcert.NewServerClient("localhost", "127.0.0.1")
			require.NoError(t, err)
			require.NoError(t, p.WriteDir(certs))

			runID := "tls-wiring-" + backend
			edit := func(pod *corev1.Pod) {
				pod.Annotations[constants.AnnotationRdzvBackend] = backend
				pod.Annotations[constants.AnnotationRunID] = runID
				// One process per agent and a fixed world of 2 keep the run short on 2 cores.
				pod.Annotations[constants.AnnotationSlots] = "1"
				pod.Annotations[constants.AnnotationMaxNodes] = "2"
			}
			serveArgs, serveEnv := mutatedPod(t, "pytorch-tls-etcd-v2-serves-rdzv.yaml", edit)
			joinArgs, joinEnv := mutatedPod(t, "pytorch-tls-etcd-v2-member.yaml", edit)
			require.Equal(t, "serve", serveArgs[0])
			require.Equal(t, "join", joinArgs[0])
			require.Contains(t, serveArgs, "--client-cert-auth", "the webhook must require client certificates")

			port := testenv.FreePort(t)
			svc := "bert-rdzv.team-a.svc.cluster.local"
			rewrite := func(v, filesDir, dataDir string) string {
				return strings.NewReplacer(
					constants.TLSDir, certs, // before FilesDir: it is a prefix of TLSDir
					constants.FilesDir, filesDir,
					constants.DataDir, dataDir,
					fmt.Sprintf("%s:%d", svc, constants.RdzvClientPort), fmt.Sprintf("localhost:%d", port),
					fmt.Sprintf("0.0.0.0:%d", constants.RdzvClientPort), fmt.Sprintf("127.0.0.1:%d", port),
				).Replace(v)
			}
			// The kubelet probes :2381 over plain HTTP: waitReady does the same on a free port.
			sidecarArgs := func(args []string, filesDir, dataDir string) ([]string, string) {
				health := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
				var out []string
				for _, a := range args {
					if a == fmt.Sprintf("--health-addr=:%d", constants.SidecarHealthPort) {
						a = "--health-addr=" + health
					}
					if strings.HasPrefix(a, "--lease=") {
						continue // the Lease is the API server's, which is not here: the pod serves at once
					}
					out = append(out, rewrite(a, filesDir, dataDir))
				}
				return out, health
			}

			serveFiles, joinFiles := t.TempDir(), t.TempDir()
			sArgs, sHealth := sidecarArgs(serveArgs, serveFiles, filepath.Join(t.TempDir(), "data"))
			// Test-only: a free peer port (etcd's default 2380 may be taken on a shared machine), no fsync.
			sArgs = append(sArgs, fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", testenv.FreePort(t)), "--unsafe-no-fsync")
			s := testenv.Start(t, "serve", exec.Command(sidecarBin, sArgs...))
			waitReady(t, s, sHealth)
			jArgs, jHealth := sidecarArgs(joinArgs, joinFiles, "")
			j := testenv.Start(t, "join", exec.Command(sidecarBin, jArgs...))
			waitReady(t, j, jHealth)

			// Both members registered over TLS: the member's hostfile lists both pods.
			testenv.Eventually(t, 20*time.Second, "hostfile with both members", func() error {
				got := readFile(filepath.Join(joinFiles, constants.HostfileName))
				if !strings.Contains(got, "bert-workers-0.bert.team-a.svc.cluster.local slots=1") ||
					!strings.Contains(got, "bert-workers-3.bert.team-a.svc.cluster.local slots=1") {
					return fmt.Errorf("hostfile %q", got)
				}
				return nil
			})

			// What the chart's helm test runs with TLS (templates/tests/test-rendezvous.yaml): the sidecar's
			// own client lists the members with the Secret's files.
			hosts := exec.Command(sidecarBin, "hosts", "--timeout=10s", fmt.Sprintf("--endpoints=https://localhost:%d", port),
				"--cacert="+filepath.Join(certs, constants.TLSCAName), "--cert="+filepath.Join(certs, constants.TLSCertName),
				"--key="+filepath.Join(certs, constants.TLSKeyName))
			out, err := hosts.CombinedOutput()
			require.NoError(t, err, "%s", out)
			require.Contains(t, string(out), "bert-workers-3.bert.team-a.svc.cluster.local slots=1")

			agentEnv := func(env []corev1.EnvVar) []string {
				var out []string
				for _, e := range env {
					v := rewrite(e.Value, serveFiles, "")
					if e.Name == "PET_LOCAL_ADDR" {
						v = "localhost" // the pod's FQDN resolves only in the cluster (torch >= 2.2 uses it)
					}
					out = append(out, e.Name+"="+v)
				}
				return torchrunEnv(out...)
			}
			for _, e := range serveEnv {
				if e.Name == "PET_RDZV_CONF" {
					t.Logf("PET_RDZV_CONF (webhook) = %s", e.Value)
					require.Contains(t, e.Value, "protocol=https")
				}
			}
			script := trainScript(t)
			a := tr.startAgent(t, "agent-serving-pod", agentEnv(serveEnv), script)
			b := tr.startAgent(t, "agent-member-pod", agentEnv(joinEnv), script)
			requireTwoWorkerResults(t, a, b)
			testenv.Eventually(t, 5*time.Second, "the round in serve's log", func() error {
				if !strings.Contains(s.Output(), "run_id="+runID) {
					return fmt.Errorf("no round for %s in serve's log", runID)
				}
				return nil
			})
		})
	}
}

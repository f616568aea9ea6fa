package webhook_test

// A minimal real control plane for the webhook's integration test: etcd,
// kube-apiserver and kube-controller-manager (Job, StatefulSet and
// ServiceAccount controllers create the pods), on loopback, free ports and a
// temp dir. No kubelet and no scheduler: the test checks the pod objects the
// API server stores. When the shared harness (test/e2e/framework) offers a
// control-plane-only mode, this file can be replaced by framework.Get(t).

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/elastic-training/elastic-training/internal/testcert"
	"github.com/elastic-training/elastic-training/internal/testenv"
)

type controlPlane struct {
	dir    string
	REST   *rest.Config
	Client kubernetes.Interface
	procs  []*exec.Cmd
}

// binDir finds etcd, kube-apiserver and kube-controller-manager: $ET_KUBE_BIN,
// then ~/.cache/elastic-training/bin, then /tmp/k8s-warm/bin.
func binDir() (string, error) {
	var dirs []string
	if d := os.Getenv("ET_KUBE_BIN"); d != "" {
		dirs = append(dirs, d)
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, ".cache", "elastic-training", "bin"))
	}
	dirs = append(dirs, "/tmp/k8s-warm/bin")
	for _, d := range dirs {
		ok := true
		for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
			if _, err := os.Stat(filepath.Join(d, b)); err != nil {
				ok = false
			}
		}
		if ok {
			return d, nil
		}
	}
	return "", fmt.Errorf("etcd, kube-apiserver and kube-controller-manager not found in any of %s: build them with the cluster harness (make cluster-build) or set ET_KUBE_BIN", strings.Join(dirs, ", "))
}

func startControlPlane() (cp *controlPlane, err error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "et-webhook-e2e-")
	if err != nil {
		return nil, err
	}
	cp = &controlPlane{dir: dir}
	defer func() {
		if err != nil {
			cp.stop()
		}
	}()
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = testenv.PickFreePort(); err != nil {
			return cp, err
		}
	}
	etcdPort, peerPort, apiPort := ports[0], ports[1], ports[2]

	// PKI: a serving certificate for 127.0.0.1, a service-account key, an admin token.
	pair, err := testcert.New("127.0.0.1", "localhost")
	if err != nil {
		return cp, err
	}
	if err := pair.WriteDir(dir); err != nil {
		return cp, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return cp, err
	}
	keyDER, _ := x509.MarshalECPrivateKey(saKey)
	pubDER, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	token := fmt.Sprintf("et-%d", time.Now().UnixNano())
	for name, data := range map[string][]byte{
		"sa.key":     pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		"sa.pub":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}),
		"tokens.csv": []byte(token + `,admin,admin,"system:masters"` + "\n"),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return cp, err
		}
	}
	p := func(n string) string { return filepath.Join(dir, n) }

	if err := cp.start(bin, "etcd", "--data-dir", p("etcd"), "--unsafe-no-fsync",
		"--listen-client-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdPort),
		"--advertise-client-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdPort),
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort),
		"--initial-cluster", fmt.Sprintf("default=http://127.0.0.1:%d", peerPort),
		"--listen-metrics-urls", "", "--log-level", "warn"); err != nil {
		return cp, err
	}
	if err := cp.start(bin, "kube-apiserver",
		"--etcd-servers", fmt.Sprintf("http://127.0.0.1:%d", etcdPort),
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", fmt.Sprint(apiPort),
		"--tls-cert-file", p("tls.crt"), "--tls-private-key-file", p("tls.key"),
		"--token-auth-file", p("tokens.csv"), "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", p("sa.pub"), "--service-account-signing-key-file", p("sa.key"),
		"--service-cluster-ip-range", "10.96.0.0/16", "--endpoint-reconciler-type", "none",
		"--allow-privileged=true", "--profiling=false", "--v=1"); err != nil {
		return cp, err
	}
	cp.REST = &rest.Config{
		Host: fmt.Sprintf("https://127.0.0.1:%d", apiPort), BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{CAData: pair.CA}, QPS: 100, Burst: 200,
	}
	if err := waitReady(cp.REST.Host, token, pair.CA, 180*time.Second); err != nil {
		return cp, fmt.Errorf("kube-apiserver: %w\n%s", err, cp.logTail("kube-apiserver"))
	}
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: local, context: {cluster: local, user: admin}}]
current-context: local
`, cp.REST.Host, p("ca.crt"), token)
	if err := os.WriteFile(p("kubeconfig"), []byte(kubeconfig), 0o600); err != nil {
		return cp, err
	}
	if err := cp.start(bin, "kube-controller-manager", "--kubeconfig", p("kubeconfig"),
		"--leader-elect=false", "--secure-port=0", "--controllers=serviceaccount-controller,job-controller,statefulset-controller,namespace-controller",
		"--service-account-private-key-file", p("sa.key"), "--root-ca-file", p("ca.crt"), "--v=1"); err != nil {
		return cp, err
	}
	cp.Client, err = kubernetes.NewForConfig(cp.REST)
	return cp, err
}

func (cp *controlPlane) start(bin, name string, args ...string) error {
	logf, err := os.Create(filepath.Join(cp.dir, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(bin, name), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	cp.procs = append(cp.procs, cmd)
	return nil
}

func (cp *controlPlane) logTail(name string) string {
	b, _ := os.ReadFile(filepath.Join(cp.dir, name+".log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// stop ends the processes it started, newest first, and removes the temp dir.
func (cp *controlPlane) stop() {
	for i := len(cp.procs) - 1; i >= 0; i-- {
		c := cp.procs[i]
		_ = c.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
	}
	if os.Getenv("ET_KEEP_TMP") == "" {
		_ = os.RemoveAll(cp.dir)
	}
}

func waitReady(host, token string, ca []byte, timeout time.Duration) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 5 * time.Second}
	return testenv.Poll(context.Background(), timeout, 250*time.Millisecond, func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, host+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, fmt.Errorf("readyz: %s", resp.Status)
		}
		return true, nil
	})
}

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

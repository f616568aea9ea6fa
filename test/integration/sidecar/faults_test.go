package sidecar_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/elastic-training/elastic-training/internal/testenv"
	"github.com/elastic-training/elastic-training/internal/testenv/etcdtest"
)

const leaseTTL = 2 * time.Second // startJoin passes --lease-ttl=2s

// hostsIn waits until the hostfile in dir lists exactly want hosts and
// returns when that happened.
func waitHosts(t *testing.T, dir string, timeout time.Duration, want ...string) time.Time {
	t.Helper()
	hf := filepath.Join(dir, "hostfile")
	var at time.Time
	testenv.Eventually(t, timeout, fmt.Sprintf("hostfile to list %v", want), func() error {
		got := readFile(hf)
		var hosts []string
		for _, l := range strings.Split(strings.TrimSpace(got), "\n") {
			if l != "" {
				hosts = append(hosts, strings.Fields(l)[0])
			}
		}
		if strings.Join(hosts, ",") != strings.Join(want, ",") {
			return fmt.Errorf("hostfile lists %v", hosts)
		}
		at = time.Now()
		return nil
	})
	return at
}

// TestFaults runs one job's membership through its failure modes in order
// (no subtests: members and the server outlive each step).
func TestFaults(t *testing.T) {
	s := startServe(t)
	files := t.TempDir()
	startJoin(t, s.URL, "", 0, files, "--register=false")
	a := startJoin(t, s.URL, "a.job.ns.svc", 1, "", "--member-index=0")
	b := startJoin(t, s.URL, "b.job.ns.svc", 1, "", "--member-index=1")
	c := startJoin(t, s.URL, "c.job.ns.svc", 1, "", "--member-index=2")
	waitHosts(t, files, 10*time.Second, "a.job.ns.svc", "b.job.ns.svc", "c.job.ns.svc")

	// SIGTERM drops a member at once.
	start := time.Now()
	c.Signal(syscall.SIGTERM)
	at := waitHosts(t, files, 5*time.Second, "a.job.ns.svc", "b.job.ns.svc")
	t.Logf("SIGTERM → hostfile without the member: %s", at.Sub(start).Round(time.Millisecond))
	require.Less(t, at.Sub(start), time.Second)
	require.NoError(t, c.Wait(t, 10*time.Second), "join must exit 0 on SIGTERM")
	require.Contains(t, c.Output(), "member deregistered")

	// kill -9 drops a member within lease TTL + 1 s.
	start = time.Now()
	b.Signal(syscall.SIGKILL)
	at = waitHosts(t, files, leaseTTL+5*time.Second, "a.job.ns.svc")
	t.Logf("kill -9 → hostfile without the member: %s (lease TTL %s)", at.Sub(start).Round(time.Millisecond), leaseTTL)
	require.Less(t, at.Sub(start), leaseTTL+time.Second)

	// Restarting serve (same data dir) keeps every live member.
	startJoin(t, s.URL, "d.job.ns.svc", 1, "", "--member-index=3")
	waitHosts(t, files, 10*time.Second, "a.job.ns.svc", "d.job.ns.svc")
	s.Signal(syscall.SIGTERM)
	require.NoError(t, s.Wait(t, 30*time.Second))
	start = time.Now()
	s.start(t)
	cli := etcdtest.Client(t, s.URL)
	waitMembers(t, cli, 2)
	t.Logf("serve restart (same data dir) → members listed: %s after start", time.Since(start).Round(time.Millisecond))

	// Restarting serve with an empty data dir (a recreated pod) gets every
	// live member registered again, and the files follow the fresh server.
	s.Signal(syscall.SIGTERM)
	require.NoError(t, s.Wait(t, 30*time.Second))
	require.NoError(t, os.RemoveAll(s.DataDir))
	start = time.Now()
	s.start(t)
	waitMembers(t, cli, 2)
	t.Logf("serve restart (empty data dir) → members re-registered: %s after start", time.Since(start).Round(time.Millisecond))
	// The member is listed the moment its key is put, a moment before it logs.
	testenv.WaitOutput(t, a, "registered again", 10*time.Second)
	a.Signal(syscall.SIGTERM)
	waitHosts(t, files, 10*time.Second, "d.job.ns.svc")
}

func waitMembers(t *testing.T, cli *clientv3.Client, n int) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%d members registered", n), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := cli.Get(ctx, "/elastic-training/members/", clientv3.WithPrefix())
		if err != nil {
			return err
		}
		if len(resp.Kvs) != n {
			return fmt.Errorf("%d members", len(resp.Kvs))
		}
		return nil
	})
}

// etcdctl (Debian etcd-client, v3 API) put/get/watch against serve.
func TestEtcdctl(t *testing.T) {
	bin := testenv.RequireBinary(t, "/usr/bin/etcdctl", "etcd-client")
	s := startServe(t)
	ctl := func(args ...string) *exec.Cmd {
		cmd := exec.Command(bin, append([]string{"--endpoints=" + s.URL}, args...)...)
		cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
		return cmd
	}
	watch := testenv.Start(t, "etcdctl watch", ctl("watch", "--prefix", "/demo/"))
	testenv.Eventually(t, 10*time.Second, "etcdctl watch to start and see a put", func() error {
		if out, err := ctl("put", "/demo/k", "v1").CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if !strings.Contains(watch.Output(), "PUT\n/demo/k\nv1") {
			return fmt.Errorf("watch saw %q", watch.Output())
		}
		return nil
	})
	out, err := ctl("get", "/demo/k").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "/demo/k\nv1\n", string(out))
	out, err = ctl("del", "/demo/k").CombinedOutput()
	require.NoError(t, err, "%s", out)
	testenv.Eventually(t, 10*time.Second, "watch to see the delete", func() error {
		if !strings.Contains(watch.Output(), "DELETE\n/demo/k") {
			return fmt.Errorf("watch saw %q", watch.Output())
		}
		return nil
	})
	// The v2 API on the same port is a separate keyspace, as it was in etcd.
	code, _, err := v2Get(s.URL + "/v2/keys/demo/k")
	require.NoError(t, err)
	require.Equal(t, 404, code)
}

// A graceful restart of serve keeps the v2 keys (with their TTLs and the
// index), so agents that survive the restart find their rendezvous state.
func TestServeRestartKeepsV2Keys(t *testing.T) {
	s := startServe(t)
	req, _ := http.NewRequest("PUT", s.URL+"/v2/keys/torch/elastic/rendezvous/job", strings.NewReader("value=state&ttl=600"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	index := resp.Header.Get("X-Etcd-Index")
	s.Signal(syscall.SIGTERM)
	require.NoError(t, s.Wait(t, 30*time.Second))
	s.start(t)
	code, body, err := v2Get(s.URL + "/v2/keys/torch/elastic/rendezvous/job")
	require.NoError(t, err)
	require.Equal(t, 200, code, "%v", body)
	node := body["node"].(map[string]any)
	require.Equal(t, "state", node["value"])
	require.Greater(t, node["ttl"].(float64), 500.0)
	resp, err = http.Get(s.URL + "/v2/keys/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, index, resp.Header.Get("X-Etcd-Index"), "the index continues")
	require.Contains(t, s.Output(), "restored v2 keys")
}

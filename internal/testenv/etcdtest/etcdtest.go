// Package etcdtest gives tests and benchmarks an etcd v3 client. It is apart
// from testenv so that the etcd client and gRPC stay out of the tests that
// need none of them.
package etcdtest

import (
	"fmt"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.uber.org/zap"

	"github.com/elastic-training/elastic-training/internal/testenv"
)

// Client is an etcd v3 client of endpoint (a URL), closed when the test
// ends. It logs nothing: a failing test says what went wrong itself.
func Client(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Embedded runs an embedded etcd on free loopback ports, as Kubernetes' etcd
// test server does, and returns an in-process client; both end with the test.
func Embedded(t testing.TB) *clientv3.Client {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(t.TempDir(), "etcd")
	cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t)))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t)))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = true
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready")
	}
	cli := v3client.New(e.Server)
	t.Cleanup(func() { cli.Close() })
	return cli
}

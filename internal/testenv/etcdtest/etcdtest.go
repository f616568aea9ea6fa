// Package etcdtest gives tests and benchmarks an etcd v3 client. It is apart
// from testenv so that the etcd client and gRPC stay out of the tests that
// need none of them.
package etcdtest

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
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

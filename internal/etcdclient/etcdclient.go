// Package etcdclient connects to a job's rendezvous server (the serving
// sidecar's etcd v3 API) as every pod's sidecar and the commands a pod runs
// do: endpoints as flags give them, TLS with etcdctl's file flags, and a
// reconnect backoff short enough to follow the rendezvous when it moves.
package etcdclient

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// Config says how to reach the rendezvous server.
type Config struct {
	// Endpoints: comma-separated client URLs; a bare host:port gets http://.
	Endpoints   string
	DialTimeout time.Duration
	// TLS (etcdctl's flag names: --cacert, --cert, --key).
	CAFile, CertFile, KeyFile string
}

// EndpointURLs are the client URLs of c.Endpoints.
func (c Config) EndpointURLs() ([]string, error) {
	var eps []string
	for _, e := range strings.Split(c.Endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			if !strings.Contains(e, "://") {
				e = "http://" + e
			}
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, errors.New("--endpoints is required")
	}
	return eps, nil
}

// New connects to the rendezvous server's v3 API.
func New(c Config) (*clientv3.Client, error) {
	eps, err := c.EndpointURLs()
	if err != nil {
		return nil, err
	}
	var tlsCfg *tls.Config
	if c.CAFile != "" || c.CertFile != "" {
		info := transport.TLSInfo{TrustedCAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile}
		if tlsCfg, err = info.ClientConfig(); err != nil {
			return nil, fmt.Errorf("client TLS: %w", err)
		}
	}
	dt := c.DialTimeout
	if dt <= 0 {
		dt = 5 * time.Second
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: eps, DialTimeout: dt, TLS: tlsCfg,
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 3 * time.Second,
		// gRPC's own reconnect backoff grows to 2 minutes: a pod whose rendezvous moved (a standby took over, or
		// the serving pod came back) would find it that late. The Service's next endpoint is worth a dial a second.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: dt,
		})},
		Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", strings.Join(eps, ","), err)
	}
	return cli, nil
}

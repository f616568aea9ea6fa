package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/membership"
	"github.com/elastic-training/elastic-training/internal/storeproxy"
)

// Why a trainer's sidecar checks where it carries the agent's store connections: the rendezvous Service's
// EndpointSlice says which pod serves, and whoever may patch it (the job's own account only, since the chart binds
// the Role to it alone) could send every agent to a store of their choosing, whose pickles torch's agents load.
// Defence in depth: the serving sidecar names itself in its store (constants.ServerKey: its stable pod name, under
// the job's headless Service, and its c10d port), and a verifying sidecar carries connections only to a pod of its
// own job found under such a name (membership.SameJob), dialled directly, never to the address the Service leads to.

// announceServer writes this serving pod's stable name and c10d port into its store, for the verifying sidecars.
func announceServer(ctx context.Context, cli *clientv3.Client, host, c10dAddr string) error {
	_, port, err := net.SplitHostPort(c10dAddr)
	if err != nil {
		return fmt.Errorf("--c10d-addr: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, constants.ServerKey, net.JoinHostPort(host, port)); err != nil {
		return fmt.Errorf("naming this pod as the job's store (%s): %w", constants.ServerKey, err)
	}
	return nil
}

// verifiedStore is the storeproxy.Resolver of a verifying sidecar: the store its registration's store names, once
// checked to be a pod of this pod's job. The answer is kept for the registration (reset at each change of it), and a
// refusal is logged once per registration and counted at every connection it ends.
type verifiedStore struct {
	cli     *clientv3.Client
	self    string // this pod's stable name
	log     *slog.Logger
	refused prometheus.Counter

	mu   sync.Mutex
	addr string // the verified store
	why  error  // or why it is refused
}

func newVerifiedStore(cli *clientv3.Client, self string, log *slog.Logger, reg prometheus.Registerer) *verifiedStore {
	v := &verifiedStore{cli: cli, self: self, log: log, refused: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "elastic_training_sidecar", Name: "c10d_proxy_refused_total",
		Help: "Trainer store connections closed because the store the rendezvous leads to is not a pod of this job.",
	})}
	reg.MustRegister(v.refused)
	return v
}

// reset forgets the answer: the registration changed, and with it maybe the store.
func (v *verifiedStore) reset() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.addr, v.why = "", nil
}

func (v *verifiedStore) resolve(ctx context.Context) (string, error) {
	v.mu.Lock()
	addr, why := v.addr, v.why
	v.mu.Unlock()
	if addr != "" {
		return addr, nil
	}
	if why != nil {
		v.refused.Inc()
		return "", why
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := v.cli.Get(ctx, constants.ServerKey)
	if err != nil {
		return "", fmt.Errorf("asking the store where it serves: %w", err) // passing: retried
	}
	addr, err = checkServer(v.self, resp)
	v.mu.Lock()
	defer v.mu.Unlock()
	if err != nil {
		v.why = fmt.Errorf("%w: %w", storeproxy.ErrRefused, err)
		v.refused.Inc()
		v.log.Error("c10d store proxy: refusing to carry the trainer's store connections: the rendezvous this pod reached is not served by a pod of its job "+
			"(is the rendezvous Service pointed elsewhere? kubectl get endpointslice, lease)", "err", err)
		return "", v.why
	}
	v.addr = addr
	v.log.Info("c10d store proxy: the job's store is a pod of this job", "store", addr)
	return addr, nil
}

// checkServer reads the store's answer to constants.ServerKey: host:port, host a pod of self's job.
func checkServer(self string, resp *clientv3.GetResponse) (string, error) {
	if len(resp.Kvs) == 0 {
		return "", errors.New("the store does not name the pod that serves it (" + constants.ServerKey + ")")
	}
	raw := string(resp.Kvs[0].Value)
	host, port, err := net.SplitHostPort(raw)
	if err != nil {
		return "", fmt.Errorf("the store names %.100q as its server: %w", raw, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("the store names %.100q as its server: not a port", raw)
	}
	if err := membership.SameJob(self, host); err != nil {
		return "", fmt.Errorf("the store names %.100q as its server: %w", raw, err)
	}
	return raw, nil
}

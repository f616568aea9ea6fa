// Package chart_test runs the job chart against a real kube-apiserver: every rendered object passes a
// server-side dry-run, and a real helm install / upgrade / uninstall through the SDK leaves nothing behind.
// The cluster is the local one of the e2e harness (test/e2e/framework).
package chart_test

import (
	"context"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"

	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

func TestMain(m *testing.M) { framework.Main(m) }

// cluster adapts the harness to the few calls these tests make.
type cluster struct{ *framework.Cluster }

func getCluster(t *testing.T) *cluster { return &cluster{framework.Get(t)} }

func (c *cluster) namespace(t *testing.T) string { return c.Namespace(t) }

func (c *cluster) helmConfig(t *testing.T, ns string) *action.Configuration {
	return c.HelmConfig(t, ns)
}

func waitFor(t *testing.T, timeout time.Duration, desc string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	framework.Get(t).WaitFor(t, timeout, desc, cond)
}

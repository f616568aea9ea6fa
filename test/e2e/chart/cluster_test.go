// Package chart_test runs the job chart against a real kube-apiserver: every rendered object passes a
// server-side dry-run, and a real helm install / upgrade / uninstall through the SDK leaves nothing behind.
//
// The cluster comes from $KUBECONFIG. This file is a stand-in for the e2e harness (test/e2e/framework:
// framework.Main(m) in TestMain, framework.Get(t), c.Namespace(t), c.HelmInstall/HelmUpgrade/HelmUninstall);
// when that package is on this branch, replace this file with TestMain calling framework.Main and make
// getCluster return framework.Get(t). The tests themselves only use Kubeconfig, REST, Client and namespace.
package chart_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

type cluster struct {
	Kubeconfig string
	REST       *rest.Config
	Client     kubernetes.Interface
}

func getCluster(t *testing.T) *cluster {
	t.Helper()
	kc := os.Getenv("KUBECONFIG")
	if kc == "" {
		t.Fatal("KUBECONFIG is not set: these tests need a real kube-apiserver (bring up the local cluster with " +
			"`make cluster-up` and export KUBECONFIG, or run them through the e2e harness)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", kc, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Discovery().ServerVersion(); err != nil {
		t.Fatalf("the API server of %s does not answer: %v", kc, err)
	}
	return &cluster{Kubeconfig: kc, REST: cfg, Client: cs}
}

// namespace creates a namespace for the test and deletes it at the end.
func (c *cluster) namespace(t *testing.T) string {
	t.Helper()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := "e2e-chart-" + hex.EncodeToString(b)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"elastic-training.io/e2e": "true"}}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		err := c.Client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete namespace %s: %v", name, err)
		}
	})
	return name
}

// helmConfig is the SDK configuration `helm -n ns` would use.
func (c *cluster) helmConfig(t *testing.T, ns string) *action.Configuration {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &c.Kubeconfig, &ns
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, ns, "secret", func(string, ...any) {}); err != nil {
		t.Fatalf("helm: init for namespace %s: %v", ns, err)
	}
	return cfg
}

// waitFor polls cond every 500 ms until it is true or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, desc string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for {
		ok, err := cond(ctx)
		if ok {
			return
		}
		last = err
		select {
		case <-ctx.Done():
			t.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, desc, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

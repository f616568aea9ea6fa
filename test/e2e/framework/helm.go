package framework

import (
	"fmt"
	"os"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/release"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// HelmOption changes one Helm install/upgrade setting.
type HelmOption func(*helmOptions)

type helmOptions struct {
	wait        bool
	waitForJobs bool
	timeout     time.Duration
	reuseValues bool
	keep        bool
}

// Wait makes install/upgrade wait, like `helm --wait --timeout`, until the release's Deployments,
// StatefulSets, Services and Pods are ready.
func Wait(timeout time.Duration) HelmOption {
	return func(o *helmOptions) { o.wait, o.timeout = true, timeout }
}

// WaitForJobs also waits for the release's Jobs to complete (`helm --wait-for-jobs`).
func WaitForJobs(timeout time.Duration) HelmOption {
	return func(o *helmOptions) { o.wait, o.waitForJobs, o.timeout = true, true, timeout }
}

// KeepAfterTest leaves the release installed when the test that installed it ends, for something a whole
// test binary shares (the webhook add-on); it goes when the cluster does.
func KeepAfterTest() HelmOption { return func(o *helmOptions) { o.keep = true } }

// ReuseValues makes an upgrade merge the given values onto the release's current ones (`--reuse-values`).
func ReuseValues() HelmOption { return func(o *helmOptions) { o.reuseValues = true } }

// HelmConfig is the SDK configuration `helm -n ns` would use, for tests that drive actions themselves.
func (c *Cluster) HelmConfig(t testing.TB, ns string) *action.Configuration {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &c.Kubeconfig, &ns
	cfg := new(action.Configuration)
	logf := func(string, ...any) {}
	if os.Getenv("E2E_HELM_DEBUG") != "" {
		logf = t.Logf
	}
	if err := cfg.Init(flags, ns, "secret", logf); err != nil {
		t.Fatalf("helm: init for namespace %s: %v", ns, err)
	}
	return cfg
}

func applyOptions(opts []HelmOption) helmOptions {
	o := helmOptions{timeout: 5 * time.Minute}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// HelmInstall installs the chart in chartDir as release in ns (a real install through the Helm SDK, as
// `helm install`), and returns the release. When the test ends, a release still installed is uninstalled
// (before the namespace goes), so cluster-scoped objects such as webhook configurations go with it.
func (c *Cluster) HelmInstall(t testing.TB, ns, releaseName, chartDir string, values map[string]any, opts ...HelmOption) *release.Release {
	t.Helper()
	rel, err := c.install(t, ns, releaseName, chartDir, values, applyOptions(opts))
	if err != nil {
		t.Fatalf("helm install %s (chart %s) in %s: %v", releaseName, chartDir, ns, err)
	}
	return rel
}

// install is `helm install` with o; a release still installed when the test ends is uninstalled, unless o keeps it.
func (c *Cluster) install(t testing.TB, ns, releaseName, chartDir string, values map[string]any, o helmOptions) (*release.Release, error) {
	t.Helper()
	ch := chartrender.Load(t, chartDir)
	in := action.NewInstall(c.HelmConfig(t, ns))
	in.ReleaseName, in.Namespace = releaseName, ns
	in.Wait, in.WaitForJobs, in.Timeout = o.wait, o.waitForJobs, o.timeout
	if !o.keep {
		t.Cleanup(func() { c.uninstallLeftover(t, ns, releaseName) })
	}
	return in.RunWithContext(t.Context(), ch, values)
}

func (c *Cluster) uninstallLeftover(t testing.TB, ns, releaseName string) {
	if os.Getenv("E2E_KEEP_NAMESPACES") != "" || !c.Running() {
		return
	}
	cfg := c.HelmConfig(t, ns)
	if _, err := action.NewGet(cfg).Run(releaseName); err != nil {
		return // uninstalled by the test, or never installed
	}
	un := action.NewUninstall(cfg)
	un.Wait, un.Timeout = true, 2*time.Minute
	if _, err := un.Run(releaseName); err != nil {
		t.Errorf("cleanup: helm uninstall %s in %s: %v", releaseName, ns, err)
	}
}

// HelmUpgrade upgrades release in ns to the chart in chartDir with values (as `helm upgrade`).
func (c *Cluster) HelmUpgrade(t testing.TB, ns, releaseName, chartDir string, values map[string]any, opts ...HelmOption) *release.Release {
	t.Helper()
	ch := chartrender.Load(t, chartDir)
	o := applyOptions(opts)
	up := action.NewUpgrade(c.HelmConfig(t, ns))
	up.Namespace = ns
	up.Wait, up.WaitForJobs, up.Timeout, up.ReuseValues = o.wait, o.waitForJobs, o.timeout, o.reuseValues
	rel, err := up.RunWithContext(t.Context(), releaseName, ch, values)
	if err != nil {
		t.Fatalf("helm upgrade %s (chart %s) in %s: %v", releaseName, chartDir, ns, err)
	}
	return rel
}

// HelmUninstall uninstalls release from ns and waits until its resources are deleted (as `helm uninstall
// --wait`).
func (c *Cluster) HelmUninstall(t testing.TB, ns, releaseName string, timeout time.Duration) {
	t.Helper()
	un := action.NewUninstall(c.HelmConfig(t, ns))
	un.Wait, un.Timeout = true, timeout
	if _, err := un.Run(releaseName); err != nil {
		t.Fatalf("helm uninstall %s in %s: %v", releaseName, ns, err)
	}
}

// HelmTest runs the release's test hooks (as `helm test`) and fails the test if one fails.
func (c *Cluster) HelmTest(t testing.TB, ns, releaseName string, timeout time.Duration) *release.Release {
	t.Helper()
	rel, err := c.HelmTestResult(t, ns, releaseName, timeout)
	if err != nil {
		t.Fatalf("helm test %s in %s: %v", releaseName, ns, err)
	}
	return rel
}

// HelmTestResult runs the release's test hooks (as `helm test`) and returns helm's error, or one naming the
// failed hook.
func (c *Cluster) HelmTestResult(t testing.TB, ns, releaseName string, timeout time.Duration) (*release.Release, error) {
	t.Helper()
	rt := action.NewReleaseTesting(c.HelmConfig(t, ns))
	rt.Namespace, rt.Timeout = ns, timeout
	rel, err := rt.Run(releaseName)
	if err != nil {
		return rel, err
	}
	for _, h := range rel.Hooks {
		if h.LastRun.Phase == release.HookPhaseFailed {
			return rel, fmt.Errorf("hook %s failed", h.Name)
		}
	}
	return rel, nil
}

// HelmValues returns the release's user-supplied values (as `helm get values`).
func (c *Cluster) HelmValues(t testing.TB, ns, releaseName string) map[string]any {
	t.Helper()
	gv := action.NewGetValues(c.HelmConfig(t, ns))
	vals, err := gv.Run(releaseName)
	if err != nil {
		t.Fatalf("helm get values %s in %s: %v", releaseName, ns, err)
	}
	return vals
}

// HelmInstallError is `helm install` that the test expects to be refused: it returns the error (nil: installed,
// and uninstalled when the test ends).
func (c *Cluster) HelmInstallError(t testing.TB, ns, releaseName, chartDir string, values map[string]any) error {
	t.Helper()
	_, err := c.install(t, ns, releaseName, chartDir, values, applyOptions(nil))
	return err
}

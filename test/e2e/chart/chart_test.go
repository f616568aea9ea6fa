package chart_test

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

const (
	chartDir    = "../../../charts/elastic-training"
	examplesDir = "../../../examples"
	// webhookChartDir: the cluster add-on, whose ClusterRoles give namespace admins what a job needs.
	webhookChartDir = "../../../charts/elastic-training-webhook"
)

func valuesFiles(t *testing.T) []string {
	ci, _ := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	ex, _ := filepath.Glob(filepath.Join(examplesDir, "*.yaml"))
	if len(ci) == 0 || len(ex) == 0 {
		t.Fatal("no scenarios found")
	}
	return append(ci, ex...)
}

func clients(t *testing.T, c *cluster) (dynamic.Interface, meta.RESTMapper, discovery.DiscoveryInterface) {
	t.Helper()
	dc, err := dynamic.NewForConfig(c.REST)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(c.Client.Discovery())
	if err != nil {
		t.Fatal(err)
	}
	return dc, restmapper.NewDiscoveryRESTMapper(groups), c.Client.Discovery()
}

// TestServerSideDryRun sends every object of every scenario to the real kube-apiserver as a server-side dry-run
// create with strict field validation, as a user bound to the built-in admin ClusterRole of the namespace alone:
// the schema, defaulting and validation of Kubernetes (and of the Prometheus Operator's CRDs) accept it, every
// object is namespaced, and namespace rights,
// with what the webhook chart aggregates into them, are enough to create it (authorization and RBAC's escalation
// check run on a dry-run too). Without the webhook chart's rights the same user may not, and its install with
// persistence cannot read the StorageClass.
func TestServerSideDryRun(t *testing.T) {
	c := getCluster(t)
	ch := chartrender.Load(t, chartDir)
	installMonitoringCRDs(t, c) // ci/monitoring-values.yaml's PodMonitor and PrometheusRule
	_, mapper, _ := clients(t, c)
	ns := c.namespace(t)
	user := c.AsNamespaceUser(t, ns, "admin")
	dc, err := dynamic.NewForConfig(user.REST)
	if err != nil {
		t.Fatal(err)
	}
	withPersistence := map[string]any{"command": []any{"torchrun", "train.py"}, "persistence": map[string]any{"enabled": true}}
	dryRunInstall := func(as *framework.Cluster) error {
		in := action.NewInstall(as.HelmConfig(t, ns))
		in.ReleaseName, in.Namespace, in.DryRun, in.DryRunOption = "dry", ns, true, "server"
		_, err := in.RunWithContext(t.Context(), ch, withPersistence)
		return err
	}
	// Kubernetes' own admin role, without what any webhook chart installed on this cluster aggregates into it: the
	// job's Role grants what such a user does not hold, and its install with persistence cannot read StorageClasses.
	bare := c.AsNamespaceUser(t, ns, builtinAdmin(t, c))
	r, err := chartrender.Render(ch, withPersistence, chartrender.Options{Release: "dry", Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	role := r.Find("Role", "dry-rdzv")
	if role == nil {
		t.Fatal("no Role dry-rdzv rendered")
	}
	bareDC, err := dynamic.NewForConfig(bare.REST)
	if err != nil {
		t.Fatal(err)
	}
	_, err = bareDC.Resource(rbacv1.SchemeGroupVersion.WithResource("roles")).Namespace(ns).Create(t.Context(), role,
		metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("with Kubernetes' admin role alone a namespace admin created the job's Role (want forbidden): %v", err)
	}
	t.Logf("with Kubernetes' admin role alone: %v", err)
	// StorageClasses are cluster-scoped: a webhook release already on this cluster (the workloads tests keep theirs)
	// lets every authenticated user read them, and then only that binding may be what does.
	if readers := storageClassReaders(t, c, bare); len(readers) > 0 {
		t.Logf("not shown on this cluster: an install with persistence without the webhook chart's rights (the ClusterRoleBindings %v of an installed webhook release let every authenticated user read StorageClasses)", readers)
	} else if err := dryRunInstall(bare); err == nil || !strings.Contains(err.Error(), "storageclasses") {
		t.Fatalf("with Kubernetes' admin role alone a namespace admin's install with persistence read the StorageClasses (want forbidden): %v", err)
	}
	grantInstallerRights(t, c, user, ns)
	if err := dryRunInstall(user); err != nil {
		t.Fatalf("helm install --dry-run=server with persistence, as the namespace admin: %v", err)
	}
	total := 0
	for _, path := range valuesFiles(t) {
		name := strings.TrimSuffix(filepath.Base(path), ".yaml")
		t.Run(name, func(t *testing.T) {
			// Hooks included: Helm creates them too (helm test).
			r, err := chartrender.Render(ch, chartrender.ReadValues(t, path), chartrender.Options{Release: "dry", Namespace: ns})
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			// A RoleBinding's escalation check reads the Role it binds, which a dry-run does not create: the Roles
			// are created for real first (as the user, through the same check), and deleted when the case ends.
			objs := slices.Clone(r.Objects)
			slices.SortStableFunc(objs, func(a, b chartrender.Object) int {
				return cmp.Compare(rolesFirst(a.Unstructured().GetKind()), rolesFirst(b.Unstructured().GetKind()))
			})
			for _, o := range objs {
				obj := o.Unstructured()
				gvk := obj.GroupVersionKind()
				if gvk.Kind == "Role" {
					roles := dc.Resource(rbacv1.SchemeGroupVersion.WithResource("roles")).Namespace(ns)
					if _, err := roles.Create(context.Background(), obj, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
						t.Errorf("Role %s rejected by the API server: %v", obj.GetName(), err)
						continue
					}
					t.Cleanup(func() {
						if err := roles.Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{}); err != nil {
							t.Errorf("delete Role %s: %v", obj.GetName(), err)
						}
					})
					total++
					continue
				}
				if gvk.Group == "scheduling.volcano.sh" {
					// Volcano cannot be built here (docs/queues.md): no API server serves its PodGroup. test/helm
					// decodes it strictly into Volcano's own Go types instead (TestObjectsDecodeStrictly).
					t.Logf("%s %s: not sent (no Volcano on this cluster; checked against Volcano's Go types in test/helm)", gvk, obj.GetName())
					continue
				}
				m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
				if err != nil {
					t.Errorf("%s %s: the API server does not serve it: %v", gvk, obj.GetName(), err)
					continue
				}
				if m.Scope.Name() != meta.RESTScopeNameNamespace {
					t.Errorf("%s %s is cluster-scoped: a job install must need only namespaced objects", gvk.Kind, obj.GetName())
					continue
				}
				_, err = dc.Resource(m.Resource).Namespace(ns).Create(context.Background(), obj, metav1.CreateOptions{
					DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict",
				})
				if err != nil {
					t.Errorf("%s %s rejected by the API server: %v", gvk.Kind, obj.GetName(), err)
					continue
				}
				total++
			}
		})
	}
	t.Logf("%d objects accepted by the API server (server-side dry-run, strict field validation)", total)
}

// TestInstallUpgradeUninstall installs scenarios for real through the SDK, scales them with
// `helm upgrade --reuse-values --set <group>.replicas=N`, checks that Kubernetes took the patch (parallelism and
// completions or replicas), that pod templates and the generated run id / SSH key stayed as they were, then
// uninstalls and checks that nothing of the release is left in the namespace.
func TestInstallUpgradeUninstall(t *testing.T) {
	c := getCluster(t)
	dc, mapper, disc := clients(t, c)
	cases := []struct {
		values string
		set    map[string]any // the upgrade's --set
		scaled string         // workload that must have 3 replicas after the upgrade
		refuse string         // the upgrade must fail with this message instead
	}{
		{"pytorch-values.yaml", map[string]any{"workers": map[string]any{"replicas": 3}}, "Job/job-worker", ""},
		{"mpi-values.yaml", map[string]any{"workers": map[string]any{"replicas": 3}}, "StatefulSet/job-worker", ""},
		{"elasticdl-values.yaml", map[string]any{"workerGroups": map[string]any{"burst": map[string]any{"replicas": 3}}}, "Job/job-burst", ""},
		{"mxnet-values.yaml", map[string]any{"workers": map[string]any{"replicas": 3}}, "", "MXNet jobs are not elastic"},
	}
	for _, tc := range cases {
		t.Run(strings.TrimSuffix(tc.values, "-values.yaml"), func(t *testing.T) {
			ns := c.namespace(t)
			cfg := c.helmConfig(t, ns)
			// A chart of its own: Helm's install and upgrade write the release's values into the chart's.
			ch := chartrender.Load(t, chartDir)
			vals := chartrender.ReadValues(t, filepath.Join(chartDir, "ci", tc.values))
			vals["tests"] = map[string]any{"enabled": false}

			in := action.NewInstall(cfg)
			in.ReleaseName, in.Namespace, in.Timeout = "job", ns, 2*time.Minute
			start := time.Now()
			rel1, err := in.Run(ch, vals)
			if err != nil {
				t.Fatalf("helm install: %v", err)
			}
			t.Logf("helm install: %.2fs", time.Since(start).Seconds())
			before := liveWorkloads(t, dc, ns)
			runID1, ssh1 := generated(t, c, ns)

			up := action.NewUpgrade(c.helmConfig(t, ns))
			up.Namespace, up.ReuseValues, up.Timeout = ns, true, 2*time.Minute
			start = time.Now()
			rel2, err := up.Run("job", ch, tc.set)
			if tc.refuse != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refuse) {
					t.Fatalf("helm upgrade --set %v: want an error containing %q, got %v", tc.set, tc.refuse, err)
				}
				rel2 = rel1
			} else if err != nil {
				t.Fatalf("helm upgrade --reuse-values --set %v: %v", tc.set, err)
			}
			t.Logf("helm upgrade (scale): %.2fs, revision %d -> %d", time.Since(start).Seconds(), rel1.Version, rel2.Version)
			after := liveWorkloads(t, dc, ns)
			for key, b := range before {
				a := after[key]
				if a == nil {
					t.Errorf("%s disappeared after the upgrade", key)
					continue
				}
				if !strings.Contains(tc.values, "mxnet") && b.template != a.template {
					t.Errorf("%s: the pod template changed on a pure scale", key)
				}
				if key == tc.scaled && a.replicas != 3 {
					t.Errorf("%s: want 3 replicas after the upgrade, have %d", key, a.replicas)
				}
			}
			if _, ok := after[tc.scaled]; tc.scaled != "" && !ok {
				t.Errorf("no %s in the namespace", tc.scaled)
			}
			runID2, ssh2 := generated(t, c, ns)
			if runID1 == "" || runID1 != runID2 {
				t.Errorf("run id not kept across the upgrade: %q -> %q", runID1, runID2)
			}
			if ssh1 != ssh2 {
				t.Error("SSH key regenerated by the upgrade")
			}

			un := action.NewUninstall(c.helmConfig(t, ns))
			un.Wait, un.Timeout = true, 2*time.Minute
			start = time.Now()
			if _, err := un.Run("job"); err != nil {
				t.Fatalf("helm uninstall: %v", err)
			}
			t.Logf("helm uninstall --wait: %.2fs", time.Since(start).Seconds())
			var left []string
			waitFor(t, 90*time.Second, "an empty namespace after helm uninstall", func(ctx context.Context) (bool, error) {
				left = leftovers(ctx, t, dc, mapper, disc, ns)
				if len(left) > 0 {
					return false, fmt.Errorf("left: %v", left)
				}
				return true, nil
			})
		})
	}
}

type workload struct {
	replicas int64
	template string
}

// liveWorkloads reads every Job and StatefulSet in ns: replicas (parallelism = completions for Jobs) and the pod
// template as stored, without the labels the Job controller adds to it.
func liveWorkloads(t *testing.T, dc dynamic.Interface, ns string) map[string]*workload {
	t.Helper()
	out := map[string]*workload{}
	for _, r := range []struct {
		gvr  schema.GroupVersionResource
		kind string
	}{{schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}, "Job"},
		{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "statefulsets"}, "StatefulSet"}} {
		list, err := dc.Resource(r.gvr).Namespace(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range list.Items {
			w := &workload{}
			if r.kind == "Job" {
				p, _, _ := unstructured.NestedInt64(o.Object, "spec", "parallelism")
				cpl, _, _ := unstructured.NestedInt64(o.Object, "spec", "completions")
				if p != cpl {
					t.Errorf("Job %s: parallelism %d != completions %d", o.GetName(), p, cpl)
				}
				w.replicas = p
			} else {
				w.replicas, _, _ = unstructured.NestedInt64(o.Object, "spec", "replicas")
			}
			tpl, _, _ := unstructured.NestedMap(o.Object, "spec", "template")
			b, _ := yaml.Marshal(tpl)
			w.template = string(b)
			out[r.kind+"/"+o.GetName()] = w
		}
	}
	return out
}

// generated returns the run id and the SSH key data (empty when the job has none) as stored in the cluster.
func generated(t *testing.T, c *cluster, ns string) (string, string) {
	t.Helper()
	ctx := context.Background()
	cm, err := c.Client.CoreV1().ConfigMaps(ns).Get(ctx, "job-run", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("run ConfigMap: %v", err)
	}
	ssh := ""
	if s, err := c.Client.CoreV1().Secrets(ns).Get(ctx, "job-ssh", metav1.GetOptions{}); err == nil {
		ssh = string(s.Data["ssh-privatekey"])
	} else if !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return cm.Data["run-id"], ssh
}

// leftovers lists every namespaced object in ns except what Kubernetes itself puts in every namespace.
func leftovers(ctx context.Context, t *testing.T, dc dynamic.Interface, _ meta.RESTMapper, disc discovery.DiscoveryInterface, ns string) []string {
	t.Helper()
	lists, err := disc.ServerPreferredNamespacedResources()
	if err != nil && len(lists) == 0 {
		t.Fatal(err)
	}
	var left []string
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			continue
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !contains(r.Verbs, "list") || r.Name == "events" {
				continue
			}
			items, err := dc.Resource(gv.WithResource(r.Name)).Namespace(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				continue
			}
			for _, o := range items.Items {
				switch {
				case r.Name == "serviceaccounts" && o.GetName() == "default",
					r.Name == "configmaps" && o.GetName() == "kube-root-ca.crt":
					continue
				}
				left = append(left, r.Name+"/"+o.GetName())
			}
		}
	}
	sort.Strings(left)
	return left
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// grantInstallerRights creates the webhook chart's ClusterRoles and bindings for those who install jobs, as the
// webhook chart renders them (a release of its own name), for the test's duration, and waits until the
// aggregation has given them to user in ns.
func grantInstallerRights(t *testing.T, c *cluster, user *framework.Cluster, ns string) {
	t.Helper()
	dc, mapper, _ := clients(t, c)
	ch := chartrender.Load(t, webhookChartDir)
	r, err := chartrender.Render(ch, nil, chartrender.Options{Release: "e2e-installer-rights", Namespace: "elastic-training-system"})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, o := range r.Objects {
		obj := o.Unstructured()
		if (obj.GetKind() != "ClusterRole" && obj.GetKind() != "ClusterRoleBinding") ||
			(!strings.HasSuffix(obj.GetName(), "-job-installer") && !strings.HasSuffix(obj.GetName(), "-storageclass-reader")) {
			continue
		}
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dc.Resource(m.Resource).Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s %s: %v", gvk.Kind, obj.GetName(), err)
		}
		n++
		t.Cleanup(func() {
			if err := dc.Resource(m.Resource).Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{}); err != nil {
				t.Errorf("delete %s %s: %v", gvk.Kind, obj.GetName(), err)
			}
		})
	}
	if n != 3 {
		t.Fatalf("the webhook chart renders %d of the installers' ClusterRoles and bindings, want 3", n)
	}
	waitFor(t, time.Minute, "the admin role aggregating the webhook chart's rights", func(ctx context.Context) (bool, error) {
		review, err := user.Client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: "patch", Group: "discovery.k8s.io", Resource: "endpointslices"}}}, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		if !review.Status.Allowed {
			return false, fmt.Errorf("not yet: %s", review.Status.Reason)
		}
		return true, nil
	})
}

// storageClassReaders returns the webhook charts' storageclass-reader ClusterRoleBindings on the cluster when the
// user may list StorageClasses, and fails the test when the user may but no such binding exists (then something
// else grants it, and the negative check would prove nothing).
func storageClassReaders(t *testing.T, c *cluster, user *framework.Cluster) []string {
	t.Helper()
	review, err := user.Client.AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(), &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: "list", Group: "storage.k8s.io", Resource: "storageclasses"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !review.Status.Allowed {
		return nil
	}
	bindings, err := c.Client.RbacV1().ClusterRoleBindings().List(context.Background(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=elastic-training-webhook"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, b := range bindings.Items {
		if strings.HasSuffix(b.Name, "-storageclass-reader") {
			names = append(names, b.Name)
		}
	}
	if len(names) == 0 {
		t.Fatalf("the user may list StorageClasses (%s) and no webhook release's storageclass-reader binding is on this cluster", review.Status.Reason)
	}
	return names
}

// builtinAdmin makes a ClusterRole of the rules Kubernetes itself aggregates into admin (system:aggregate-to-admin,
// -edit and -view), without what add-ons installed on the cluster add to admin, and returns its name.
func builtinAdmin(t *testing.T, c *cluster) string {
	t.Helper()
	const name = "e2e-kubernetes-admin-alone"
	cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, part := range []string{"system:aggregate-to-admin", "system:aggregate-to-edit", "system:aggregate-to-view"} {
		r, err := c.Client.RbacV1().ClusterRoles().Get(context.Background(), part, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cr.Rules = append(cr.Rules, r.Rules...)
	}
	// One left by a test binary that was killed goes first.
	if err := c.Client.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().ClusterRoles().Create(context.Background(), cr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Client.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete ClusterRole %s: %v", name, err)
		}
	})
	return name
}

// rolesFirst is the sort key that puts Roles before every other object.
func rolesFirst(kind string) int {
	if kind == "Role" {
		return 0
	}
	return 1
}

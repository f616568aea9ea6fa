package framework

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// LabelTestUser marks what AsNamespaceUser makes in a namespace (the user's ServiceAccount and RoleBinding), so
// that a check for what a chart left behind can leave them out.
const LabelTestUser = "elastic-training.io/e2e-user"

// AsNamespaceUser is the cluster as a user bound to the built-in ClusterRole role (admin, edit) in ns alone sees
// it: a ServiceAccount of its own in ns, a RoleBinding, and a kubeconfig with the account's token, which every
// method of the returned Cluster uses (helm and kubectl included). That is how a team that trains installs its jobs
// on a shared cluster: with namespace rights, not a cluster admin's.
func (c *Cluster) AsNamespaceUser(t testing.TB, ns, role string) *Cluster {
	t.Helper()
	ctx := context.Background()
	name := role + "-user"
	if _, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelTestUser: "true"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("service account %s/%s: %v", ns, name, err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelTestUser: "true"}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}}
	if _, err := c.Client.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("role binding %s/%s to ClusterRole %s: %v", ns, name, role, err)
	}
	hour := int64(3600)
	tr, err := c.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s/%s: %v", ns, name, err)
	}
	ca := c.REST.CAData
	if len(ca) == 0 && c.REST.CAFile != "" {
		if ca, err = os.ReadFile(c.REST.CAFile); err != nil {
			t.Fatal(err)
		}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{Server: c.REST.Host, CertificateAuthorityData: ca}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: name, Namespace: ns}
	kc.CurrentContext = name
	u := *c
	u.Kubeconfig = filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, u.Kubeconfig); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", u.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = c.REST.QPS, c.REST.Burst
	if u.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	u.REST = cfg
	t.Logf("acting as %s: ClusterRole %s bound in namespace %s only", fmt.Sprintf("system:serviceaccount:%s:%s", ns, name), role, ns)
	return &u
}

// Package incluster connects a sidecar to the API server as its pod: the
// token, CA and namespace the webhook or the chart mounts in constants.TokenDir,
// and a REST client of one API group version. client-go's typed clientset
// registers every API group, which doubles the sidecar's binary (35 to 70 MB)
// for a few requests.
package incluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// Client is a REST client of one API group version in the pod's own namespace.
type Client struct {
	API       rest.Interface
	Namespace string
	Scheme    *runtime.Scheme // the group version's types, for recorders and decoding
}

// CoreV1 connects to core/v1 with the pod's in-cluster config.
func CoreV1() (*Client, error) { return inCluster(corev1.SchemeGroupVersion, corev1.AddToScheme) }

// CoordinationV1 connects to coordination.k8s.io/v1 (Leases) with the pod's in-cluster config.
func CoordinationV1() (*Client, error) {
	return inCluster(coordinationv1.SchemeGroupVersion, coordinationv1.AddToScheme)
}

// DiscoveryV1 connects to discovery.k8s.io/v1 (EndpointSlices) with the pod's in-cluster config.
func DiscoveryV1() (*Client, error) {
	return inCluster(discoveryv1.SchemeGroupVersion, discoveryv1.AddToScheme)
}

func inCluster(gv schema.GroupVersion, add func(*runtime.Scheme) error) (*Client, error) {
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, err
	}
	ns, err := os.ReadFile(filepath.Join(constants.TokenDir, "namespace"))
	if err != nil {
		return nil, fmt.Errorf("the pod's namespace: %w", err)
	}
	return New(rc, strings.TrimSpace(string(ns)), gv, add)
}

// New is a client of gv in namespace with config rc (tests give their kubeconfig's).
func New(rc *rest.Config, namespace string, gv schema.GroupVersion, add func(*runtime.Scheme) error) (*Client, error) {
	sch := runtime.NewScheme()
	if err := add(sch); err != nil {
		return nil, err
	}
	rc = rest.CopyConfig(rc)
	rc.GroupVersion = &gv
	rc.APIPath = "/apis"
	if gv.Group == "" {
		rc.APIPath = "/api"
	}
	rc.NegotiatedSerializer = serializer.NewCodecFactory(sch).WithoutConversion()
	api, err := rest.RESTClientFor(rc)
	if err != nil {
		return nil, fmt.Errorf("%s client: %w", gv, err)
	}
	return &Client{API: api, Namespace: namespace, Scheme: sch}, nil
}

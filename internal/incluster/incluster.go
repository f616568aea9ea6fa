// Package incluster connects a sidecar to the API server as its pod: the
// token, CA and namespace the webhook or the chart mounts in constants.TokenDir,
// and a core/v1 REST client. client-go's typed clientset registers every API
// group, which doubles the sidecar's binary (35 to 70 MB) for a few requests.
package incluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// Client is a core/v1 REST client of the pod's own namespace.
type Client struct {
	API       rest.Interface
	Namespace string
	Scheme    *runtime.Scheme // core/v1's types, for recorders and decoding
}

// CoreV1 connects with the pod's in-cluster config.
func CoreV1() (*Client, error) {
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, err
	}
	ns, err := os.ReadFile(filepath.Join(constants.TokenDir, "namespace"))
	if err != nil {
		return nil, fmt.Errorf("the pod's namespace: %w", err)
	}
	sch := runtime.NewScheme()
	if err := corev1.AddToScheme(sch); err != nil {
		return nil, err
	}
	rc.GroupVersion = &corev1.SchemeGroupVersion
	rc.APIPath = "/api"
	rc.NegotiatedSerializer = serializer.NewCodecFactory(sch).WithoutConversion()
	api, err := rest.RESTClientFor(rc)
	if err != nil {
		return nil, err
	}
	return &Client{API: api, Namespace: strings.TrimSpace(string(ns)), Scheme: sch}, nil
}

package incluster

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
)

// Each client reaches its group's path (core under /api, the others under /apis) and decodes its group's
// types, without changing the config it was given (the sidecar makes several from one).
func TestNew(t *testing.T) {
	for _, c := range []struct {
		gv       schema.GroupVersion
		add      func(*runtime.Scheme) error
		resource string
		kind     string
		obj      runtime.Object // what the server's answer is decoded into
		path     string
	}{
		{corev1.SchemeGroupVersion, corev1.AddToScheme, "pods", "Pod", &corev1.Pod{},
			"/api/v1/namespaces/train/pods/x"},
		{coordinationv1.SchemeGroupVersion, coordinationv1.AddToScheme, "leases", "Lease", &coordinationv1.Lease{},
			"/apis/coordination.k8s.io/v1/namespaces/train/leases/x"},
		{discoveryv1.SchemeGroupVersion, discoveryv1.AddToScheme, "endpointslices", "EndpointSlice", &discoveryv1.EndpointSlice{},
			"/apis/discovery.k8s.io/v1/namespaces/train/endpointslices/x"},
	} {
		t.Run(c.gv.String(), func(t *testing.T) {
			var path string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				path = r.URL.Path
				w.Header().Set("Content-Type", "application/json")
				json.NewEncoder(w).Encode(map[string]any{ //nolint:errcheck
					"apiVersion": c.gv.String(), "kind": c.kind, "metadata": map[string]any{"name": "x", "namespace": "train"},
				})
			}))
			defer srv.Close()
			rc := &rest.Config{Host: srv.URL}

			kc, err := New(rc, "train", c.gv, c.add)
			if err != nil {
				t.Fatal(err)
			}
			if kc.Namespace != "train" {
				t.Errorf("namespace %q", kc.Namespace)
			}
			if !kc.Scheme.Recognizes(c.gv.WithKind(c.kind)) {
				t.Errorf("the scheme does not know %s", c.gv.WithKind(c.kind))
			}
			if err := kc.API.Get().Namespace(kc.Namespace).Resource(c.resource).Name("x").Do(context.Background()).Into(c.obj); err != nil {
				t.Fatal(err)
			}
			if path != c.path {
				t.Errorf("request to %s, want %s", path, c.path)
			}
			if name := c.obj.(metav1.Object).GetName(); name != "x" {
				t.Errorf("decoded %+v", c.obj)
			}
			if rc.GroupVersion != nil || rc.APIPath != "" || rc.NegotiatedSerializer != nil {
				t.Errorf("New changed the config it was given: %+v", rc)
			}
		})
	}
}

func TestNewSchemeError(t *testing.T) {
	bad := errors.New("no types")
	_, err := New(&rest.Config{Host: "http://127.0.0.1:1"}, "train", corev1.SchemeGroupVersion, func(*runtime.Scheme) error { return bad })
	if !errors.Is(err, bad) {
		t.Errorf("got %v, want the scheme's error", err)
	}
}

// Outside a pod (no KUBERNETES_SERVICE_HOST) every client fails with client-go's ErrNotInCluster, which the
// sidecar logs before it goes on without the API server.
func TestOutsideAPod(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	for name, connect := range map[string]func() (*Client, error){
		"CoreV1": CoreV1, "CoordinationV1": CoordinationV1, "DiscoveryV1": DiscoveryV1,
	} {
		if kc, err := connect(); !errors.Is(err, rest.ErrNotInCluster) || kc != nil {
			t.Errorf("%s: %v, %v; want rest.ErrNotInCluster", name, kc, err)
		}
	}
}

// Command patcher is what a pod of the job's namespace that is not the job's would run to move the job's rendezvous:
// with its own service account token (in-cluster config), it points EndpointSlice NAME at ADDRESS. TestInstallFromRegistry
// runs it, built static, in a pod running as the namespace's default account, and expects the API server to refuse.
// Usage: patcher NAMESPACE NAME ADDRESS
package main

import (
	"context"
	"fmt"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: patcher NAMESPACE NAME ADDRESS")
		os.Exit(2)
	}
	ns, name, addr := os.Args[1], os.Args[2], os.Args[3]
	cfg, err := rest.InClusterConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	patch := fmt.Sprintf(`[{"op":"replace","path":"/endpoints","value":[{"addresses":[%q]}]}]`, addr)
	if _, err := cs.DiscoveryV1().EndpointSlices(ns).Patch(context.Background(), name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("patched EndpointSlice %s/%s to %s\n", ns, name, addr)
}

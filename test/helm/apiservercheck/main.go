// Command apiservercheck runs rendered chart manifests through kube-apiserver's own create and update code
// without a cluster: strict decoding, defaulting, and the registry strategies' PrepareForCreate and validation
// (rest.BeforeCreate), then, for each scaled revision, the update validation of the live Job or StatefulSet with
// only the scale fields taken from the new revision (rest.BeforeUpdate), as Helm's patch would apply them.
//
// It is its own module because it imports k8s.io/kubernetes (pinned like the e2e cluster's tools). Usage:
//
//	CHART_MANIFESTS_DIR=/tmp/m go test ./test/helm -run TestWriteManifests
//	(cd test/helm/apiservercheck && go run . /tmp/m)
//
// The real kube-apiserver check (server-side dry-run) is test/e2e/chart.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/apis/apps"
	_ "k8s.io/kubernetes/pkg/apis/apps/install"
	"k8s.io/kubernetes/pkg/apis/batch"
	_ "k8s.io/kubernetes/pkg/apis/batch/install"
	"k8s.io/kubernetes/pkg/apis/core"
	_ "k8s.io/kubernetes/pkg/apis/core/install"
	_ "k8s.io/kubernetes/pkg/apis/networking/install"
	_ "k8s.io/kubernetes/pkg/apis/policy/install"
	"k8s.io/kubernetes/pkg/registry/apps/statefulset"
	"k8s.io/kubernetes/pkg/registry/batch/job"
	"k8s.io/kubernetes/pkg/registry/core/configmap"
	"k8s.io/kubernetes/pkg/registry/core/persistentvolumeclaim"
	"k8s.io/kubernetes/pkg/registry/core/pod"
	"k8s.io/kubernetes/pkg/registry/core/secret"
	"k8s.io/kubernetes/pkg/registry/core/service"
	"k8s.io/kubernetes/pkg/registry/networking/networkpolicy"
	"k8s.io/kubernetes/pkg/registry/policy/poddisruptionbudget"
)

const namespace = "ml"

type strategy interface {
	rest.RESTCreateStrategy
	rest.RESTUpdateStrategy
}

// strategies: every kind the job chart may render (anything else is an error).
var strategies = map[string]strategy{
	"ConfigMap": configmap.Strategy, "Secret": secret.Strategy, "Service": service.Strategy,
	"PersistentVolumeClaim": persistentvolumeclaim.Strategy, "Pod": pod.Strategy, "Job": job.Strategy,
	"StatefulSet": statefulset.Strategy, "NetworkPolicy": networkpolicy.Strategy,
	"PodDisruptionBudget": poddisruptionbudget.Strategy,
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: apiservercheck DIR   (DIR holds <scenario>.rev1.yaml and optional <scenario>.rev2.yaml)")
		os.Exit(2)
	}
	files, _ := filepath.Glob(filepath.Join(os.Args[1], "*.rev1.yaml"))
	sort.Strings(files)
	if len(files) == 0 {
		fmt.Fprintln(os.Stderr, "apiservercheck: no *.rev1.yaml in", os.Args[1])
		os.Exit(2)
	}
	created, updated, rejected := 0, 0, 0
	for _, f := range files {
		live := map[string]runtime.Object{}
		for _, d := range documents(f) {
			obj, gvk, err := decode(d)
			if err != nil {
				fmt.Printf("%s: decode: %v\n", filepath.Base(f), err)
				rejected++
				continue
			}
			s := strategies[gvk.Kind]
			if s == nil {
				fmt.Printf("%s: %s is not a kind a job install may create\n", filepath.Base(f), gvk.Kind)
				rejected++
				continue
			}
			m, _ := meta.Accessor(obj)
			m.SetNamespace(namespace)
			m.SetUID(types.UID("uid-" + m.GetName()))
			normalize(obj)
			if err := rest.BeforeCreate(s, request(gvk, "create"), obj); err != nil {
				fmt.Printf("%s: create %s %s: %v\n", filepath.Base(f), gvk.Kind, m.GetName(), err)
				rejected++
				continue
			}
			m.SetResourceVersion("1")
			live[gvk.Kind+"/"+m.GetName()] = obj
			created++
		}
		rev2 := strings.Replace(f, ".rev1.", ".rev2.", 1)
		if _, err := os.Stat(rev2); err != nil {
			continue
		}
		for _, d := range documents(rev2) {
			obj, gvk, err := decode(d)
			if err != nil {
				fmt.Printf("%s: decode: %v\n", filepath.Base(rev2), err)
				rejected++
				continue
			}
			m, _ := meta.Accessor(obj)
			old := live[gvk.Kind+"/"+m.GetName()]
			if old == nil || (gvk.Kind != "Job" && gvk.Kind != "StatefulSet") {
				continue
			}
			next := old.DeepCopyObject()
			scale(next, obj)
			if err := rest.BeforeUpdate(strategies[gvk.Kind], request(gvk, "update"), next, old); err != nil {
				fmt.Printf("%s: update %s %s: %v\n", filepath.Base(rev2), gvk.Kind, m.GetName(), err)
				rejected++
				continue
			}
			updated++
		}
	}
	fmt.Printf("apiservercheck: %d objects accepted on create, %d scaled workloads accepted on update, %d rejected\n", created, updated, rejected)
	if rejected > 0 {
		os.Exit(1)
	}
}

// documents splits a manifest file into YAML documents with a kind (comments such as NOTES.txt dropped).
func documents(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var out []string
	for _, d := range strings.Split("\n"+string(b), "\n---\n") {
		if strings.Contains(d, "\nkind:") {
			out = append(out, d)
		}
	}
	return out
}

// decode decodes strictly (unknown or duplicate fields fail), applies defaults and converts to the internal type.
func decode(doc string) (runtime.Object, *schema.GroupVersionKind, error) {
	codecs := serializer.NewCodecFactory(legacyscheme.Scheme, serializer.EnableStrict)
	obj, gvk, err := codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
	if err != nil {
		return nil, nil, err
	}
	legacyscheme.Scheme.Default(obj)
	in, err := legacyscheme.Scheme.ConvertToVersion(obj, schema.GroupVersion{Group: gvk.Group, Version: runtime.APIVersionInternal})
	return in, gvk, err
}

func request(gvk *schema.GroupVersionKind, verb string) context.Context {
	ctx := genericapirequest.WithNamespace(genericapirequest.NewContext(), namespace)
	return genericapirequest.WithRequestInfo(ctx, &genericapirequest.RequestInfo{IsResourceRequest: true, Verb: verb,
		APIGroup: gvk.Group, APIVersion: gvk.Version, Namespace: namespace, Resource: strings.ToLower(gvk.Kind) + "s"})
}

// normalize does what the Service REST storage does before the strategy runs (clusterIP -> clusterIPs).
func normalize(obj runtime.Object) {
	if s, ok := obj.(*core.Service); ok && s.Spec.ClusterIP != "" && len(s.Spec.ClusterIPs) == 0 {
		s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
	}
}

// scale copies the scale fields of src into dst, the live object.
func scale(dst, src runtime.Object) {
	switch d := dst.(type) {
	case *batch.Job:
		s := src.(*batch.Job)
		d.Spec.Parallelism, d.Spec.Completions = s.Spec.Parallelism, s.Spec.Completions
	case *apps.StatefulSet:
		d.Spec.Replicas = src.(*apps.StatefulSet).Spec.Replicas
	}
}

// Package naming holds the pure naming rules shared by the chart's tests, the
// webhook and the sidecar, so that the DNS names one part writes are the ones
// another part resolves.
package naming

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// DefaultClusterDomain is Kubernetes' default cluster DNS domain.
const DefaultClusterDomain = "cluster.local"

// HeadlessService is the headless Service that gives every pod of job a stable DNS name.
func HeadlessService(job string) string { return job }

// RendezvousService is the Service in front of the pod that serves the rendezvous.
func RendezvousService(job string) string { return job + "-rdzv" }

// Workload is the name of the Job or StatefulSet of one group.
func Workload(job, group string) string { return job + "-" + group }

// PodFQDN is the stable DNS name of a pod that has hostname and subdomain set.
func PodFQDN(hostname, subdomain, namespace, clusterDomain string) string {
	if clusterDomain == "" {
		clusterDomain = DefaultClusterDomain
	}
	return hostname + "." + subdomain + "." + namespace + ".svc." + clusterDomain
}

// ServiceFQDN is the DNS name of a Service.
func ServiceFQDN(service, namespace, clusterDomain string) string {
	if clusterDomain == "" {
		clusterDomain = DefaultClusterDomain
	}
	return service + "." + namespace + ".svc." + clusterDomain
}

// RendezvousEndpoint is host:port of the job's rendezvous as torchrun's --rdzv-endpoint wants it.
func RendezvousEndpoint(job, namespace, clusterDomain string, port int) string {
	return fmt.Sprintf("%s:%d", ServiceFQDN(RendezvousService(job), namespace, clusterDomain), port)
}

// StatefulSets parses a comma-separated list of StatefulSet names (the
// force-delete-lost-pods annotation and the sidecar's flag of the same value):
// every name a DNS label.
func StatefulSets(v string) ([]string, error) {
	if n := strings.Count(v, ",") + 1; n > constants.MaxForceDeleteSets {
		return nil, fmt.Errorf("%d names, more than a job has StatefulSets (at most %d)", n, constants.MaxForceDeleteSets)
	}
	names := strings.Split(v, ",")
	for _, name := range names {
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			return nil, fmt.Errorf("%q is not a StatefulSet name: %s", name, strings.Join(errs, "; "))
		}
	}
	return names, nil
}

package servinglease

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/elastic-training/elastic-training/internal/incluster"
)

// NewAPI is the API of the Lease and EndpointSlice called name, through the
// pod's clients of their groups. Both objects are the chart's (a job may
// create neither: its Role names them); it writes them with merge patches
// (RBAC: get and patch), the Lease's with its resourceVersion as
// precondition.
func NewAPI(leases, slices *incluster.Client, name string) API {
	return restAPI{leases: leases, slices: slices, name: name}
}

type restAPI struct {
	leases, slices *incluster.Client
	name           string
}

const requestTimeout = 5 * time.Second

func (a restAPI) GetLease(ctx context.Context) (Record, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	l := &coordinationv1.Lease{}
	if err := a.leases.API.Get().Namespace(a.leases.Namespace).Resource("leases").Name(a.name).Do(ctx).Into(l); err != nil {
		return Record{}, fmt.Errorf("get lease %s: %w", a.name, err)
	}
	return record(l), nil
}

func record(l *coordinationv1.Lease) Record {
	r := Record{Version: l.ResourceVersion, Holder: ptr.Deref(l.Spec.HolderIdentity, ""),
		Duration: time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second, Transitions: ptr.Deref(l.Spec.LeaseTransitions, 0)}
	if l.Spec.RenewTime != nil {
		r.Renewed = l.Spec.RenewTime.Time
	}
	if l.Spec.AcquireTime != nil {
		r.Acquired = l.Spec.AcquireTime.Time
	}
	return r
}

func (a restAPI) UpdateLease(ctx context.Context, rec Record) (Record, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	type spec struct {
		Holder      string            `json:"holderIdentity"`
		Duration    int32             `json:"leaseDurationSeconds"`
		Transitions int32             `json:"leaseTransitions"`
		Renew       metav1.MicroTime  `json:"renewTime"`
		Acquire     *metav1.MicroTime `json:"acquireTime,omitempty"`
	}
	type patch struct {
		Meta struct {
			Version string `json:"resourceVersion"`
		} `json:"metadata"`
		Spec spec `json:"spec"`
	}
	var p patch
	p.Meta.Version = rec.Version
	p.Spec = spec{Holder: rec.Holder, Duration: int32(rec.Duration / time.Second), Transitions: rec.Transitions, Renew: metav1.NewMicroTime(rec.Renewed)}
	if !rec.Acquired.IsZero() {
		p.Spec.Acquire = ptr.To(metav1.NewMicroTime(rec.Acquired))
	}
	body, err := json.Marshal(p)
	if err != nil {
		return Record{}, err
	}
	l := &coordinationv1.Lease{}
	err = a.leases.API.Patch(types.MergePatchType).Namespace(a.leases.Namespace).Resource("leases").Name(a.name).Body(body).Do(ctx).Into(l)
	if err != nil {
		return Record{}, fmt.Errorf("patch lease %s: %w", a.name, err)
	}
	return record(l), nil
}

func (a restAPI) Endpoint(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	s := &discoveryv1.EndpointSlice{}
	if err := a.slices.API.Get().Namespace(a.slices.Namespace).Resource("endpointslices").Name(a.name).Do(ctx).Into(s); err != nil {
		return "", fmt.Errorf("get endpointslice %s: %w", a.name, err)
	}
	for _, e := range s.Endpoints {
		if len(e.Addresses) > 0 {
			return e.Addresses[0], nil
		}
	}
	return "", nil
}

func (a restAPI) SetEndpoint(ctx context.Context, address, pod string) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	eps := []discoveryv1.Endpoint{}
	if address != "" {
		eps = append(eps, discoveryv1.Endpoint{
			Addresses:  []string{address},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: a.slices.Namespace, Name: pod},
		})
	}
	// A merge patch replaces the list whole.
	body, err := json.Marshal(map[string]any{"endpoints": eps})
	if err != nil {
		return err
	}
	err = a.slices.API.Patch(types.MergePatchType).Namespace(a.slices.Namespace).Resource("endpointslices").Name(a.name).Body(body).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("patch endpointslice %s: %w", a.name, err)
	}
	return nil
}

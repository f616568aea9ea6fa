package lostpods

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/elastic-training/elastic-training/internal/incluster"
)

// NewAPI is API through the pod's own token: get and delete pods by name in
// its namespace, which is all the job's Role grants (resourceNames: the
// StatefulSets' pod names).
func NewAPI(c *incluster.Client) API { return restAPI{c} }

type restAPI struct{ c *incluster.Client }

const requestTimeout = 10 * time.Second

func (a restAPI) Get(ctx context.Context, name string) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	p := &corev1.Pod{}
	err := a.c.API.Get().Namespace(a.c.Namespace).Resource("pods").Name(name).Do(ctx).Into(p)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (a restAPI) ForceDelete(ctx context.Context, name string, uid types.UID) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	opts := metav1.DeleteOptions{GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &uid}}
	err := a.c.API.Delete().Namespace(a.c.Namespace).Resource("pods").Name(name).Body(&opts).Do(ctx).Error()
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

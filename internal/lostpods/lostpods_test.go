package lostpods

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// pod is a StatefulSet pod as the API shows it; evicted adds what the taint manager leaves on a pod of a lost node.
func pod(name string, evicted bool, owner string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)}}
	if owner != "" {
		yes := true
		p.OwnerReferences = []metav1.OwnerReference{{Kind: owner, Name: "mpi-worker", Controller: &yes}}
	}
	if evicted {
		p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
			Reason: "DeletionByTaintManager", Message: "Taint manager: deleting due to NoExecute taint"}}
	}
	return p
}

func TestLost(t *testing.T) {
	deleting := pod("mpi-worker-1", false, "StatefulSet")
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()} // scale-down, a drain: the kubelet is there
	preempted := pod("mpi-worker-1", true, "StatefulSet")
	preempted.Status.Conditions[0].Reason = "PreemptionByScheduler"
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"running", pod("mpi-worker-1", false, "StatefulSet"), false},
		{"deleted with a kubelet to confirm", deleting, false},
		{"preempted", preempted, false},
		{"evicted from a lost node", pod("mpi-worker-1", true, "StatefulSet"), true},
		{"a Job's pod evicted (the Job replaces it)", pod("mpi-launcher-x", true, "Job"), false},
		{"no owner", pod("mpi-worker-1", true, ""), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, got := Lost(tc.pod)
			assert.Equal(t, tc.want, got)
		})
	}
}

// fakeAPI is an in-memory pod table; the API server's own behaviour is what the e2e test TestNodeLossMPI proves.
type fakeAPI struct {
	mu      sync.Mutex
	pods    map[string]*corev1.Pod
	gets    map[string]int
	deleted chan string
}

func (f *fakeAPI) Get(_ context.Context, name string) (*corev1.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gets[name]++
	return f.pods[name], nil
}

func (f *fakeAPI) ForceDelete(_ context.Context, name string, uid types.UID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.pods[name]; p != nil && p.UID == uid {
		delete(f.pods, name)
		f.deleted <- name
	}
	return nil
}

func (f *fakeAPI) set(p *corev1.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods[p.Name] = p
}

func (f *fakeAPI) getCount(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gets[name]
}

func TestReaper(t *testing.T) {
	api := &fakeAPI{pods: map[string]*corev1.Pod{}, gets: map[string]int{}, deleted: make(chan string, 8)}
	for _, n := range []string{"mpi-worker-0", "mpi-worker-1", "mpi-wide-0", "mpi-launcher-0"} {
		api.set(pod(n, false, "StatefulSet"))
	}
	ctx, cancel := context.WithCancel(t.Context())
	r := New(ctx, Config{API: api, StatefulSets: []string{"mpi-worker", "mpi-wide"}, Interval: time.Millisecond})
	r.MembersChanged(nil, []string{"mpi-worker-1.mpi.ns.svc.cluster.local", "mpi-wide-0.mpi.ns.svc.cluster.local",
		"mpi-launcher-0.mpi.ns.svc.cluster.local", "mpi-workers-0.mpi.ns.svc.cluster.local"})

	// Left but not evicted: watched, never deleted. Then Kubernetes evicts mpi-worker-1 from its lost node.
	require.Eventually(t, func() bool { return api.getCount("mpi-worker-1") > 3 && api.getCount("mpi-wide-0") > 3 },
		10*time.Second, time.Millisecond)
	api.set(pod("mpi-worker-1", true, "StatefulSet"))
	select {
	case name := <-api.deleted:
		assert.Equal(t, "mpi-worker-1", name)
	case <-time.After(10 * time.Second):
		t.Fatal("the evicted pod was not deleted")
	}
	// mpi-wide-0 comes back (its sidecar registers again): no longer watched, even once evicted.
	r.MembersChanged([]string{"mpi-wide-0.mpi.ns.svc.cluster.local"}, nil)
	require.Eventually(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.watching) == 0 },
		10*time.Second, time.Millisecond)
	api.set(pod("mpi-wide-0", true, "StatefulSet"))
	cancel()
	r.Wait()
	close(api.deleted)
	for name := range api.deleted {
		t.Errorf("%s deleted: its member came back", name)
	}
	// Pods of other sets or of none were never looked at.
	assert.Zero(t, api.getCount("mpi-launcher-0"))
	assert.Zero(t, api.getCount("mpi-workers-0"))
	// After the end, a member leaving starts nothing.
	r.MembersChanged(nil, []string{"mpi-worker-0.mpi.ns.svc.cluster.local"})
	r.Wait()
	assert.Zero(t, api.getCount("mpi-worker-0"))
}

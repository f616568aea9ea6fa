package helm_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/naming"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// What a real GPU cluster needs on its first day, as the chart renders it: shared memory, init and extra containers,
// extra objects, image digests, a service account of the job's own, a parent chart's global values, resources that
// merge, and disruption budgets that let a node drain.

func pytorchJob(t *testing.T, over map[string]any) map[string]any {
	return merge(merge(pinned(t), map[string]any{"command": []any{"torchrun", "train.py"}}), over)
}

func workerPod(t *testing.T, vals map[string]any) corev1.PodTemplateSpec {
	t.Helper()
	r, err := render(chartrender.Load(t, chartDir), vals, chartrender.Options{})
	require.NoError(t, err)
	return podSpecs(t, r)["Job/"+naming.Workload(release, "worker")]
}

func trainerOf(t *testing.T, p corev1.PodTemplateSpec) corev1.Container {
	t.Helper()
	for _, c := range p.Spec.Containers {
		if c.Name == "trainer" {
			return c
		}
	}
	t.Fatal("no trainer container")
	return corev1.Container{}
}

func TestSharedMemory(t *testing.T) {
	for name, c := range map[string]struct {
		over  map[string]any
		mount bool
		size  string // "": no sizeLimit
	}{
		"on by default":       {nil, true, ""},
		"sized":               {map[string]any{"shm": map[string]any{"sizeLimit": "16Gi"}}, true, "16Gi"},
		"sized for a group":   {map[string]any{"workers": map[string]any{"shm": map[string]any{"sizeLimit": "8Gi"}}}, true, "8Gi"},
		"off":                 {map[string]any{"shm": map[string]any{"enabled": false}}, false, ""},
		"off for one group":   {map[string]any{"workers": map[string]any{"shm": map[string]any{"enabled": false}}}, false, ""},
		"on again in a group": {map[string]any{"shm": map[string]any{"enabled": false}, "workers": map[string]any{"shm": map[string]any{"enabled": true}}}, true, ""},
	} {
		t.Run(name, func(t *testing.T) {
			p := workerPod(t, pytorchJob(t, c.over))
			var vol *corev1.Volume
			for i, v := range p.Spec.Volumes {
				if v.Name == "dshm" {
					vol = &p.Spec.Volumes[i]
				}
			}
			mounted := false
			for _, m := range trainerOf(t, p).VolumeMounts {
				if m.Name == "dshm" {
					mounted = m.MountPath == "/dev/shm"
				}
			}
			require.Equal(t, c.mount, vol != nil && mounted, "volume %v", vol)
			if !c.mount {
				return
			}
			require.NotNil(t, vol.EmptyDir)
			assert.Equal(t, corev1.StorageMediumMemory, vol.EmptyDir.Medium)
			if c.size == "" {
				assert.Nil(t, vol.EmptyDir.SizeLimit)
			} else {
				assert.Equal(t, resource.MustParse(c.size), *vol.EmptyDir.SizeLimit)
			}
		})
	}
}

// Init containers run after the chart's own (MPI's ssh-setup) and, once the webhook has put its sidecar first,
// after the rendezvous sidecar; extra containers run beside the trainer. A group's lists are appended.
func TestInitAndExtraContainers(t *testing.T) {
	vals := pytorchJob(t, map[string]any{
		"initContainers":  []any{map[string]any{"name": "fetch-data", "image": "busybox"}},
		"extraContainers": []any{map[string]any{"name": "log-shipper", "image": "fluent-bit"}},
		"workers": map[string]any{
			"initContainers":  []any{map[string]any{"name": "warm-cache", "image": "busybox"}},
			"extraContainers": []any{map[string]any{"name": "exporter", "image": "dcgm-exporter"}},
		},
	})
	p := workerPod(t, vals)
	var inits, containers []string
	for _, c := range p.Spec.InitContainers {
		inits = append(inits, c.Name)
	}
	for _, c := range p.Spec.Containers {
		containers = append(containers, c.Name)
	}
	assert.Equal(t, []string{"fetch-data", "warm-cache"}, inits)
	assert.Equal(t, []string{"trainer", "log-shipper", "exporter"}, containers)

	mpi := merge(pinned(t), map[string]any{"framework": "mpi", "mpi": map[string]any{"launcher": map[string]any{"command": []any{"mpirun"}}},
		"initContainers": []any{map[string]any{"name": "fetch-data", "image": "busybox"}}})
	r, err := render(chartrender.Load(t, chartDir), mpi, chartrender.Options{})
	require.NoError(t, err)
	launcher := podSpecs(t, r)["Job/"+naming.Workload(release, "launcher")]
	require.Len(t, launcher.Spec.InitContainers, 2)
	assert.Equal(t, "ssh-setup", launcher.Spec.InitContainers[0].Name)
	assert.Equal(t, "fetch-data", launcher.Spec.InitContainers[1].Name)
}

// An MPI pod whose image lacks OpenSSH fails in ssh-setup, saying what it lacks, instead of "not found".
func TestMPIImageWithoutSSHSaysSo(t *testing.T) {
	r, err := render(chartrender.Load(t, chartDir), merge(pinned(t), map[string]any{"framework": "mpi",
		"mpi": map[string]any{"launcher": map[string]any{"command": []any{"mpirun"}}}}), chartrender.Options{})
	require.NoError(t, err)
	for key, p := range podSpecs(t, r) {
		setup := p.Spec.InitContainers[0]
		require.Equal(t, "ssh-setup", setup.Name, key)
		want := "for b in ssh-keygen ssh;"
		if strings.Contains(key, "worker") {
			want = "for b in ssh-keygen /usr/sbin/sshd;"
		}
		assert.Contains(t, setup.Args[0], want, key)
		assert.Contains(t, setup.Args[0], "MPI pods need OpenSSH in the trainer image", key)
		assert.Equal(t, corev1.TerminationMessageFallbackToLogsOnError, setup.TerminationMessagePolicy, key)
	}
}

func TestExtraObjects(t *testing.T) {
	vals := pytorchJob(t, map[string]any{"extraObjects": []any{
		map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "plain"}, "data": map[string]any{"k": "v"}},
		"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-templated\ndata:\n  workers: \"{{ .Values.workers.replicas }}\"\n",
	}})
	r, err := render(chartrender.Load(t, chartDir), vals, chartrender.Options{})
	require.NoError(t, err)
	plain := r.Find("ConfigMap", "plain")
	require.NotNil(t, plain)
	templated := r.Find("ConfigMap", release+"-templated")
	require.NotNil(t, templated)
	got, _, _ := unstructured.NestedString(templated.Object, "data", "workers")
	assert.Equal(t, "2", got)
}

func TestImageDigest(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	vals := pytorchJob(t, map[string]any{"image": map[string]any{"repository": "nvcr.io/nvidia/pytorch", "tag": "25.01-py3", "digest": digest}})
	assert.Equal(t, "nvcr.io/nvidia/pytorch@"+digest, trainerOf(t, workerPod(t, vals)).Image)
	group := pytorchJob(t, map[string]any{"workers": map[string]any{"image": map[string]any{"digest": digest}}})
	assert.Equal(t, "pytorch/pytorch@"+digest, trainerOf(t, workerPod(t, group)).Image, "a group's digest, the shared repository")
}

// Least privilege by default: the chart makes the job's own account, every pod (the dedicated rendezvous pod too)
// runs as it, and the serving sidecars' Role is bound to it alone, never to the namespace's default account, which
// every other pod of the namespace runs as (it could point the rendezvous Service at a store of its own).
func TestJobServiceAccount(t *testing.T) {
	for name, c := range map[string]struct {
		over    map[string]any
		account string
		created bool
	}{
		"default":                {nil, release, true},
		"created, named":         {map[string]any{"serviceAccount": map[string]any{"name": "trainers"}}, "trainers", true},
		"existing":               {map[string]any{"serviceAccount": map[string]any{"create": false, "name": "existing"}}, "existing", false},
		"serviceAccountName":     {map[string]any{"serviceAccountName": "trainer"}, "trainer", false},
		"created, dedicated pod": {map[string]any{"rendezvous": map[string]any{"placement": "dedicated"}}, release, true},
		"default named":          {map[string]any{"serviceAccount": map[string]any{"create": false}, "serviceAccountName": "default"}, "default", false},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := render(chartrender.Load(t, chartDir), pytorchJob(t, c.over), chartrender.Options{})
			require.NoError(t, err)
			assert.Equal(t, c.created, r.Find("ServiceAccount", c.account) != nil)
			n := 0
			for key, p := range podSpecs(t, r) {
				assert.Equal(t, c.account, p.Spec.ServiceAccountName, key)
				assert.False(t, p.Spec.AutomountServiceAccountToken == nil || *p.Spec.AutomountServiceAccountToken, "%s: the trainer gets no API token", key)
				n++
			}
			require.NotZero(t, n)
			binding := r.Find("RoleBinding", release+"-rdzv")
			require.NotNil(t, binding)
			subjects, _, _ := unstructured.NestedSlice(binding.Object, "subjects")
			require.Len(t, subjects, 1)
			assert.Equal(t, c.account, subjects[0].(map[string]any)["name"])
		})
	}
}

// With no account of the job's own, the Role would go to the namespace's default account: refused at install,
// saying what to set; an upgrade of a job installed so (by an older chart, --reuse-values) still scales.
func TestDefaultAccountRefused(t *testing.T) {
	vals := pytorchJob(t, map[string]any{"serviceAccount": map[string]any{"create": false}})
	_, err := render(chartrender.Load(t, chartDir), vals, chartrender.Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "serviceAccount.create is false and no account is named")
	assert.Contains(t, err.Error(), "Leave serviceAccount.create true")
	_, err = render(chartrender.Load(t, chartDir), vals, chartrender.Options{Revision: 2})
	assert.NoError(t, err, "an upgrade keeps what the job was installed with")
}

// A parent chart's global values reach a subchart: accepted, read by nothing.
func TestGlobalValuesAccepted(t *testing.T) {
	_, err := render(chartrender.Load(t, chartDir), pytorchJob(t, map[string]any{"global": map[string]any{"imageRegistry": "registry.example.com"}}), chartrender.Options{})
	require.NoError(t, err)
}

// A group that sets some resources keeps the shared ones it does not set (the group's win per resource).
func TestResourcesMerge(t *testing.T) {
	vals := pytorchJob(t, map[string]any{
		"resources": map[string]any{"requests": map[string]any{"cpu": "8", "memory": "64Gi"}, "limits": map[string]any{"memory": "64Gi"}},
		"workers":   map[string]any{"gpus": 8, "resources": map[string]any{"requests": map[string]any{"cpu": "16"}}},
	})
	res := trainerOf(t, workerPod(t, vals)).Resources
	assert.Equal(t, resource.MustParse("16"), res.Requests[corev1.ResourceCPU], "the group's cpu wins")
	assert.Equal(t, resource.MustParse("64Gi"), res.Requests[corev1.ResourceMemory], "the shared memory request stays")
	assert.Equal(t, resource.MustParse("64Gi"), res.Limits[corev1.ResourceMemory])
	assert.Equal(t, resource.MustParse("8"), res.Limits["nvidia.com/gpu"])
}

// Disruption budgets let a node drain: maxUnavailable pods of a group at a time, none for preemptible groups, and
// none for the dedicated rendezvous pod (one pod cannot be protected without blocking its node for ever).
func TestDisruptionBudgetsLetNodesDrain(t *testing.T) {
	r, err := render(chartrender.Load(t, chartDir), merge(sc(t, "examples/elasticdl-priorities.yaml"), pinned(t)), chartrender.Options{})
	require.NoError(t, err)
	var budgets []string
	for _, o := range r.Objects {
		if o.Kind != "PodDisruptionBudget" {
			continue
		}
		budgets = append(budgets, o.Name)
		assert.Equal(t, int64(1), nested(t, o, "maxUnavailable"), o.Name)
		_, minSet, _ := unstructured.NestedFieldNoCopy(o.Obj, "spec", "minAvailable")
		assert.False(t, minSet, "%s: minAvailable would block a drain of a group at its minimum", o.Name)
	}
	assert.Equal(t, []string{release + "-worker"}, budgets, "the core group only: burst is preemptible, rdzv is one pod")
}

func sc(t *testing.T, path string) map[string]any {
	t.Helper()
	return chartrender.ReadValues(t, "../../"+path)
}

// The upgrade that forgets --reuse-values says so.
func TestUpgradeWithoutReuseValuesSaysSo(t *testing.T) {
	_, err := render(chartrender.Load(t, chartDir), pytorchJob(t, map[string]any{"workers": map[string]any{"replicas": 6}}), chartrender.Options{Revision: 2})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "workers: replicas 6 is outside minReplicas..maxReplicas (1..4)")
	assert.Contains(t, err.Error(), "add --reuse-values")
}

// Host networking: the pods run on their node's network, and the sidecar of every pod listens on five ports of the
// job's own (annotation rdzv-ports), which the rendezvous Service targets, so that two jobs' pods on one node do not
// collide; the chart and the webhook agree on them.
func TestHostNetwork(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	base := func(t *testing.T, r *chartrender.Rendered) int32 {
		t.Helper()
		p := podSpecs(t, r)["Job/"+naming.Workload(release, "worker")]
		b, err := strconv.Atoi(p.Annotations[constants.AnnotationRdzvPorts])
		require.NoError(t, err, "annotation %s", constants.AnnotationRdzvPorts)
		return int32(b)
	}
	r, err := render(ch, pytorchJob(t, map[string]any{"hostNetwork": true}), chartrender.Options{})
	require.NoError(t, err)
	p := podSpecs(t, r)["Job/"+naming.Workload(release, "worker")]
	assert.True(t, p.Spec.HostNetwork)
	assert.Equal(t, corev1.DNSClusterFirstWithHostNet, p.Spec.DNSPolicy, "the pods still resolve the job's Services")
	b := base(t, r)
	assert.True(t, b >= 20000 && b <= 30990 && b%10 == 0, "base %d", b)

	// The Service targets the serving sidecar's ports, which the webhook gives it from the same annotation.
	svc := findObject(t, r, "Service", naming.RendezvousService(release))
	targets := map[string]int{}
	ports, _, _ := unstructured.NestedSlice(svc.Obj, "spec", "ports")
	for _, x := range ports {
		m := x.(map[string]any)
		targets[m["name"].(string)] = toInt(m["targetPort"])
	}
	want := constants.PortsFrom(b)
	assert.Equal(t, map[string]int{"client": int(want.Client), "health": int(want.Health), "c10d": int(want.C10d)}, targets)
	sc, _ := injectedSidecar(t, servingPod(t, *findObject(t, r, "Job", naming.Workload(release, "worker"))), naming.DefaultClusterDomain)
	assert.Contains(t, sc.Args, fmt.Sprintf("--c10d-addr=:%d", want.C10d))
	assert.Contains(t, sc.Args, fmt.Sprintf("--health-addr=:%d", want.Health))
	assert.Contains(t, sc.Args, fmt.Sprintf("--listen-client-urls=http://0.0.0.0:%d", want.Client))

	// Another job (or namespace) picks other ports; a base may be given.
	other, err := render(ch, pytorchJob(t, map[string]any{"hostNetwork": true, "fullnameOverride": "other-job"}), chartrender.Options{})
	require.NoError(t, err)
	p2 := podSpecs(t, other)["Job/other-job-worker"]
	assert.NotEqual(t, fmt.Sprint(b), p2.Annotations[constants.AnnotationRdzvPorts])
	given, err := render(ch, pytorchJob(t, map[string]any{"hostNetwork": true, "hostNetworkPortBase": 24000}), chartrender.Options{})
	require.NoError(t, err)
	assert.Equal(t, int32(24000), base(t, given))

	// Pod networking: the defaults, no annotation.
	def, err := render(ch, pytorchJob(t, nil), chartrender.Options{})
	require.NoError(t, err)
	assert.NotContains(t, podSpecs(t, def)["Job/"+naming.Workload(release, "worker")].Annotations, constants.AnnotationRdzvPorts)

	for _, bad := range []struct {
		vals map[string]any
		want string
	}{
		{merge(pinned(t), map[string]any{"framework": "mpi", "hostNetwork": true, "mpi": map[string]any{"launcher": map[string]any{"command": []any{"mpirun"}}}}),
			"hostNetwork: a mpi job's pods listen on fixed ports (MPI's sshd on 22"},
		{pytorchJob(t, map[string]any{"hostNetwork": true, "hostNetworkPortBase": 80}), "hostNetworkPortBase: 80 is outside 1024..32763"},
	} {
		_, err := render(ch, bad.vals, chartrender.Options{})
		require.Error(t, err)
		assert.Contains(t, err.Error(), bad.want)
	}
}

// queue.kueue: every Job carries the LocalQueue label, and a Job whose replicas may change (minReplicas <
// maxReplicas) Kueue's elastic-Job annotation, which must be there from the first install (Kueue refuses to add or
// remove it later); a fixed group (the MXNet workers, minReplicas = maxReplicas) does not.
func TestKueueElasticJobAnnotation(t *testing.T) {
	for name, c := range map[string]struct {
		over    map[string]any
		elastic bool
	}{
		"elastic workers": {map[string]any{"queue": map[string]any{"kueue": "lq"}}, true},
		"fixed workers":   {map[string]any{"queue": map[string]any{"kueue": "lq"}, "workers": map[string]any{"replicas": 2, "minReplicas": 2, "maxReplicas": 2}}, false},
		"no queue":        {map[string]any{}, false},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := render(chartrender.Load(t, chartDir), pytorchJob(t, c.over), chartrender.Options{})
			require.NoError(t, err)
			job := r.Find("Job", naming.Workload(release, "worker"))
			require.NotNil(t, job)
			_, queued := job.GetLabels()["kueue.x-k8s.io/queue-name"]
			assert.Equal(t, c.over["queue"] != nil, queued, "queue label")
			assert.Equal(t, c.elastic, job.GetAnnotations()["kueue.x-k8s.io/elastic-job"] == "true", "elastic-job annotation")
		})
	}
}

// queue.volcano: one PodGroup for the whole job (Volcano's own type, decoded strictly by TestObjectsDecodeStrictly),
// minMember the minimum of every group, which every trainer pod names and whose queue it is; those pods go to
// Volcano's scheduler (the dedicated rendezvous pod stays the default scheduler's, outside the gang). Checked as rendered only: Volcano cannot be built here (docs/queues.md).
func TestVolcanoPodGroup(t *testing.T) {
	for name, c := range map[string]struct {
		vals      map[string]any
		minMember int64
	}{
		"elastic PyTorch": {pytorchJob(t, map[string]any{"workers": map[string]any{"replicas": 3, "minReplicas": 2, "maxReplicas": 4}}), 2},
		"MPI":             {merge(sc(t, "examples/mpi-horovod.yaml"), pinned(t)), 1 + 1 + 1}, // launcher, a100 and v100 minimums
		"ElasticDL":       {merge(sc(t, "examples/elasticdl-priorities.yaml"), pinned(t)), -1},
	} {
		t.Run(name, func(t *testing.T) {
			vals := merge(c.vals, map[string]any{"queue": map[string]any{"volcano": "research"}})
			r, err := render(chartrender.Load(t, chartDir), vals, chartrender.Options{})
			require.NoError(t, err)
			pg := r.Find("PodGroup", release)
			require.NotNil(t, pg, "no PodGroup %s", release)
			queue, _, _ := unstructured.NestedString(pg.Object, "spec", "queue")
			assert.Equal(t, "research", queue)
			minMember, _, _ := unstructured.NestedFieldNoCopy(pg.Object, "spec", "minMember")
			if c.minMember >= 0 {
				assert.EqualValues(t, c.minMember, minMember)
			}
			for key, p := range podSpecs(t, r) {
				if strings.HasPrefix(key, "Deployment/") {
					continue // the dedicated rendezvous pod: the default scheduler's, outside the gang
				}
				assert.Equal(t, release, p.Annotations["scheduling.k8s.io/group-name"], "%s: group-name", key)
				assert.Equal(t, "volcano", p.Spec.SchedulerName, "%s: schedulerName", key)
			}
		})
	}
}

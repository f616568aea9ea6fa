package mutate

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	kjson "sigs.k8s.io/json"

	"github.com/elastic-training/elastic-training/internal/constants"
)

func checkpointVolume() corev1.Volume {
	return corev1.Volume{Name: constants.CheckpointVolumeName, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
		Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity(1<<30, resource.BinarySI)}}}
}

// base is a valid pytorch member; each bad case breaks one thing.
func base(t testing.TB) *corev1.Pod {
	return readPod(t, "testdata/pytorch-worker3-joins.yaml")
}

func TestDenied(t *testing.T) {
	cases := []struct {
		desc  string
		edit  func(p *corev1.Pod)
		wants []string // substrings of the message
	}{
		{"framework missing", func(p *corev1.Pod) { delete(p.Annotations, constants.AnnotationFramework) },
			[]string{"annotation elastic-training.io/framework is missing", "one of custom, mpi, mxnet, pytorch"}},
		{"framework typo", func(p *corev1.Pod) { p.Annotations[constants.AnnotationFramework] = "pytroch" },
			[]string{`elastic-training.io/framework="pytroch" is invalid`}},
		{"role not known to framework", func(p *corev1.Pod) { p.Labels[constants.LabelRole] = "launcher" },
			[]string{`label elastic-training.io/role="launcher" is invalid: want one of worker for framework pytorch`}},
		{"role missing", func(p *corev1.Pod) { delete(p.Labels, constants.LabelRole) },
			[]string{"label elastic-training.io/role is missing"}},
		{"job not a DNS label", func(p *corev1.Pod) { p.Labels[constants.LabelJob] = "Bert_Large" },
			[]string{`label elastic-training.io/job="Bert_Large" is invalid: want a DNS label`}},
		{"job name too long for the rdzv Service", func(p *corev1.Pod) {
			p.Labels[constants.LabelJob] = "a23456789012345678901234567890123456789012345678901234567890"
		},
			[]string{"at most 58 characters"}},
		{"min nodes not a number", func(p *corev1.Pod) { p.Annotations[constants.AnnotationMinNodes] = "two" },
			[]string{`elastic-training.io/min-nodes="two" is invalid: want a whole number from 1 to 100000`}},
		{"max nodes missing", func(p *corev1.Pod) { delete(p.Annotations, constants.AnnotationMaxNodes) },
			[]string{"annotation elastic-training.io/max-nodes is missing"}},
		{"min greater than max", func(p *corev1.Pod) { p.Annotations[constants.AnnotationMinNodes] = "9" },
			[]string{"elastic-training.io/min-nodes=9 is greater than elastic-training.io/max-nodes=8"}},
		{"run id missing", func(p *corev1.Pod) { delete(p.Annotations, constants.AnnotationRunID) },
			[]string{"annotation elastic-training.io/run-id is missing"}},
		{"run id with a slash", func(p *corev1.Pod) { p.Annotations[constants.AnnotationRunID] = "a/b" },
			[]string{`elastic-training.io/run-id="a/b" is invalid`}},
		{"warm start not a boolean", func(p *corev1.Pod) { p.Annotations[constants.AnnotationWarmStart] = "yes" },
			[]string{`elastic-training.io/warm-start="yes" is invalid: want one of true, false`}},
		{"unknown backend", func(p *corev1.Pod) { p.Annotations[constants.AnnotationRdzvBackend] = "zookeeper" },
			[]string{`elastic-training.io/rdzv-backend="zookeeper" is invalid: want one of etcd-v2, etcd, c10d`}},
		{"negative timeout", func(p *corev1.Pod) { p.Annotations[constants.AnnotationRdzvLastCallTimeout] = "-5" },
			[]string{`elastic-training.io/rdzv-last-call-timeout="-5" is invalid: want a whole number from 1 to 86400 (seconds)`}},
		{"lease TTL below etcd's minimum", func(p *corev1.Pod) { p.Annotations[constants.AnnotationRdzvLeaseTTL] = "1" },
			[]string{`elastic-training.io/rdzv-lease-ttl="1" is invalid: want a whole number from 2 to 60 (seconds)`}},
		{"hang timeout not seconds", func(p *corev1.Pod) { p.Annotations[constants.AnnotationHangTimeout] = "soon" },
			[]string{`elastic-training.io/hang-timeout="soon" is invalid: want a whole number from 1 to 86400 (seconds, or "off")`}},
		{"monitor interval below torch's", func(p *corev1.Pod) { p.Annotations[constants.AnnotationMonitorInterval] = "0.01" },
			[]string{`elastic-training.io/monitor-interval="0.01" is invalid: want seconds from 0.1 to 3600, such as 0.5`}},
		{"monitor interval not a number", func(p *corev1.Pod) { p.Annotations[constants.AnnotationMonitorInterval] = "NaN" },
			[]string{`elastic-training.io/monitor-interval="NaN" is invalid`}},
		{"duration instead of seconds", func(p *corev1.Pod) { p.Annotations[constants.AnnotationRdzvJoinTimeout] = "10m" },
			[]string{`elastic-training.io/rdzv-join-timeout="10m" is invalid`}},
		{"slots zero", func(p *corev1.Pod) { p.Annotations[constants.AnnotationSlots] = "0" },
			[]string{`elastic-training.io/slots="0" is invalid: want a whole number from 1 to 1024`}},
		{"slots absurd", func(p *corev1.Pod) { p.Annotations[constants.AnnotationSlots] = "40000" },
			[]string{`elastic-training.io/slots="40000" is invalid`}},
		{"rdzv-host not a bool", func(p *corev1.Pod) { p.Annotations[constants.AnnotationRdzvHost] = "yes" },
			[]string{`elastic-training.io/rdzv-host="yes" is invalid: want "true" or "false"`}},
		{"mpi flavour typo", func(p *corev1.Pod) { p.Annotations[constants.AnnotationMPIFlavour] = "open-mpi" },
			[]string{`elastic-training.io/mpi-flavour="open-mpi" is invalid: want one of openmpi, mpich, intelmpi`}},
		{"container annotation names no container", func(p *corev1.Pod) { p.Annotations[constants.AnnotationContainer] = "train" },
			[]string{`elastic-training.io/container="train" is invalid: want the name of one of the pod's containers (trainer)`}},
		{"two kinds of accelerator", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Limits["amd.com/gpu"] = p.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]
		}, []string{"more than one kind of accelerator (amd.com/gpu=4, nvidia.com/gpu=4)", "set annotation elastic-training.io/slots"}},
		{"no index", func(p *corev1.Pod) { delete(p.Annotations, "batch.kubernetes.io/job-completion-index") },
			[]string{"pod index unknown", "batch.kubernetes.io/job-completion-index", "apps.kubernetes.io/pod-index"}},
		{"bad index", func(p *corev1.Pod) { p.Annotations["batch.kubernetes.io/job-completion-index"] = "x" },
			[]string{`annotation batch.kubernetes.io/job-completion-index="x" is invalid`}},
		{"no stable hostname", func(p *corev1.Pod) { p.Spec.Hostname = "" },
			[]string{"pod has neither spec.hostname nor a name"}},
		{"reserved container name", func(p *corev1.Pod) { p.Spec.Containers[0].Name = constants.SidecarContainerName },
			[]string{`container name "rdzv-sidecar" is reserved`}},
		{"files dir taken", func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: constants.FilesDir}}
		}, []string{`mounts volume "data" at /etc/elastic-training`}},
		{"reserved volume name with another source", func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: constants.FilesVolumeName, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/x"}}}}
		}, []string{`volume name "elastic-training" is reserved`}},
		{"port taken by the trainer", func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: constants.SidecarHealthPort}}
		}, []string{`container "trainer" declares port 2381, which is the rendezvous sidecar's health port`}},
		{"c10d port taken in a pod that does not serve", func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: constants.C10dPort}}
		}, []string{`container "trainer" declares port 29400, which is the c10d store's port`}},
		{"tls secret not a DNS subdomain", func(p *corev1.Pod) { p.Annotations[constants.AnnotationRdzvTLSSecret] = "Rdzv_Certs" },
			[]string{`annotation elastic-training.io/rdzv-tls-secret="Rdzv_Certs" is invalid: want the name of a Secret`}},
		{"force-delete-lost-pods not StatefulSet names", func(p *corev1.Pod) { p.Annotations[constants.AnnotationForceDeleteLostPods] = "hvd-worker,,Hvd" },
			[]string{`annotation elastic-training.io/force-delete-lost-pods="hvd-worker,,Hvd" is invalid: want comma-separated names of the job's StatefulSets (DNS labels, at most 64): "" is not a StatefulSet name`}},
		{"ports below the unprivileged", func(p *corev1.Pod) { p.Annotations[constants.AnnotationRdzvPorts] = "80" },
			[]string{`annotation elastic-training.io/rdzv-ports="80" is invalid: want a whole number from 1024 to 32763 (the first of 5 ports)`}},
		{"a trainer port on the job's own c10d port", func(p *corev1.Pod) {
			p.Annotations[constants.AnnotationRdzvPorts] = "20340"
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 20343}}
		}, []string{`container "trainer" declares port 20343, which is the c10d store's port`}},
		{"standbys not a number", func(p *corev1.Pod) { p.Annotations[constants.AnnotationRdzvStandbys] = "one" },
			[]string{`annotation elastic-training.io/rdzv-standbys="one" is invalid: want a whole number from 0 to 8`}},
		{"too many standbys", func(p *corev1.Pod) { p.Annotations[constants.AnnotationRdzvStandbys] = "9" },
			[]string{`annotation elastic-training.io/rdzv-standbys="9" is invalid: want a whole number from 0 to 8`}},
		{"standbys with an etcd backend", func(p *corev1.Pod) {
			p.Annotations[constants.AnnotationRdzvStandbys] = "1"
			p.Annotations[constants.AnnotationRdzvBackend] = constants.BackendEtcdV2
		}, []string{"annotation elastic-training.io/rdzv-standbys=1 with elastic-training.io/rdzv-backend=etcd-v2: standbys serve the c10d store only"}},
		{"standbys of an MPI job", func(p *corev1.Pod) {
			p.Annotations[constants.AnnotationRdzvStandbys] = "1"
			p.Annotations[constants.AnnotationFramework] = constants.FrameworkMPI
		}, []string{"annotation elastic-training.io/rdzv-standbys=1 with elastic-training.io/framework=mpi: standbys serve a PyTorch job's c10d rendezvous only"}},
		{"restart-survivors not a bool", func(p *corev1.Pod) { p.Annotations[constants.AnnotationRdzvRestartSurvivors] = "no" },
			[]string{`annotation elastic-training.io/rdzv-restart-survivors="no" is invalid: want "true" or "false"`}},
		{"tls secret with a slash", func(p *corev1.Pod) { p.Annotations[constants.AnnotationRdzvTLSSecret] = "ns/certs" },
			[]string{`elastic-training.io/rdzv-tls-secret="ns/certs" is invalid`}},
		{"tls with the c10d backend", func(p *corev1.Pod) {
			p.Annotations[constants.AnnotationRdzvTLSSecret] = "certs"
			p.Annotations[constants.AnnotationRdzvBackend] = constants.BackendC10d
		}, []string{"rdzv-tls-secret=\"certs\" with elastic-training.io/rdzv-backend=c10d: torch's c10d store has no TLS"}},
		{"tls with the elastic-training backend", func(p *corev1.Pod) {
			p.Annotations[constants.AnnotationRdzvTLSSecret] = "certs"
			p.Annotations[constants.AnnotationRdzvBackend] = constants.BackendElasticTraining
		}, []string{"rdzv-tls-secret=\"certs\" with elastic-training.io/rdzv-backend=elastic-training: torch's c10d store has no TLS"}},
		{"tls volume name taken by another volume", func(p *corev1.Pod) {
			p.Annotations[constants.AnnotationRdzvTLSSecret] = "certs"
			p.Spec.Volumes = []corev1.Volume{{Name: constants.TLSVolumeName, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "other"}}}}
		}, []string{`volume name "elastic-training-tls" is reserved for the rendezvous TLS Secret "certs"`}},
		{"tls dir taken", func(p *corev1.Pod) {
			p.Annotations[constants.AnnotationRdzvTLSSecret] = "certs"
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: constants.TLSDir}}
		}, []string{`mounts volume "data" at /etc/elastic-training-tls`}},
		{"bad rdzv service", func(p *corev1.Pod) { p.Annotations[constants.AnnotationRdzvService] = "Rdzv.svc" },
			[]string{`elastic-training.io/rdzv-service="Rdzv.svc" is invalid`}},
		{"mxnet counts missing", func(p *corev1.Pod) { p.Annotations[constants.AnnotationFramework] = constants.FrameworkMXNet },
			[]string{"elastic-training.io/num-servers is missing", "elastic-training.io/num-workers is missing"}},
		{"mxnet port out of range", func(p *corev1.Pod) {
			p.Annotations[constants.AnnotationFramework] = constants.FrameworkMXNet
			p.Annotations[constants.AnnotationNumServers] = "1"
			p.Annotations[constants.AnnotationNumWorkers] = "1"
			p.Annotations[constants.AnnotationPSPort] = "70000"
		}, []string{`elastic-training.io/ps-port="70000" is invalid: want a whole number from 1 to 65535 (port)`}},
		{"unknown annotation of ours (a typo)", func(p *corev1.Pod) { p.Annotations[constants.Domain+"/max-node"] = "8" },
			[]string{`annotation elastic-training.io/max-node="8" is invalid: want no such annotation (a typo?); ours are elastic-training.io/framework,`}},
		{"mutated annotation set by the user", func(p *corev1.Pod) {
			p.Annotations[constants.AnnotationMutated] = "yes"
			p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: constants.SchedulingGate}}
		}, []string{"annotation elastic-training.io/mutated is the webhook's record of its own mutation, yet this pod was never mutated"}},
		{"ps-port out of range on a PyTorch pod", func(p *corev1.Pod) { p.Annotations[constants.AnnotationPSPort] = "70000" },
			[]string{`elastic-training.io/ps-port="70000" is invalid: want a whole number from 1 to 65535 (port)`}},
		{"more force-delete names than a job has StatefulSets", func(p *corev1.Pod) {
			p.Annotations[constants.AnnotationForceDeleteLostPods] = strings.TrimSuffix(strings.Repeat("w,", constants.MaxForceDeleteSets+1), ",")
		}, []string{"at most 64", "65 names, more than a job has StatefulSets", `force-delete-lost-pods="w,w,w,`, `..."`}},
		{"contract not a number", func(p *corev1.Pod) { p.Annotations[constants.AnnotationContract] = "v2" },
			[]string{`annotation elastic-training.io/contract="v2" is invalid: want the job chart's contract version`}},
		{"a newer job chart's pod, with an annotation this webhook does not know", func(p *corev1.Pod) {
			p.Annotations[constants.AnnotationContract] = strconv.Itoa(constants.ContractVersion + 1)
			p.Annotations[constants.Domain+"/from-the-future"] = "x"
		}, []string{fmt.Sprintf(`annotation elastic-training.io/contract="%d": this pod's job chart needs contract %d, and this webhook (elastic-training-webhook 0.1.0) serves contracts up to %d`,
			constants.ContractVersion+1, constants.ContractVersion+1, constants.ContractVersion),
			"upgrade the elastic-training-webhook chart first", "CHANGELOG.md"}},
		{"checkpoint volume without a sizeLimit", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: constants.CheckpointVolumeName,
				VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}})
		}, []string{"spec.volumes[0]", "must be an emptyDir with a sizeLimit"}},
		{"checkpoint volume not an emptyDir", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: constants.CheckpointVolumeName,
				VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp"}}})
		}, []string{"must be an emptyDir with a sizeLimit"}},
		{"checkpoint port of a host-network job declared by the trainer", func(p *corev1.Pod) {
			p.Spec.HostNetwork = true
			p.Annotations[constants.AnnotationRdzvPorts] = "20340"
			p.Spec.Volumes = append(p.Spec.Volumes, checkpointVolume())
			p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{ContainerPort: 20344})
		}, []string{"spec.containers[0].ports[0]", "port 20344 is the checkpoint server's"}},
		{"checkpoint port declared by the trainer", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, checkpointVolume())
			p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{ContainerPort: constants.CheckpointPort})
		}, []string{"spec.containers[0].ports[0]", "port 2382 is the checkpoint server's"}},
		{"checkpoint volume in an MPI pod", func(p *corev1.Pod) {
			p.Annotations[constants.AnnotationFramework] = constants.FrameworkMPI
			p.Spec.Volumes = append(p.Spec.Volumes, checkpointVolume())
		}, []string{"in-memory checkpoints are for a PyTorch job's workers"}},
		{"saves copied to a volume without in-memory checkpoints", func(p *corev1.Pod) {
			p.Annotations[constants.AnnotationCheckpointPersist] = "/data/x"
		}, []string{"annotation elastic-training.io/checkpoint-persist", "only with in-memory checkpoints"}},
		{"how often without where", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, checkpointVolume())
			p.Annotations[constants.AnnotationCheckpointPersistEvery] = "10"
		}, []string{"checkpoint-persist-every=\"10\" without elastic-training.io/checkpoint-persist"}},
		{"persist directory not absolute", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, checkpointVolume())
			p.Annotations[constants.AnnotationCheckpointPersist] = "data/../x"
		}, []string{"checkpoint-persist", "a clean absolute directory"}},
		{"persist directory on no volume", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, checkpointVolume())
			p.Annotations[constants.AnnotationCheckpointPersist] = "/data/x"
			p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "data", MountPath: "/datasets"})
		}, []string{"checkpoint-persist", "no writable volume of the training container \"trainer\" is mounted there"}},
		{"persist directory on a read-only volume", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, checkpointVolume())
			p.Annotations[constants.AnnotationCheckpointPersist] = "/data/x"
			p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "data", MountPath: "/data", ReadOnly: true})
		}, []string{"no writable volume"}},
		{"persist directory in the pod's memory", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, checkpointVolume())
			p.Annotations[constants.AnnotationCheckpointPersist] = constants.CheckpointDir + "/copy"
		}, []string{"are the webhook's"}},
		{"persist every 0 steps", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, checkpointVolume())
			p.Annotations[constants.AnnotationCheckpointPersist] = "/data/x"
			p.Annotations[constants.AnnotationCheckpointPersistEvery] = "0"
			p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "data", MountPath: "/data"})
		}, []string{"checkpoint-persist-every", "a whole number from 1 to 1000000000 (steps between copies to the volume)"}},
		{"several problems reported at once", func(p *corev1.Pod) {
			p.Annotations[constants.AnnotationMinNodes] = "x"
			p.Annotations[constants.AnnotationSlots] = "y"
		}, []string{"min-nodes", "slots", "; "}},
	}
	require.GreaterOrEqual(t, len(cases), 15)
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			p := base(t)
			tc.edit(p)
			got, err := Mutate(Input{Pod: p, Namespace: "team-a", Config: testConfig()})
			require.Error(t, err)
			assert.Nil(t, got.Pod)
			for _, w := range tc.wants {
				assert.Contains(t, err.Error(), w)
			}
			if p.Annotations[constants.AnnotationContract] == strconv.Itoa(constants.ContractVersion+1) {
				assert.NotContains(t, err.Error(), "a typo", "a newer chart's annotations are not called typos")
			}
		})
	}
}

// A pod of this webhook's contract, or of an older chart (no annotation), is mutated.
func TestContractsServed(t *testing.T) {
	for _, v := range []string{"", "1", strconv.Itoa(constants.ContractVersion)} {
		p := base(t)
		if v != "" {
			p.Annotations[constants.AnnotationContract] = v
		}
		_, err := Mutate(Input{Pod: p, Namespace: "team-a", Config: testConfig()})
		assert.NoError(t, err, "contract %q", v)
	}
}

func TestMisconfiguredWebhook(t *testing.T) {
	cfg := testConfig()
	cfg.SidecarImage = ""
	_, err := Mutate(Input{Pod: base(t), Namespace: "team-a", Config: cfg})
	require.ErrorContains(t, err, "no sidecar image")
	_, err = Mutate(Input{Pod: nil, Config: testConfig()})
	require.Error(t, err)
}

func TestShouldMutate(t *testing.T) {
	cfg := testConfig()
	cases := []struct {
		desc string
		pod  func(p *corev1.Pod)
		ns   string
		want bool
		why  string
	}{
		{"training pod", func(*corev1.Pod) {}, "team-a", true, ""},
		{"no job label", func(p *corev1.Pod) { delete(p.Labels, constants.LabelJob) }, "team-a", false, "no elastic-training.io/job label"},
		{"kube-system", func(*corev1.Pod) {}, "kube-system", false, "kube-system"},
		{"webhook namespace", func(*corev1.Pod) {}, "elastic-training-system", false, "own namespace"},
		{"dedicated rdzv pod (its image only)", func(p *corev1.Pod) { p.Labels[constants.LabelRole] = constants.RoleRdzv }, "team-a", true, ""},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			p := base(t)
			tc.pod(p)
			got, why := ShouldMutate(p, tc.ns, cfg)
			assert.Equal(t, tc.want, got)
			assert.Contains(t, why, tc.why)
		})
	}
	got, _ := ShouldMutate(nil, "team-a", cfg)
	assert.False(t, got)
}

// FuzzMutate decodes arbitrary bytes as a pod, as the webhook does with the
// JSON the API server sends, and mutates it: nothing may panic, and a
// successful mutation must leave its input alone and be idempotent, and the
// patch of the result, applied to the bytes, must give the result.
func FuzzMutate(f *testing.F) {
	for _, file := range []string{"testdata/pytorch-worker0-serves-rdzv.yaml", "testdata/mpi-launcher-serves-rdzv.yaml",
		"testdata/mxnet-worker.yaml", "testdata/pytorch-user-values-win.yaml", "testdata/pytorch-guaranteed-sidecar-resources.yaml"} {
		p := readPod(f, file)
		b, err := json.Marshal(p)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add([]byte(`{"metadata":{"labels":{"elastic-training.io/job":"j"}},"spec":{"containers":[]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		pod := &corev1.Pod{}
		// As the webhook decodes: case-sensitive, unknown fields ignored.
		if err := kjson.UnmarshalCaseSensitivePreserveInts(data, pod); err != nil {
			return
		}
		cfg := testConfig()
		if ok, _ := ShouldMutate(pod, "team-a", cfg); !ok {
			return
		}
		input := pod.DeepCopy()
		res, err := Mutate(Input{Pod: pod, Namespace: "team-a", Config: cfg})
		if !assert.ObjectsAreEqual(input, pod) {
			t.Fatalf("Mutate modified its input")
		}
		if err != nil {
			return
		}
		got, warnings := res.Pod, res.Warnings
		// The patch applied to the JSON as it came gives the mutated pod.
		checkPatch(t, data, "team-a", cfg, warnings)
		stripped := got.DeepCopy()
		delete(stripped.Annotations, constants.AnnotationMutated)
		again, err := Mutate(Input{Pod: stripped, Namespace: "team-a", Config: cfg})
		if err != nil {
			t.Fatalf("re-mutation failed: %v", err)
		}
		if !assert.ObjectsAreEqual(got, again.Pod) {
			t.Fatalf("not idempotent")
		}
	})
}

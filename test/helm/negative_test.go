package helm_test

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/strvals"

	"github.com/elastic-training/elastic-training/internal/constants"
	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// TestRejected proves that mistakes fail at `helm install` with a message that names the value to fix.
func TestRejected(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	cases := []struct {
		desc string
		sets []string // --set style; "json:" prefix: --set-json (numbers stay numbers, as in a values file)
		want string   // substring of the error
	}{
		{"unknown framework", []string{"framework=tensorflow"}, "at '/framework': value must be one of 'pytorch', 'mpi', 'mxnet', 'custom'"},
		{"no member required", []string{"workers.enabled=false", "workerGroups.burst.replicas=1", "workerGroups.burst.minReplicas=0"}, "the worker groups' minReplicas add up to 0"},
		{"min greater than max", []string{"workers.minReplicas=5", "workers.maxReplicas=2", "workers.replicas=3"}, "workers: minReplicas (5) is greater than maxReplicas (2)"},
		{"replicas above max", []string{"workers.replicas=9"}, "workers: replicas 9 is outside minReplicas..maxReplicas (1..4): raise workers.maxReplicas"},
		{"replicas below min", []string{"workers.minReplicas=3", "workers.replicas=2"}, "workers: replicas 2 is outside minReplicas..maxReplicas (3..4)"},
		{"replicas outside range in a worker group", []string{"workerGroups.burst.replicas=7", "workerGroups.burst.minReplicas=1", "workerGroups.burst.maxReplicas=6"}, "workerGroups.burst: replicas 7 is outside minReplicas..maxReplicas (1..6)"},
		{"gpus not an integer (--set)", []string{"workers.gpus=1.5"}, "at '/workers/gpus': got string, want integer"},
		{"gpus not an integer (values file)", []string{"json:workers.gpus=1.5"}, "at '/workers/gpus': got number, want integer"},
		{"gpus negative", []string{"workers.gpus=-1"}, "at '/workers/gpus': minimum: got -1, want 0"},
		{"gpus a string", []string{"workers.gpus=two"}, "at '/workers/gpus': got string, want integer"},
		{"zero replicas", []string{"workers.replicas=0"}, "at '/workers/replicas': minimum: got 0, want 1"},
		{"typo at top level", []string{"worker.replicas=3"}, "additional properties 'worker' not allowed"},
		{"typo in a group", []string{"workers.replica=3"}, "additional properties 'replica' not allowed"},
		{"typo in a worker group", []string{"workerGroups.burst.replicas=1", "workerGroups.burst.gpu=1"}, "additional properties 'gpu' not allowed"},
		{"worker group without replicas", []string{"workerGroups.burst.gpus=1"}, "missing property 'replicas'"},
		{"unknown rendezvous backend", []string{"rendezvous.backend=zookeeper"}, "at '/rendezvous/backend': value must be one of 'auto', 'etcd-v2', 'etcd', 'c10d', 'elastic-training'"},
		{"unknown MPI flavour", []string{"framework=mpi", "mpi.flavour=mvapich", "mpi.launcher.command={mpirun}"}, "at '/mpi/flavour': value must be one of 'openmpi', 'mpich', 'intelmpi'"},
		{"unknown restart policy", []string{"restartPolicy=Always"}, "at '/restartPolicy': value must be one of 'auto', 'Never', 'OnFailure'"},
		{"bad group name", []string{"workerGroups.Burst_1.replicas=1"}, "at '/workerGroups': additional properties 'Burst_1' not allowed"},
		{"group name too long", []string{"command={torchrun,t.py}", "workerGroups.averyveryverylonggroupname.replicas=1"},
			"workerGroups.averyveryverylonggroupname: a group name is at most 20 characters, this one has 26 (its Job or StatefulSet and pods are named <job>-averyveryverylonggroupname-<index>, which must stay a DNS label): use a shorter name"},
		{"reserved group name", []string{"workerGroups.launcher.replicas=1"}, `workerGroups.launcher: the group name "launcher" is reserved`},
		{"MPI without a launcher command", []string{"framework=mpi"}, "mpi.launcher.command is empty"},
		{"c10d with TLS", []string{"rendezvous.backend=c10d", "rendezvous.tls.secretName=x"}, "rendezvous.tls works with backend etcd-v2 or etcd, not c10d"},
		{"elastic-training backend with TLS", []string{"rendezvous.backend=elastic-training", "rendezvous.tls.secretName=x"}, "rendezvous.tls works with backend etcd-v2 or etcd, not elastic-training"},
		{"no worker group", []string{"workers.enabled=false"}, "no worker group: enable workers or add one under workerGroups"},
		{"job name not a DNS label", []string{"fullnameOverride=Bert"}, `job name "Bert" (the release name or fullnameOverride) must be a DNS label`},
		{"job name too long for pod hostnames", []string{"fullnameOverride=a-very-long-training-job-name-for-bert-a", "workerGroups.a-long-burst-group-x.replicas=1", "workerGroups.a-long-burst-group-x.maxReplicas=12"}, "is longer than 63 characters"},
		{"script too large", []string{"script=x", "scriptFiles.big=" + strings.Repeat("y", 1000001)}, "a ConfigMap holds at most 1 MiB"},
		{"script file missing", []string{"scriptFiles.model\\.py=x"}, `scriptFiles has no file named "train.py" (scriptName)`},
		{"bad script file name", []string{"scriptFiles.a/b=x"}, "at '/scriptFiles': additional properties 'a/b' not allowed"},
		{"timeout not positive", []string{"rendezvous.joinTimeout=0"}, "at '/rendezvous/joinTimeout': minimum: got 0, want 1"},
		{"lease TTL below etcd's", []string{"rendezvous.leaseTTL=1"}, fmt.Sprintf("rendezvous.leaseTTL: 1 second is below etcd's shortest lease (2): set 2 to 60, or 0 for the sidecar's default (%d)", constants.DefaultLeaseTTL)},
		{"lease TTL above a minute", []string{"rendezvous.leaseTTL=61"}, "leaseTTL"},
		{"monitor interval below torch's", []string{"rendezvous.monitorInterval=0.05"}, "rendezvous.monitorInterval: 0.05 seconds is outside 0.1..3600"},
		{"monitor interval not seconds", []string{"rendezvous.monitorInterval=1s"}, "at '/rendezvous/monitorInterval': '1s' does not match pattern"},
		{"unknown placement", []string{"rendezvous.placement=worker"}, "at '/rendezvous/placement': value must be one of 'auto', 'dedicated'"},
		{"slots zero", []string{"workers.slots=0"}, "at '/workers/slots': minimum: got 0, want 1"},
		{"MXNet without servers", []string{"framework=mxnet", "mxnet.servers.replicas=0"}, "at '/mxnet/servers/replicas': minimum: got 0, want 1"},
		{"PVC without size", []string{"persistence.enabled=true", "persistence.size="}, "persistence.size is empty"},
		// The chart's own volumes and mounts, and values that would render and fail later.
		{"volume named like the data volume", []string{"command={torchrun,t.py}", "persistence.enabled=true", "volumes[0].name=data", "volumes[0].emptyDir.medium=Memory"}, `volumes: volume name "data" is the chart's own volume (persistence.enabled adds it): rename yours`},
		{"mount at the data volume's path", []string{"command={torchrun,t.py}", "persistence.enabled=true", "workers.volumeMounts[0].name=x", "workers.volumeMounts[0].mountPath=/data"}, `workers.volumeMounts: mountPath /data is where the chart mounts its own volume "data" (persistence.enabled): mount "x" elsewhere`},
		{"volume named like the script's", []string{"script=print(1)", "volumes[0].name=script", "volumes[0].emptyDir.medium=Memory"}, `volumes: volume name "script" is the chart's own volume (script adds it)`},
		{"volume named like the shared memory", []string{"command={torchrun,t.py}", "volumes[0].name=dshm", "volumes[0].emptyDir.medium=Memory"}, `volume name "dshm" is the chart's own volume (shm.enabled (or workers.shm.enabled) adds it)`},
		{"mount at /dev/shm", []string{"command={torchrun,t.py}", "volumeMounts[0].name=x", "volumeMounts[0].mountPath=/dev/shm"}, `volumeMounts: mountPath /dev/shm is where the chart mounts its own volume "dshm"`},
		{"volume named like the webhook's data volume", []string{"command={torchrun,t.py}", "volumes[0].name=elastic-training-data", "volumes[0].emptyDir.medium=Memory"}, `volume name "elastic-training-data" is reserved for the volume the webhook adds`},
		{"env value a number", []string{"command={torchrun,t.py}", "env[0].name=OMP_NUM_THREADS", "env[0].value=1"}, "env[0].value: 1 is a int64; an environment variable's value is a string, the API server would refuse every pod: quote it (--set-string env[0].value=1"},
		{"env value a number in a group", []string{"command={torchrun,t.py}", "json:workers.env=[{\"name\":\"X\",\"value\":true}]"}, "workers.env[0].value: true is a bool"},
		{"MPI with a script and no launcher command", []string{"framework=mpi", "script=print(1)"}, "framework mpi with a script and no mpi.launcher.command would run the script with python3 on the launcher alone"},
		{"MXNet values on a PyTorch job", []string{"command={torchrun,t.py}", "mxnet.servers.replicas=2"}, "mxnet: values for framework mxnet on a pytorch job are ignored"},
		{"digest as the tag", []string{"command={torchrun,t.py}", "image.tag=sha256:" + strings.Repeat("a", 64)}, "workers.image.tag: \"sha256:aaaa"},
		{"digest malformed", []string{"command={torchrun,t.py}", "image.digest=sha256:abc"}, "at '/image/digest'"},
		{"script launcher without a script", []string{"scriptLauncher={torchrun}", "args={--epochs=1}"}, "scriptLauncher [torchrun] runs the script, but there is none: add --set-file script=train.py"},
		// What the webhook would deny (its rules, generated into _contract.tpl), refused at install instead.
		{"sidecar's container name", []string{"command={torchrun,t.py}", "containerName=rdzv-sidecar"}, `containerName: "rdzv-sidecar" is the name of the rendezvous sidecar`},
		{"reserved volume name", []string{"command={torchrun,t.py}", "volumes[0].name=elastic-training", "volumes[0].emptyDir.medium=Memory"}, `volumes: volume name "elastic-training" is reserved`},
		{"reserved volume name in a group", []string{"command={torchrun,t.py}", "workers.volumes[0].name=elastic-training-tls", "workers.volumes[0].emptyDir.medium=Memory"}, `workers.volumes: volume name "elastic-training-tls" is reserved`},
		{"mount at the webhook's path", []string{"command={torchrun,t.py}", "volumeMounts[0].name=x", "volumeMounts[0].mountPath=/etc/elastic-training/"}, "volumeMounts: mountPath /etc/elastic-training/ is where the webhook mounts the rendezvous files"},
		{"gpus over the webhook's slots", []string{"command={torchrun,t.py}", "workers.gpus=2000"}, "workers.gpus: 2000 is more than a pod may have (1024)"},
		{"slots over the webhook's slots", []string{"command={torchrun,t.py}", "workers.slots=1025"}, "workers.slots: 1025 is more than a pod may have (1024)"},
		{"misspelt accelerator", []string{"command={torchrun,t.py}", "gpuResource=nvidia.com/gpus", "workers.gpus=1"}, `gpuResource: "nvidia.com/gpus" is not an accelerator resource the webhook counts`},
		{"an Intel share is not a device", []string{"command={torchrun,t.py}", "gpuResource=gpu.intel.com/millicores", "workers.gpus=1"}, `gpuResource: "gpu.intel.com/millicores" is not an accelerator`},
		{"gpus disagree with limits", []string{"command={torchrun,t.py}", "workers.gpus=1", "workers.resources.limits.nvidia\\.com/gpu=2"}, "workers.gpus is 1 but resources.limits says nvidia.com/gpu: 2"},
		{"script with a command that ignores it", []string{"command={torchrun,other.py}", "script=print(1)"}, "script is set but workers.command [torchrun other.py] does not run it"},
		{"user-set mutated annotation", []string{"command={torchrun,t.py}", "podAnnotations.elastic-training\\.io/mutated=x"}, "podAnnotations: elastic-training.io/mutated is the webhook's record"},
		{"our annotation key in a group", []string{"command={torchrun,t.py}", "workers.podAnnotations.elastic-training\\.io/slot=four"}, "workers.podAnnotations: elastic-training.io/slot is the chart's to set"},
		{"our label key", []string{"command={torchrun,t.py}", "podLabels.elastic-training\\.io/role=x"}, "podLabels: elastic-training.io/role is the chart's to set"},
		{"bad PriorityClass name", []string{"command={torchrun,t.py}", "priorityClassName=High_Priority"}, `priorityClassName: "High_Priority" is not a valid object name`},
		{"bad group PriorityClass name", []string{"command={torchrun,t.py}", "workers.priorityClassName=Spot"}, `workers.priorityClassName: "Spot" is not a valid object name`},
		{"bad TLS Secret name", []string{"command={torchrun,t.py}", "rendezvous.backend=etcd-v2", "rendezvous.tls.secretName=My_Certs"}, `rendezvous.tls.secretName: "My_Certs" is not a valid object name`},
		{"bad pull Secret name", []string{"command={torchrun,t.py}", "imagePullSecrets[0].name=Regcred"}, `imagePullSecrets: "Regcred" is not a valid object name`},
		{"two queues", []string{"command={torchrun,t.py}", "queue.kueue=a", "queue.volcano=b"}, "queue.kueue (a) and queue.volcano (b) are both set"},
		{"helm test that cannot pass", []string{"command={torchrun,t.py}", "tests.minMembers=5"}, "tests.minMembers (5) is more than the job can ever have (4"},
		{"ReadWriteOncePod with several pods", []string{"command={torchrun,t.py}", "persistence.enabled=true", "persistence.accessModes={ReadWriteOncePod}"}, "persistence.accessModes: ReadWriteOncePod lets one pod mount the volume"},
		{"MXNet worker groups", []string{"framework=mxnet", "command={python3,t.py}", "workerGroups.more.replicas=1"}, "workerGroups (more): MXNet jobs have one worker group"},
		{"MXNet port of the sidecar", []string{"framework=mxnet", "command={python3,t.py}", "mxnet.psPort=2381"}, "mxnet.psPort: 2381 is the rendezvous sidecar's health port"},
		{"the default job: nothing to run", nil, "workers: nothing to run: set command"},
		{"custom job with nothing to run", []string{"framework=custom"}, "workers: nothing to run: set command"},
		{"MXNet scheduler with nothing to run", []string{"framework=mxnet", "workers.command={python3,train.py}"}, "mxnet.scheduler: nothing to run"},
		{"worker group with nothing to run", []string{"workers.command={torchrun,t.py}", "workerGroups.burst.replicas=1"}, "workerGroups.burst: nothing to run"},
		// Containers beside the webhook's and flags over its environment: denied or overridden after the install.
		{"extra container named like the sidecar", []string{"command={torchrun,t.py}", "extraContainers[0].name=rdzv-sidecar", "extraContainers[0].image=busybox"},
			`extraContainers[0].name: "rdzv-sidecar" is the rendezvous sidecar the webhook injects (it would deny the pod, or replace yours): rename it`},
		{"init container named like the sidecar", []string{"command={torchrun,t.py}", "workers.initContainers[0].name=rdzv-sidecar", "workers.initContainers[0].image=busybox"},
			`workers.initContainers[0].name: "rdzv-sidecar" is the rendezvous sidecar`},
		{"extra container named like the trainer", []string{"command={torchrun,t.py}", "extraContainers[0].name=trainer", "extraContainers[0].image=busybox"},
			`extraContainers[0].name: "trainer" is the trainer's name (containerName): rename it`},
		{"extra container on the c10d port", []string{"command={torchrun,t.py}", "extraContainers[0].name=exporter", "extraContainers[0].image=busybox", "json:extraContainers[0].ports=[{\"containerPort\":29400}]"},
			"extraContainers[0].ports[0].containerPort: 29400 is the c10d store's port (the containers of a pod share its ports; the webhook would deny every pod): use another port"},
		{"extra container on the health port", []string{"command={torchrun,t.py}", "workers.extraContainers[0].name=exporter", "workers.extraContainers[0].image=busybox", "json:workers.extraContainers[0].ports=[{\"containerPort\":2381}]"},
			"workers.extraContainers[0].ports[0].containerPort: 2381 is the rendezvous sidecar's health port"},
		{"extra container on a host-network job's shifted port", []string{"command={torchrun,t.py}", "hostNetwork=true", "hostNetworkPortBase=21000", "extraContainers[0].name=exporter", "extraContainers[0].image=busybox", "json:extraContainers[0].ports=[{\"containerPort\":21003}]"},
			"extraContainers[0].ports[0].containerPort: 21003 is the c10d store's port"},
		{"trainer port on the client port", []string{"command={torchrun,t.py}", "json:ports=[{\"containerPort\":2379}]"},
			"ports[0].containerPort: 2379 is the rendezvous client port"},
		{"podFailureRules on PyTorch workers that restart in place", []string{"command={torchrun,t.py}", "json:podFailureRules=[{\"action\":\"FailJob\",\"onExitCodes\":{\"operator\":\"In\",\"values\":[42]}}]"},
			"podFailureRules: Kubernetes takes a Job's podFailurePolicy only with restartPolicy Never, and the pods of workers restart in place (restartPolicy OnFailure): set workers.restartPolicy (or restartPolicy) to Never"},
		{"torchrun's --nnodes from a PyTorchJob", []string{"command={torchrun,--nnodes=4,--nproc-per-node=8,train.py}"},
			"workers.command/args: torchrun's --nnodes would override what the chart and the webhook set (torchrun's flags win over its PET_* environment): remove it; here it comes from workers.minReplicas/maxReplicas (summed over the groups)"},
		{"torchrun's --rdzv_endpoint with a value apart", []string{"command={torchrun,--rdzv_endpoint,master:29400,train.py}"}, "torchrun's --rdzv_endpoint would override"},
		{"torchrun's --nnodes after -r with a value apart", []string{"command={torchrun,-r,x3,--nnodes=2,train.py}"}, "torchrun's --nnodes would override"},
		{"torchrun's --rdzv-backend in a shell command", []string{"command={sh,-c}", "args={pip install -q x && torchrun --rdzv-backend=c10d train.py}"}, "torchrun's --rdzv-backend would override"},
		{"python -m torch.distributed.run --nproc_per_node", []string{"command={python3,-m,torch.distributed.run,--nproc_per_node=8,train.py}"}, "torchrun's --nproc_per_node would override what the chart and the webhook set (torchrun's flags win over its PET_* environment): remove it; here it comes from gpus (or slots)"},
		{"torchrun's --standalone in a group", []string{"command={torchrun,t.py}", "workerGroups.big.replicas=1", "workerGroups.big.command={torchrun,--standalone,t.py}"}, "workerGroups.big.command/args: torchrun's --standalone would override"},
		{"scriptLauncher with --max-restarts", []string{"script=print(1)", "scriptLauncher={torchrun,--max-restarts=3}"}, "scriptLauncher: torchrun's --max-restarts would override"},
		{"checkpoint.replicas too many", []string{"checkpoint.memory=1Gi", "checkpoint.replicas=9"}, "at '/checkpoint/replicas'"},
		{"checkpoint.persistDir on no volume", []string{"command={torchrun,t.py}", "checkpoint.memory=1Gi", "checkpoint.persistDir=/ckpt"}, "checkpoint.persistDir: /ckpt is on no writable volume of the workers (volumeMounts, workers.volumeMounts, persistence.mountPath)"},
		{"checkpoint.persistDir relative", []string{"checkpoint.memory=1Gi", "checkpoint.persistDir=ckpt"}, "at '/checkpoint/persistDir'"},
		{"checkpoint.persistEvery negative", []string{"checkpoint.memory=1Gi", "checkpoint.persistEvery=-1"}, "at '/checkpoint/persistEvery'"},
		{"hang.timeout negative", []string{"json:hang={\"timeout\":-1}"}, "at '/hang/timeout'"},
		{"checkpoint.memory not a quantity", []string{"checkpoint.memory=lots"}, "at '/checkpoint/memory'"},
		{"checkpoint.memory for MXNet", []string{"framework=mxnet", "checkpoint.memory=1Gi"}, "checkpoint.memory: in-memory checkpoints are for PyTorch jobs (elastic_training.checkpoint), not framework mxnet"},
		{"trainer port on a host-network job's checkpoint port", []string{"command={torchrun,t.py}", "hostNetwork=true", "hostNetworkPortBase=21000", "checkpoint.memory=1Gi", "json:ports=[{\"containerPort\":21004}]"},
			"ports[0].containerPort: 21004 is the in-memory checkpoints' port (checkpoint.memory)"},
		{"extra container on the checkpoint port", []string{"command={torchrun,t.py}", "checkpoint.memory=1Gi", "extraContainers[0].name=exporter", "extraContainers[0].image=busybox", "json:extraContainers[0].ports=[{\"containerPort\":2382}]"},
			"extraContainers[0].ports[0].containerPort: 2382 is the in-memory checkpoints' port"},
		{"a volume named as the checkpoints' own", []string{"command={torchrun,t.py}", "checkpoint.memory=1Gi", `json:volumes=[{"name":"elastic-training-checkpoints","emptyDir":{}}]`}, `volume name "elastic-training-checkpoints" is the chart's own volume (checkpoint.memory adds it)`},
	}
	if len(cases) < 20 {
		t.Fatalf("want at least 20 negative cases, have %d", len(cases))
	}
	// README.md counts them.
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d rejected-values cases", len(cases)); !strings.Contains(string(readme), want) {
		t.Errorf("README.md does not say %q (%s)", want, regexp.MustCompile(`\d+ rejected-values cases`).Find(readme))
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			vals := map[string]any{}
			for _, s := range c.sets {
				parse := strvals.ParseInto
				if j, ok := strings.CutPrefix(s, "json:"); ok {
					s, parse = j, strvals.ParseJSON
				}
				if err := parse(s, vals); err != nil {
					t.Fatalf("--set %s: %v", s, err)
				}
			}
			_, err := render(ch, vals, chartrender.Options{})
			if err == nil {
				t.Fatalf("--set %v: accepted, want an error containing %q", c.sets, c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("--set %v:\n got: %v\nwant: ...%s...", c.sets, err, c.want)
			}
		})
	}
}

// TestSomethingToRun: what a job may run instead of the image's entrypoint alone, accepted.
func TestSomethingToRun(t *testing.T) {
	ch := chartrender.Load(t, chartDir)
	for _, sets := range [][]string{
		{"command={torchrun,/app/train.py}"},
		{"workers.command={torchrun,/app/train.py}"},
		{"command={torchrun,--log-dir,/logs,--redirects=3,/app/train.py,--nnodes=4,--max-restarts,two}"}, // the script's own flags, after it
		{"command={torchrun,--tee=3,-m,trainer.main,--standalone}"},                                      // a module's
		{"command={sh,-c,echo --nnodes=4 && torchrun /app/train.py --rdzv-id x}"},                        // not torchrun's
		{"args={--epochs,three}"},                                                                        // an image whose entrypoint trains
		{"script=print(1)", "command={torchrun,/etc/elastic-training-script/train.py}"},                  // a command that runs the script
		{"command={torchrun,t.py}", "gpuResource=gpu.intel.com/xe", "workers.gpus=1"},
		{"command={torchrun,t.py}", "gpuResource=nvidia.com/mig-1g.10gb", "workers.gpus=1"},
		{"command={torchrun,t.py}", "gpuResource=example.com/npu", "workers.gpus=1", "workers.slots=1"}, // the webhook's extraAccelerators
		{"command={torchrun,t.py}", "workers.gpus=2", "workers.resources.limits.nvidia\\.com/gpu=2"},
		{"script=print(1)"},
		{"framework=mpi", "mpi.launcher.command={mpirun,python3,t.py}"}, // MPI workers run sshd
		{"framework=mxnet", "command={python3,t.py}"},
	} {
		vals := map[string]any{}
		for _, s := range sets {
			if err := strvals.ParseInto(s, vals); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := render(ch, vals, chartrender.Options{}); err != nil {
			t.Errorf("--set %v: %v", sets, err)
		}
	}
}

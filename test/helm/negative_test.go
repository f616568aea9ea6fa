package helm_test

import (
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/strvals"

	"github.com/elastic-training/elastic-training/internal/testenv/chartrender"
)

// TestRejected proves that mistakes fail at `helm install` with a message that names the value to fix.
func TestRejected(t *testing.T) {
	ch := loadChart(t)
	cases := []struct {
		desc string
		sets []string // --set style; "json:" prefix: --set-json (numbers stay numbers, as in a values file)
		want string   // substring of the error
	}{
		{"unknown framework", []string{"framework=tensorflow"}, "at '/framework': value must be one of 'pytorch', 'mpi', 'mxnet', 'custom'"},
		{"no member required", []string{"workers.enabled=false", "workerGroups.burst.replicas=1", "workerGroups.burst.minReplicas=0"}, "the worker groups' minReplicas add up to 0"},
		{"min greater than max", []string{"workers.minReplicas=5", "workers.maxReplicas=2", "workers.replicas=3"}, "workers: minReplicas (5) is greater than maxReplicas (2)"},
		{"replicas above max", []string{"workers.replicas=9"}, "workers: replicas 9 is outside minReplicas..maxReplicas (1..4); a running job keeps the range it was installed with"},
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
		{"unknown rendezvous backend", []string{"rendezvous.backend=zookeeper"}, "at '/rendezvous/backend': value must be one of 'etcd-v2', 'etcd', 'c10d'"},
		{"unknown MPI flavour", []string{"framework=mpi", "mpi.flavour=mvapich", "mpi.launcher.command={mpirun}"}, "at '/mpi/flavour': value must be one of 'openmpi', 'mpich', 'intelmpi'"},
		{"unknown restart policy", []string{"restartPolicy=Always"}, "at '/restartPolicy': value must be one of 'auto', 'Never', 'OnFailure'"},
		{"bad group name", []string{"workerGroups.Burst_1.replicas=1"}, "at '/workerGroups': additional properties 'Burst_1' not allowed"},
		{"reserved group name", []string{"workerGroups.launcher.replicas=1"}, `workerGroups.launcher: the group name "launcher" is reserved`},
		{"MPI without a launcher command", []string{"framework=mpi"}, "mpi.launcher.command is empty"},
		{"c10d with TLS", []string{"rendezvous.backend=c10d", "rendezvous.tls.secretName=x"}, "rendezvous.tls works with backend etcd-v2 or etcd, not c10d"},
		{"no worker group", []string{"workers.enabled=false"}, "no worker group: enable workers or add one under workerGroups"},
		{"job name not a DNS label", []string{"fullnameOverride=Bert"}, `job name "Bert" (the release name or fullnameOverride) must be a DNS label`},
		{"job name too long for pod hostnames", []string{"fullnameOverride=a-very-long-training-job-name-for-bert-a", "workerGroups.a-long-burst-group-x.replicas=1", "workerGroups.a-long-burst-group-x.maxReplicas=12"}, "is longer than 63 characters"},
		{"script too large", []string{"script=x", "scriptFiles.big=" + strings.Repeat("y", 1000001)}, "a ConfigMap holds at most 1 MiB"},
		{"script file missing", []string{"scriptFiles.model\\.py=x"}, `scriptFiles has no file named "train.py" (scriptName)`},
		{"bad script file name", []string{"scriptFiles.a/b=x"}, "at '/scriptFiles': additional properties 'a/b' not allowed"},
		{"timeout not positive", []string{"rendezvous.joinTimeout=0"}, "at '/rendezvous/joinTimeout': minimum: got 0, want 1"},
		{"unknown placement", []string{"rendezvous.placement=worker"}, "at '/rendezvous/placement': value must be one of 'auto', 'dedicated'"},
		{"slots zero", []string{"workers.slots=0"}, "at '/workers/slots': minimum: got 0, want 1"},
		{"MXNet without servers", []string{"framework=mxnet", "mxnet.servers.replicas=0"}, "at '/mxnet/servers/replicas': minimum: got 0, want 1"},
		{"PVC without size", []string{"persistence.enabled=true", "persistence.size="}, "persistence.size is empty"},
	}
	if len(cases) < 20 {
		t.Fatalf("want at least 20 negative cases, have %d", len(cases))
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

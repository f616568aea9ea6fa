package framework

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// The cluster's settings are written once, in test/e2e/cluster/env.sh, which the cluster scripts source: the
// framework reads them from there when the test binary starts (bash sources the file once), with the same
// environment the scripts get, so that an override such as ET_CACHE or TRAINER_SUITES reaches both alike.
var settings = readSettings()

var (
	// BusyboxImage is Debian's busybox-static with its applets (sh, wget, nslookup, httpd...).
	BusyboxImage = settings["BUSYBOX_IMAGE"]
	// WebhookImage and SidecarImage are the project's binaries, built by hack/images.sh from ./cmd.
	WebhookImage = settings["WEBHOOK_IMAGE"]
	SidecarImage = settings["SIDECAR_IMAGE"]
	// TrainerImages are the trainer images hack/images.sh builds, one per suite of TRAINER_SUITES in its order
	// (Debian forky's torch 2.14, then trixie's 2.6, with python-etcd, Open MPI, MPICH, mpi4py and sshd): tests that
	// cover torch versions range over them. TrainerImage is the default one, the first.
	TrainerImages = trainerImages(settings["TRAINER_IMAGE"], settings["TRAINER_SUITES"])
	TrainerImage  = TrainerImages[0].Image
	// StockTrainer is the forky image without python-etcd, as a stock torch image is: what the chart's default
	// backend (elastic-training, auto) must train with.
	StockTrainer = Trainer{Image: settings["STOCK_TRAINER_IMAGE"], Torch: trainerTorch["forky"]}
	// NodeName is the node of the host itself (node1), where the control plane runs; ExtraNodes are the others.
	NodeName = settings["NODE_NAME"]
	// ClusterDomain is the DNS domain of Services and pods.
	ClusterDomain = settings["CLUSTER_DOMAIN"]
	// ServiceCIDR holds every ClusterIP; the host has a guard route so that a packet to an address in it
	// that kube-proxy did not rewrite fails locally.
	ServiceCIDR = settings["SVC_CIDR"]
	// FakeGPUCount is how many FakeGPUResource (and AMDGPUResource) devices the node has (FAKE_DEVICES).
	FakeGPUCount = fakeDevices(settings["FAKE_DEVICES"], FakeGPUResource)
	// PodCIDR holds every pod's address (host-network pods have their node's).
	PodCIDR = settings["POD_CIDR"]
	// LocalRegistry is the cluster's OCI registry (host:port, plain HTTP), from which every node's containerd pulls.
	LocalRegistry = settings["LOCAL_REGISTRY"]
	// HelmVersion is the pinned helm release of BinDir's helm.
	HelmVersion = settings["HELM_VERSION"]
	// e2eLock serialises e2e test binaries on one machine (go test runs packages in parallel): they share the
	// one cluster, and one may stop it. It is not the scripts' lock, which up.sh/down.sh take themselves.
	e2eLock = settings["E2E_LOCK"]
)

// FakeGPUResource is advertised by the fake device plugin with FakeGPUCount devices (and AMDGPUResource as well).
// Pods requesting them are scheduled and admitted, but no device is attached.
const (
	FakeGPUResource = "nvidia.com/gpu"
	AMDGPUResource  = "amd.com/gpu"
)

// Trainer is a local trainer image and the torch it has (hack/rootfs.sh, TRAINER_SUITES).
type Trainer struct {
	Image string
	Torch string // the torch version, as torch.__version__ prints it without its Debian suffix
}

// trainerTorch is the torch each suite's root filesystem has: what the tests expect the images to run.
var trainerTorch = map[string]string{"forky": "2.14.1", "trixie": "2.6.0"}

// settingNames are the variables of env.sh the framework reads.
var settingNames = []string{
	"ET_CACHE", "BIN", "RUN", "LOGS", "PIDS", "KUBECONFIG", "HACK_DIR", "E2E_LOCK",
	"BUSYBOX_IMAGE", "WEBHOOK_IMAGE", "SIDECAR_IMAGE", "TRAINER_IMAGE", "STOCK_TRAINER_IMAGE", "TRAINER_SUITES",
	"NODE_NAME", "NODE_IP", "EXTRA_NODES", "CLUSTER_DOMAIN", "SVC_CIDR", "FAKE_DEVICES", "HELM_VERSION", "KUEUE_VERSION",
	"LOCAL_REGISTRY", "POD_CIDR",
}

// readSettings sources env.sh of this checkout and returns the variables of settingNames. A test binary that
// cannot read them cannot run a test: it panics, saying why.
func readSettings() map[string]string {
	root, err := findRepoRoot()
	if err != nil {
		panic(fmt.Sprintf("e2e framework: %v", err))
	}
	env := filepath.Join(root, "test", "e2e", "cluster", "env.sh")
	cmd := exec.Command("bash", append([]string{"-c", `. "$1" && shift && for n; do printf '%s=%s\0' "$n" "${!n}"; done`, "bash", env}, settingNames...)...)
	cmd.Env = append(os.Environ(), "REPO_ROOT="+root)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		panic(fmt.Sprintf("e2e framework: read the cluster's settings from %s: %v: %s", env, err, stderr.String()))
	}
	s := map[string]string{}
	for _, kv := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		k, v, _ := strings.Cut(kv, "=")
		s[k] = v
	}
	for _, n := range settingNames {
		if s[n] == "" {
			panic(fmt.Sprintf("e2e framework: %s sets no %s", env, n))
		}
	}
	return s
}

// trainerImages lists repo:<suite> for each suite, with the torch the tests expect of it.
func trainerImages(repo, suites string) []Trainer {
	var out []Trainer
	for _, suite := range strings.Fields(suites) {
		torch, ok := trainerTorch[suite]
		if !ok {
			panic(fmt.Sprintf("e2e framework: TRAINER_SUITES names %s, whose torch the tests do not know (framework.trainerTorch)", suite))
		}
		out = append(out, Trainer{Image: repo + ":" + suite, Torch: torch})
	}
	if len(out) == 0 {
		panic("e2e framework: TRAINER_SUITES is empty")
	}
	return out
}

// fakeDevices returns the count of resource in FAKE_DEVICES ("nvidia.com/gpu=8 amd.com/gpu=8").
func fakeDevices(devices, resource string) int64 {
	for _, d := range strings.Fields(devices) {
		if r, n, _ := strings.Cut(d, "="); r == resource {
			v, err := strconv.ParseInt(n, 10, 64)
			if err != nil {
				panic(fmt.Sprintf("e2e framework: FAKE_DEVICES=%q: %v", devices, err))
			}
			return v
		}
	}
	panic(fmt.Sprintf("e2e framework: FAKE_DEVICES=%q has no %s", devices, resource))
}

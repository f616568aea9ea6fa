# Settings of the local test cluster. Source this file (bash).
# Everything expensive or stateful lives outside git, under $ET_CACHE:
#   $ET_CACHE/bin      binaries built from the pinned versions (build.sh), one stamp per binary
#   $ET_CACHE/images   local image tarballs (hack/images.sh)
#   $ET_CACHE/rootfs   the trainer root filesystems (hack/rootfs.sh)
#   $ET_CACHE/run      state of the running cluster: pki, etcd data, containerd root, logs, pids
# The scripts here and in hack/, the Makefile and the Go test framework (test/e2e/framework, which runs bash on this
# file once) all read these settings from here: each is written once, in this file.
export ET_CACHE=${ET_CACHE:-${HOME:-/root}/.cache/elastic-training}
export CLUSTER_DIR=${CLUSTER_DIR:-$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")}
export REPO_ROOT=${REPO_ROOT:-$(cd "$CLUSTER_DIR/../../.." && pwd)}
export TOOLS=$CLUSTER_DIR/tools
# The scripts that serve more than the cluster (root filesystems, images, Debian packages) are in hack/.
HACK_DIR=$(cd "$CLUSTER_DIR/../../../hack" && pwd); export HACK_DIR
export BIN=$ET_CACHE/bin IMAGES=$ET_CACHE/images RUN=$ET_CACHE/run
export LOGS=$RUN/logs PIDS=$RUN/pids PKI=$RUN/pki
export KUBECONFIG=$RUN/admin.kubeconfig

# Pinned versions. The Go versions of the modules are in tools/*/go.mod; these must agree (build.sh checks).
export K8S_VERSION=v1.36.3 HELM_VERSION=v3.22.0
# kube-router, only its NetworkPolicy controller (iptables + ipset, no eBPF): what makes the cluster enforce the
# charts' NetworkPolicies. Built with `go install <module>@<version>` (its own go.mod, not tools/). Its known CVEs
# do not matter here: it runs only for this throwaway test cluster and listens on no port (up.sh).
export KUBE_ROUTER_VERSION=v2.1.0
# Kueue, for the queue tests only (test/e2e/workloads TestKueue; built on first use by `build.sh kueue`, not by
# cluster-up): the one version the module proxy serves here. It runs as a process of this host while the test runs.
export KUEUE_VERSION=v0.17.0

# Images (never pulled: imported into containerd's k8s.io namespace, pods use imagePullPolicy: Never).
export PAUSE_IMAGE=docker.io/local/pause:1
export BUSYBOX_IMAGE=local/busybox:1
export WEBHOOK_IMAGE=local/elastic-training-webhook:dev
export SIDECAR_IMAGE=local/rdzv-sidecar:dev
# Trainer images: $TRAINER_IMAGE:<suite> for each of $TRAINER_SUITES (below), and the forky one without python-etcd.
export TRAINER_IMAGE=local/trainer
export STOCK_TRAINER_IMAGE=$TRAINER_IMAGE:forky-no-etcd

# Fake accelerators advertised by the node (scheduling only, no device is attached).
export FAKE_DEVICES=${FAKE_DEVICES:-nvidia.com/gpu=8 amd.com/gpu=8}

# Network and ports. The kubelet (10250) and its device-plugin directory are node-global, so only one cluster
# per machine can run; everything else could be moved.
export NODE_NAME=${NODE_NAME:-node1}
export NODE_IP=${NODE_IP:-10.250.0.1}        # a /32 on lo (this kernel has no dummy netdev)
export POD_CIDR=${POD_CIDR:-10.244.0.0/16}
export NODE_POD_CIDR=${NODE_POD_CIDR:-10.244.0.0/24}
export SVC_CIDR=${SVC_CIDR:-10.96.0.0/16}
export KUBERNETES_SVC_IP=${KUBERNETES_SVC_IP:-10.96.0.1}
export CLUSTER_DNS=$NODE_IP                  # CoreDNS runs on the host, bound to $NODE_IP:53
# More nodes (node.sh): node<N> (N = 2..250) runs its own containerd, kubelet, kube-proxy, kube-router and fake
# device plugin in network namespace et-node<N> (node IP 10.250.0.<N>, pods 10.244.<N-1>.0/24, both routed from the
# host through veth et-node<N>), a mount namespace of its own and cgroup /et-node<N>. up.sh starts EXTRA_NODES.
export EXTRA_NODES=${EXTRA_NODES-node2}
export NODE_NET=10.250.0.0/24
node_index() { local i=${1#node}; [[ $1 == node* && $i =~ ^[0-9]+$ && $i -ge 2 && $i -le 250 ]] || { echo "not a node name: $1 (node2..node250)" >&2; return 1; }; echo "$i"; }
node_ip() { local i; i=$(node_index "$1") && echo "10.250.0.$i"; }
node_pod_cidr() { local i; i=$(node_index "$1") && echo "10.244.$((i - 1)).0/24"; }
export CLUSTER_DOMAIN=${CLUSTER_DOMAIN:-cluster.local}
export ETCD_CLIENT_PORT=${ETCD_CLIENT_PORT:-32379} ETCD_PEER_PORT=${ETCD_PEER_PORT:-32380}
export APISERVER_PORT=${APISERVER_PORT:-36443}
export KUBELET_PORT=10250 KUBELET_HEALTHZ_PORT=${KUBELET_HEALTHZ_PORT:-10248}
export KCM_PORT=${KCM_PORT:-10257} SCHED_PORT=${SCHED_PORT:-10259}
export PROXY_METRICS_PORT=${PROXY_METRICS_PORT:-10249} PROXY_HEALTHZ_PORT=${PROXY_HEALTHZ_PORT:-10256}
export COREDNS_HEALTH_PORT=${COREDNS_HEALTH_PORT:-18080} COREDNS_READY_PORT=${COREDNS_READY_PORT:-18181}
export CTR_SOCK=$RUN/containerd/containerd.sock
# The cluster's OCI registry (tools/registry, plain HTTP on the node network): what `make images REGISTRY=... PUSH=1`
# pushes to and every node's containerd pulls from (lib.sh), as a real cluster pulls from a real registry.
export REGISTRY_PORT=${REGISTRY_PORT:-5000}
export LOCAL_REGISTRY=$NODE_IP:$REGISTRY_PORT
export CNI_BIN_DIR=${CNI_BIN_DIR:-/usr/lib/cni}
export DEVICE_PLUGIN_DIR=/var/lib/kubelet/device-plugins   # hard-coded in the kubelet

# Machine-wide: which $RUN owns the node-global resources, and the lock that serialises up/down.
export INSTANCE_FILE=/run/elastic-training-cluster.owner
export LOCK_FILE=/run/lock/elastic-training-cluster.lock
# The lock e2e test binaries hold while they use the cluster (test/e2e/framework; `make e2e` takes it to stop it).
export E2E_LOCK=/run/lock/elastic-training-e2e.lock
# A routing table, an iptables chain and an nftables table of our own, so down.sh removes exactly what up.sh added.
export GUARD_CHAIN=ET-GUARD GUARD_TABLE=9696 GUARD_NFT=et-guard
export PATH=$BIN:$PATH   # kubectl/helm matching the cluster come first

# has PATTERN: like `grep -q PATTERN` at the end of a pipe, but reads all its input first. With pipefail,
# grep -q exiting at the first match can kill the writer with SIGPIPE and turn a match into a failure.
has() { local in; in=$(cat); grep -q -- "$1" <<<"$in"; }

# Trainer root filesystems (hack/rootfs.sh, Debian suites through mmdebstrap) and the images packed from them
# (hack/images.sh): $TRAINER_IMAGE:<suite>. The first suite is the default for the demo and the tests that need one torch.
export ROOTFS=$ET_CACHE/rootfs
export TRAINER_SUITES=${TRAINER_SUITES:-forky trixie}

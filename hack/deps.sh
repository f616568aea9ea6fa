#!/bin/bash
# Installs the Debian packages of one or more sets, when missing (root; nothing to do when all are installed).
#   cluster  (the default) what the local cluster and `make demo` run on: containerd + runc (container runtime),
#            containernetworking-plugins (bridge/host-local/portmap/loopback CNI), iptables/iproute2 (kube-proxy,
#            routes), ipset (kube-router's NetworkPolicy controller keeps pod addresses in ipsets), nftables (the
#            guard that keeps pods' packets on the machine, which kube-router's iptables rules cannot skip), busybox-static
#            (test image), openssl (pki), curl (health checks), util-linux (flock, setsid), procps (pgrep),
#            mmdebstrap (the trainer root filesystems, hack/rootfs.sh).
#   test     everything `make test` needs (.ci/run): the cluster set, and etcd 3.4 (etcd-server, etcd-client: the
#            conformance reference and etcdctl), Open MPI and MPICH with mpi4py (host MPI places ranks in the
#            integration tests' fake hosts), shellcheck (actionlint runs it on the release workflow's scripts),
#            prometheus (promtool and a real Prometheus: the charts' PodMonitor, alert rules and Grafana dashboard).
# Nothing of torch, MPI's pods or sshd: pods and the integration tests run those from the root filesystems.
# Usage: deps.sh [cluster|test]...
set -euo pipefail
cluster_pkgs=(containerd runc containernetworking-plugins iptables iproute2 ipset nftables busybox-static openssl curl util-linux procps mmdebstrap)
test_pkgs=("${cluster_pkgs[@]}" etcd-server etcd-client openmpi-bin libopenmpi-dev mpich libmpich-dev python3-mpi4py shellcheck prometheus)
pkgs=()
for set in "${@:-cluster}"; do
  case $set in
    cluster) pkgs+=("${cluster_pkgs[@]}") ;;
    test) pkgs+=("${test_pkgs[@]}") ;;
    *) echo "deps: unknown set $set (usage: deps.sh [cluster|test]...)"; exit 2 ;;
  esac
done
missing=(); declare -A seen=()
for p in "${pkgs[@]}"; do
  [ -z "${seen[$p]:-}" ] || continue; seen[$p]=1
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
[ ${#missing[@]} = 0 ] && exit 0
[ "$(id -u)" = 0 ] || { echo "deps: missing Debian packages ${missing[*]} and not root to install them"; exit 1; }
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Packages must not start host services (containerd would start a system containerd, etcd-server an etcd on 2379):
# policy-rc.d exit 101 tells invoke-rc.d not to start anything. Keep one that is already there (Docker images ship
# it).
norc=""
if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; norc=1; fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || { [ -z "$norc" ] || rm -f /usr/sbin/policy-rc.d; exit 1; }
[ -z "$norc" ] || rm -f /usr/sbin/policy-rc.d
# Debian's containerd package starts a system containerd; ours runs with its own socket and root, but the
# system one would share runc's state dir, so stop it (it was not running before we installed it).
systemctl disable --now containerd >/dev/null 2>&1 || true

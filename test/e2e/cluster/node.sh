#!/bin/bash
# A node beside the host's node1, and the faults a node meets. node<N> runs containerd, the kubelet, kube-proxy,
# kube-router's NetworkPolicy controller and the fake device plugin, built and configured as node1's (lib.sh), in
#  - network namespace et-node<N>: node IP 10.250.0.<N>, its own cni0 and pods in 10.244.<N-1>.0/24, iptables and
#    ipsets of its own; the host routes both through veth et-node<N>;
#  - a mount namespace of its own, held by a `sleep` (the holder): the kubelet's hard-coded /var/lib/kubelet
#    (device plugins, pod resources) and /var/log/containers are the node's own, and its volume mounts vanish with it;
#  - cgroup /et-node<N> in every hierarchy: its processes, and (the kubelet's cgroupRoot) its pods.
# Its state is under $RUN/nodes/node<N>.
#   node.sh up NODE         start the node, or start it again after a crash (a reboot: containerd's root and the
#                           kubelet's directory survive, as a disk does); waits until it is Ready with its devices
#   node.sh crash NODE      a power loss: its network cut first (so no FIN or RST escapes), then every process of it
#                           (daemons, shims, containers) frozen and SIGKILLed at once
#   node.sh partition NODE  its network cut: every packet to or from it dropped silently; its processes run on
#   node.sh heal NODE       the network back (after partition; after crash, use up)
#   node.sh down NODE       stop it, delete its Node object and remove every trace (down.sh calls it)
#   node.sh list            the nodes that have state under $RUN/nodes
set -euo pipefail
. "$(dirname "$(readlink -f "$0")")/env.sh"
PROG=node
. "$CLUSTER_DIR/lib.sh"
[ "$(id -u)" = 0 ] || { echo "node: must run as root"; exit 1; }
cmd=${1:-}; node=${2:-}
if [ "$cmd" = list ]; then ls "$RUN/nodes" 2>/dev/null || true; exit 0; fi
[ -n "$node" ] || { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
ip=$(node_ip "$node"); cidr=$(node_pod_cidr "$node")
ns=et-$node; veth=et-$node; cg=et-$node; part=et-partition-$node
NDIR=$RUN/nodes/$node; NPIDS=$NDIR/pids; NLOGS=$LOGS/$node
DAEMONS="containerd kubelet kube-proxy kube-router fake-device-plugin"

cgroups() { local d; for d in /sys/fs/cgroup/*/; do [ -f "$d/cgroup.procs" ] && echo "${d%/}"; done; }
node_procs() { local d; for d in $(cgroups); do [ -d "$d/$cg" ] && find "$d/$cg" -name cgroup.procs -exec cat {} +; done 2>/dev/null | sort -un; }
in_ns() { nsenter --net="/run/netns/$ns" -- "$@"; }

partition() {
  nft list table inet "$part" >/dev/null 2>&1 && return
  nft -f - <<X
table inet $part {
  chain forward_cut { type filter hook forward priority -50; policy accept; iifname "$veth" drop; oifname "$veth" drop; }
  chain input_cut { type filter hook input priority -50; policy accept; iifname "$veth" drop; }
  chain output_cut { type filter hook output priority -50; policy accept; oifname "$veth" drop; }
}
X
}
heal() { nft list table inet "$part" >/dev/null 2>&1 && nft delete table inet "$part"; return 0; }

# Every process of the node at once: frozen first (none can fork or react), SIGKILLed, thawed to die.
kill_all() {
  local fz=/sys/fs/cgroup/freezer/$cg p i
  if [ -d "$fz" ]; then
    echo FROZEN > "$fz/freezer.state"
    for i in $(seq 100); do [ "$(cat "$fz/freezer.state")" = FROZEN ] && break; sleep 0.05; done
  fi
  for p in $(node_procs); do kill -KILL "$p" 2>/dev/null || true; done
  [ -d "$fz" ] && echo THAWED > "$fz/freezer.state"
  for i in $(seq 200); do [ -z "$(node_procs)" ] && return 0; sleep 0.05; done
  echo "node: processes of $node still alive after SIGKILL: $(node_procs | tr '\n' ' ')"; return 1
}

net_up() {
  [ -e "/run/netns/$ns" ] || ip netns add "$ns"
  ip link show "$veth" >/dev/null 2>&1 || ip link add "$veth" type veth peer name eth0 netns "$ns"
  ip link set "$veth" up
  in_ns ip link set lo up; in_ns ip link set eth0 up
  in_ns ip -o addr show dev eth0 | has " $ip/32" || in_ns ip addr add "$ip/32" dev eth0
  in_ns ip route replace "$NODE_IP" dev eth0
  in_ns ip route replace default via "$NODE_IP" dev eth0
  ip route replace "$ip" dev "$veth" src "$NODE_IP"
  ip route replace "$cidr" via "$ip" dev "$veth"
  in_ns sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1
}

pki() { # a kubelet client certificate of its own (the Node authorizer); kube-proxy's token and kube-router's cert
  local k=$NDIR/pki S="https://$NODE_IP:$APISERVER_PORT"
  mkdir -p "$k"
  if [ ! -f "$k/kubelet.crt" ]; then
    openssl genrsa -out "$k/kubelet.key" 2048 2>/dev/null
    openssl req -new -key "$k/kubelet.key" -subj "/O=system:nodes/CN=system:node:$node" -out "$k/kubelet.csr"
    openssl x509 -req -in "$k/kubelet.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 3650 \
      -extfile <(printf 'extendedKeyUsage=clientAuth\n') -out "$k/kubelet.crt" 2>/dev/null
  fi
  cat > "$NDIR/kubelet.kubeconfig" <<X
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$S", certificate-authority: "$PKI/ca.crt"}}]
users: [{name: kubelet, user: {client-certificate: "$k/kubelet.crt", client-key: "$k/kubelet.key"}}]
contexts: [{name: local, context: {cluster: local, user: kubelet}}]
current-context: local
X
  # node1's, with the API server's address as this node reaches it
  sed "s#https://127.0.0.1:$APISERVER_PORT#$S#" "$RUN/kube-proxy.kubeconfig" > "$NDIR/kube-proxy.kubeconfig"
  sed "s#https://127.0.0.1:$APISERVER_PORT#$S#" "$RUN/kube-router.kubeconfig" > "$NDIR/kube-router.kubeconfig"
}

cgroups_up() {
  local d
  for d in $(cgroups); do
    mkdir -p "$d/$cg"
    if [ -f "$d/cpuset.cpus" ] && [ -z "$(cat "$d/$cg/cpuset.cpus")" ]; then   # cgroup v1: a new cpuset is empty
      cat "$d/cpuset.cpus" > "$d/$cg/cpuset.cpus"; cat "$d/cpuset.mems" > "$d/$cg/cpuset.mems"
    fi
  done
}
# node_start NAME CMD...: a daemon of the node, in its namespaces and cgroup.
node_start() {
  local n=$1; shift
  if alive "$n" "$NPIDS"; then return; fi
  setsid nsenter --target "$(cat "$NPIDS/holder.pid")" --net --mount -- \
    bash -c 'for f in "$0"/*/"$1"/cgroup.procs; do echo $$ > "$f"; done; shift; exec "$@"' /sys/fs/cgroup "$cg" "$@" \
    >>"$NLOGS/$n.log" 2>&1 < /dev/null 8>&- &
  savepid $! "$NPIDS/$n"
}

up() {
  [ "$("$CLUSTER_DIR/status.sh" --control-plane >/dev/null 2>&1; echo $?)" = 0 ] || { echo "node: the control plane is not running (make cluster-up)"; exit 1; }
  mkdir -p "$NPIDS" "$NLOGS" "$NDIR/var-lib-kubelet" "$NDIR/var-log-containers" /var/log/containers /var/lib/kubelet
  heal; net_up; pki; cgroups_up
  node_configs "$NDIR" "$node" "$ip" "$cidr" "/$cg"
  if ! alive holder "$NPIDS"; then
    # A reboot starts from nothing: what a crash left (pid files of dead daemons) is gone.
    rm -f "$NPIDS"/*.pid "$NPIDS"/*.start
    setsid nsenter --net="/run/netns/$ns" -- unshare --mount --propagation private -- bash -c '
      for f in /sys/fs/cgroup/*/"$0"/cgroup.procs; do echo $$ > "$f"; done
      mount --bind "$1/var-lib-kubelet" /var/lib/kubelet && mount --bind "$1/var-log-containers" /var/log/containers &&
        exec sleep infinity' "$cg" "$NDIR" >>"$NLOGS/holder.log" 2>&1 < /dev/null 8>&- &
    savepid $! "$NPIDS/holder"
    waitfor "$node: namespaces" 10 bash -c "grep -q ' /var/lib/kubelet ' /proc/$(cat "$NPIDS/holder.pid")/mountinfo"
  fi
  node_start containerd containerd --config "$NDIR/containerd.toml"
  waitfor "$node: containerd" 30 containerd_ready "$NDIR/containerd/containerd.sock"
  "$HACK_DIR/images.sh" --import-only | sed 's/^/  /'   # before the kubelet: the node takes pods once Ready
  node_start kubelet "$BIN/kubelet" --config "$NDIR/kubelet-config.yaml" --kubeconfig "$NDIR/kubelet.kubeconfig" \
    --root-dir "$NDIR/kubelet" --cert-dir "$NDIR/kubelet/pki" --hostname-override "$node" --node-ip "$ip" --v=1
  node_start kube-proxy "$BIN/kube-proxy" --config "$NDIR/kube-proxy-config.yaml" --v=1
  node_start fake-device-plugin "$BIN/fake-device-plugin" -dir "$DEVICE_PLUGIN_DIR" $(for r in $FAKE_DEVICES; do echo "-resource $r"; done)
  waitfor "node $node" 120 kubectl wait --for=condition=Ready "node/$node" --timeout=1s
  local kr_from=1; alive kube-router "$NPIDS" || kr_from=$(( $(stat -c %s "$NLOGS/kube-router.log" 2>/dev/null || echo 0) + 1 ))
  # NODE_NAME first: kube-router takes its node from that variable before --hostname-override, and env.sh exports
  # node1's; with it, node2's kube-router enforced the policies of node1's pods and left its own pods open.
  node_start kube-router env NODE_NAME="$node" "$BIN/kube-router" --kubeconfig "$NDIR/kube-router.kubeconfig" --hostname-override "$node" \
    --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
    --service-cluster-ip-range "$SVC_CIDR" --health-port 0 --metrics-port 0
  gpus() { local r p; for r in $FAKE_DEVICES; do p=$(echo "${r%%=*}" | sed 's/\./\\./g')
    [ "$(kubectl get node "$node" -o jsonpath="{.status.allocatable.$p}")" = "${r#*=}" ] || return 1; done; }
  waitfor "$node: fake devices allocatable" 60 gpus
  kr_ready() { tail -c +"$kr_from" "$NLOGS/kube-router.log" | has 'Starting network policy controller full sync' &&
    in_ns iptables -S KUBE-ROUTER-FORWARD 2>/dev/null | has 'explicitly ACCEPT'; }
  waitfor "$node: kube-router (NetworkPolicy)" 60 kr_ready
  for n in holder $DAEMONS; do alive "$n" "$NPIDS" || { echo "node: $node's $n died, see $NLOGS"; exit 1; }; done
  ts "$node up ($ip, pods $cidr)"
}

down() {
  [ -d "$NDIR" ] || [ -e "/run/netns/$ns" ] || return 0
  heal
  # Gracefully, as down.sh does for node1: the kubelet first, then the pods through CRI (CNI DEL runs).
  if alive kubelet "$NPIDS"; then kill -TERM "$(cat "$NPIDS/kubelet.pid")"; for _ in $(seq 50); do alive kubelet "$NPIDS" || break; sleep 0.1; done; fi
  if alive containerd "$NPIDS" && alive holder "$NPIDS"; then
    nsenter --target "$(cat "$NPIDS/holder.pid")" --net --mount -- "$BIN/cri-cleanup" -endpoint "unix://$NDIR/containerd/containerd.sock" rmall >/dev/null || true
  fi
  kill_all || true
  rm -f "$NPIDS"/*.pid "$NPIDS"/*.start "$NDIR"/imported/*
  local d; for d in $(cgroups); do [ -d "$d/$cg" ] && find "$d/$cg" -depth -type d -exec rmdir {} \; 2>/dev/null; done
  [ -e "/run/netns/$ns" ] && ip netns del "$ns"   # takes the veth pair and the host's routes through it along
  # The node's pod network namespaces were pinned in its own mount namespace: on the host they are plain files.
  local f; for f in /var/run/netns/cni-*; do [ -f "$f" ] && ! mountpoint -q "$f" && rm -f "$f"; done
  kubectl delete node "$node" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  ts "$node down"
}

case $cmd in
  up) up ;;
  down) down ;;
  partition) [ -e "/run/netns/$ns" ] || { echo "node: $node is not up"; exit 1; }; partition; ts "$node partitioned" ;;
  heal) heal; ts "$node healed" ;;
  crash) [ -e "/run/netns/$ns" ] || { echo "node: $node is not up"; exit 1; }; partition; kill_all; ts "$node crashed (its network stays cut until: node.sh up $node)" ;;
  *) echo "node: unknown command $cmd (up, down, crash, partition, heal, list)"; exit 2 ;;
esac

#!/bin/bash
# Starts (or completes) the local test cluster: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, containerd (CRI, cgroupfs, bridge CNI), kubelet, kube-proxy (iptables), kube-router (only its
# NetworkPolicy controller: the bridge CNI enforces no NetworkPolicy), CoreDNS and the fake device plugin, all as
# host processes with pid files and logs under $RUN: that is node1. Then the nodes of EXTRA_NODES (node.sh: the
# same node components in namespaces of their own). Idempotent: a second run starts only
# what is not running. Builds missing binaries first (minutes the first time). down.sh undoes every host change.
set -euo pipefail
. "$(dirname "$(readlink -f "$0")")/env.sh"
. "$CLUSTER_DIR/lib.sh"
[ "$(id -u)" = 0 ] || { echo "up: must run as root (it starts a kubelet, containerd and changes routes/iptables); try: sudo make cluster-up"; exit 1; }
mkdir -p "$(dirname "$LOCK_FILE")"; exec 8>"$LOCK_FILE"
flock -n 8 || { echo "up: waiting for another cluster-up/cluster-down on this machine (lock $LOCK_FILE)"; flock 8; }

# One cluster per machine: the kubelet port, cni0, iptables chains and the device-plugin dir are node-global.
if [ -f "$INSTANCE_FILE" ] && [ "$(cat "$INSTANCE_FILE")" != "$RUN" ]; then
  other=$(cat "$INSTANCE_FILE")
  for f in "$other"/pids/*.pid; do
    [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && { echo "up: another instance of this cluster is running (state in $other); stop it first: ET_CACHE=${other%/run} make cluster-down"; exit 1; }
  done
fi
for pc in "$KUBELET_PORT:kubelet" "$APISERVER_PORT:kube-apiserver" "$ETCD_CLIENT_PORT:etcd" "$ETCD_PEER_PORT:etcd"; do
  port=${pc%%:*}; comp=${pc#*:}
  owner=$(ss -Hltnp "sport = :$port" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2 || true)
  if [ -n "$owner" ] && { ! alive "$comp" || [ "$owner" != "$(cat "$PIDS/$comp.pid")" ]; }; then
    echo "up: port $port (our $comp) is taken by pid $owner ($(tr '\0' ' ' < /proc/$owner/cmdline | cut -c1-120)): another Kubernetes is running on this machine; stop it first"
    exit 1
  fi
done
"$HACK_DIR/deps.sh"
"$CLUSTER_DIR/build.sh"
mkdir -p "$RUN" "$LOGS" "$PIDS" "$RUN/cni/net.d" "$RUN/cni/ipam" "$RUN/kubelet" "$RUN/pod-logs"
echo "$RUN" > "$INSTANCE_FILE"

# --- host changes (originals saved once, restored by down.sh)
# No saved sysctls means the host is as we found it: record it, for check-clean.sh to compare after down.sh.
[ -f "$RUN/sysctl.orig" ] || "$CLUSTER_DIR/check-clean.sh" snapshot
[ -f "$RUN/sysctl.orig" ] || for s in net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables \
   vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.conf.all.route_localnet; do
   echo "$s=$(sysctl -n $s)"; done > "$RUN/sysctl.orig"
modprobe br_netfilter 2>/dev/null || true
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1
ip addr show dev lo | has " $NODE_IP/32" || ip addr add "$NODE_IP/32" dev lo
# Service CIDR guard: a packet to a ClusterIP that kube-proxy did not rewrite must fail here, never leave.
#  - forwarded (pod) traffic is DNATed in PREROUTING, before routing: what is still addressed to the Service
#    CIDR hits the unreachable route in the main table and the pod gets "host unreachable".
#  - the host's own traffic is routed BEFORE the OUTPUT DNAT, so an unreachable route would break host ->
#    ClusterIP; instead the host's packets to the Service CIDR are routed to lo (source $NODE_IP, which pods
#    reach), kube-proxy's DNAT reroutes rewritten ones to the pod, and our chain rejects the rest on lo.
ip route show type unreachable | has "^unreachable $SVC_CIDR" || ip route add unreachable "$SVC_CIDR"
ip route show table "$GUARD_TABLE" 2>/dev/null | has "^$SVC_CIDR dev lo" || ip route add "$SVC_CIDR" dev lo src "$NODE_IP" table "$GUARD_TABLE"
ip rule show pref "$GUARD_TABLE" | has . || ip rule add pref "$GUARD_TABLE" iif lo to "$SVC_CIDR" lookup "$GUARD_TABLE"
# An ICMP error for the host's own SYN rejected in OUTPUT never reaches the socket (connect() would hang until
# its timeout), so TCP gets a RST (connect fails at once with ECONNREFUSED); for UDP the drop already makes
# send() fail with EPERM.
iptables -S "$GUARD_CHAIN" >/dev/null 2>&1 || { iptables -N "$GUARD_CHAIN"
  iptables -A "$GUARD_CHAIN" -o lo -d "$SVC_CIDR" -p tcp -j REJECT --reject-with tcp-reset
  iptables -A "$GUARD_CHAIN" -o lo -d "$SVC_CIDR" -j REJECT --reject-with icmp-admin-prohibited; }
iptables -C OUTPUT -j "$GUARD_CHAIN" 2>/dev/null || iptables -I OUTPUT -j "$GUARD_CHAIN"
# Pods' own packets stay on the machine: forwarded traffic from the pod network to anything but the pod network is
# rejected (pods reach the host's addresses through INPUT, which this does not touch). In an nftables table of its
# own, not in iptables' FORWARD: kube-router's NetworkPolicy controller ACCEPTs what a policy lets a pod send in the
# first rule of FORWARD (and keeps its jump first), which would end that chain before any rule of ours; an accept
# ends only its own table's chain, so this reject applies whatever iptables says.
nft list table ip "$GUARD_NFT" >/dev/null 2>&1 || nft -f - <<X
table ip $GUARD_NFT {
  chain forward {
    type filter hook forward priority -10; policy accept;
    ip saddr $POD_CIDR ip daddr != $POD_CIDR reject with icmp type net-unreachable
    ip saddr $NODE_NET ip daddr != { $POD_CIDR, $NODE_NET } reject with icmp type net-unreachable
  }
}
X
"$CLUSTER_DIR/pki.sh" >/dev/null

# --- etcd
start etcd "$BIN/etcd" --name node1 --data-dir "$RUN/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "node1=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "" \
  --quota-backend-bytes 2147483648 --unsafe-no-fsync --log-level warn

# --- containerd (independent of the control plane, start early)
node_configs "$RUN" "$NODE_NAME" "$NODE_IP" "$NODE_POD_CIDR" /
start containerd containerd --config "$RUN/containerd.toml"

waitfor etcd 30 curl -sf "http://127.0.0.1:$ETCD_CLIENT_PORT/health"

# --- kube-apiserver
start kube-apiserver "$BIN/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$ETCD_CLIENT_PORT" \
  --bind-address 0.0.0.0 --secure-port "$APISERVER_PORT" --advertise-address "$NODE_IP" \
  --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" --client-ca-file "$PKI/ca.crt" \
  --token-auth-file "$PKI/tokens.csv" --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
  --service-account-issuer "https://kubernetes.default.svc.$CLUSTER_DOMAIN" \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-cluster-ip-range "$SVC_CIDR" --allow-privileged=true \
  --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types InternalIP --profiling=false --v=1

waitfor containerd 30 containerd_ready "$CTR_SOCK"
"$HACK_DIR/images.sh" --base | sed 's/^/  /'   # imports every tarball in $IMAGES that changed
ts "images imported: $(ctr -a "$CTR_SOCK" -n k8s.io images ls -q | grep -c local/)"

waitfor kube-apiserver 90 curl -sf --cacert "$PKI/ca.crt" "https://127.0.0.1:$APISERVER_PORT/readyz"

start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$RUN/kcm.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false \
  --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" --use-service-account-credentials=true \
  --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
  --allocate-node-cidrs=true --cluster-cidr "$POD_CIDR" --node-cidr-mask-size 24 --service-cluster-ip-range "$SVC_CIDR" \
  --authentication-kubeconfig "$RUN/kcm.kubeconfig" --authorization-kubeconfig "$RUN/kcm.kubeconfig" --v=1
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$RUN/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false \
  --authentication-kubeconfig "$RUN/scheduler.kubeconfig" --authorization-kubeconfig "$RUN/scheduler.kubeconfig" --v=1

# CoreDNS RBAC + host process
kubectl apply -f - >/dev/null <<X
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- {apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: User, name: "system:coredns", apiGroup: rbac.authorization.k8s.io}]
---
# kube-router's NetworkPolicy controller (its informers list and watch all of these)
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:kube-router"}
rules:
- {apiGroups: [""], resources: [namespaces, pods, services, endpoints, nodes], verbs: [get, list, watch]}
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [get, list, watch]}
- {apiGroups: [networking.k8s.io], resources: [networkpolicies], verbs: [get, list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:kube-router"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:kube-router"}
subjects: [{kind: User, name: "system:kube-router", apiGroup: rbac.authorization.k8s.io}]
X
# No "forward" plugin: names outside the cluster get an error at once instead of a query leaving the machine.
# Negative answers are cached 1 s only: a new pod's name (a peer that just started) resolves a moment later.
writecfg "$RUN/Corefile" <<X
.:53 {
    bind $CLUSTER_DNS
    errors
    health 127.0.0.1:$COREDNS_HEALTH_PORT
    ready 127.0.0.1:$COREDNS_READY_PORT
    kubernetes $CLUSTER_DOMAIN in-addr.arpa ip6.arpa {
        kubeconfig $RUN/coredns.kubeconfig local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    cache 5 {
        denial 9984 1 0
    }
    loadbalance
}
X
start coredns "$BIN/coredns" -conf "$RUN/Corefile"
# The cluster's OCI registry, on the node network only (node2's containerd reaches it there); empty at each start.
alive registry || rm -rf "$RUN/registry"
start registry "$BIN/registry" --addr "$LOCAL_REGISTRY" --dir "$RUN/registry"

# --- kubelet
start kubelet "$BIN/kubelet" --config "$RUN/kubelet-config.yaml" --kubeconfig "$RUN/kubelet.kubeconfig" \
  --root-dir "$RUN/kubelet" --cert-dir "$RUN/kubelet/pki" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --v=1

# --- kube-proxy
start kube-proxy "$BIN/kube-proxy" --config "$RUN/kube-proxy-config.yaml" --v=1

# --- fake accelerators: a device plugin registered with the kubelet (re-registers when the kubelet restarts)
start fake-device-plugin "$BIN/fake-device-plugin" -dir "$DEVICE_PLUGIN_DIR" $(for r in $FAKE_DEVICES; do echo "-resource $r"; done)

waitfor coredns 30 curl -sf "http://127.0.0.1:$COREDNS_READY_PORT/ready"
waitfor registry 30 curl -sf "http://$LOCAL_REGISTRY/v2/"
waitfor kubelet 60 curl -sf "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz"
waitfor kube-proxy 60 curl -sf "http://127.0.0.1:$PROXY_HEALTHZ_PORT/healthz"
waitfor "node $NODE_NAME" 120 kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=1s

# --- NetworkPolicy: kube-router's controller alone (no routing, no service proxy: the bridge CNI and kube-proxy do
# those). It reads its node (the InternalIP tells which pods are local) when it starts, so it comes after the node.
# For every local pod it adds a chain (KUBE-POD-FW-*) behind KUBE-ROUTER-INPUT/FORWARD/OUTPUT, jumped to from the
# first rule of INPUT, FORWARD and OUTPUT, and ipsets (KUBE-SRC-*, KUBE-DST-*) of the addresses a policy admits.
# Traffic from this host's own addresses to a pod is always admitted (the kubelet's probes, the API server's proxy
# and webhook calls). down.sh removes the chains and ipsets. No health or metrics port: kube-router's would listen on
# every address of the machine, with Go's pprof on it, and its /healthz says OK before anything is synced.
kr_from=1; alive kube-router || kr_from=$(( $(stat -c %s "$LOGS/kube-router.log" 2>/dev/null || echo 0) + 1 ))
start kube-router "$BIN/kube-router" --kubeconfig "$RUN/kube-router.kubeconfig" --hostname-override "$NODE_NAME" \
  --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
  --service-cluster-ip-range "$SVC_CIDR" --health-port 0 --metrics-port 0
# Ready: this process got to its sync loop (its log since the start says so) and a full sync wrote the final ACCEPT
# of its top chains.
kube_router_ready() {
  tail -c +"$kr_from" "$LOGS/kube-router.log" | has 'Starting network policy controller full sync' &&
    iptables -S KUBE-ROUTER-FORWARD 2>/dev/null | has 'explicitly ACCEPT'
}
waitfor "default serviceaccount" 60 kubectl -n default get serviceaccount default
gpus() { local r p; for r in $FAKE_DEVICES; do p=$(echo "${r%%=*}" | sed 's/\./\\./g')
  [ "$(kubectl get node "$NODE_NAME" -o jsonpath="{.status.allocatable.$p}")" = "${r#*=}" ] || return 1; done; }
waitfor "fake devices ($FAKE_DEVICES) allocatable" 60 gpus
waitfor "kube-router (NetworkPolicy)" 60 kube_router_ready
for f in "$PIDS"/*.pid; do kill -0 "$(cat "$f")" 2>/dev/null || { echo "up: $(basename "$f" .pid) died, see $LOGS"; exit 1; }; done
# --- the other nodes (node.sh): each in network and mount namespaces of its own, routed from here
for n in $EXTRA_NODES; do T0=$T0 "$CLUSTER_DIR/node.sh" up "$n" | sed 's/^/  /'; done
ts "cluster up: $NODE_NAME $EXTRA_NODES (state in $RUN)"
echo "export KUBECONFIG=$KUBECONFIG"

# Helpers of up.sh and node.sh (sourced after env.sh): process start, config writing, waiting, and the one
# description of a node's configuration (containerd, CNI, kubelet, kube-proxy), which node1 (the host) and every
# node of node.sh share.
T0=${T0:-$(date +%s.%N)}
PROG=${PROG:-up}
ts() { awk -v t0="$T0" -v t1="$(date +%s.%N)" -v m="$*" -v p="$PROG" 'BEGIN{printf "%s: [%5.1fs] %s\n", p, t1-t0, m}'; }
# alive NAME [PIDDIR]: the process of a pid file runs.
# A pid alone may be another process's by now: pid_max is 32768 on these machines and pids wrap within minutes
# under a test's load (a crashed node's daemons were taken for alive by their old pids, and node2 never came back).
# Beside each pid file, NAME.start holds the process's start time (clock ticks since boot, /proc/PID/stat field
# 22, which exec keeps).
starttime() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | awk '{print $20}'; }
savepid() { echo "$1" > "$2.pid"; starttime "$1" > "$2.start"; }  # PID PATH-WITHOUT-.pid
alive() { local d=${2:-$PIDS} p; [ -f "$d/$1.pid" ] || return 1; p=$(cat "$d/$1.pid")
  kill -0 "$p" 2>/dev/null && { [ ! -s "$d/$1.start" ] || [ "$(starttime "$p")" = "$(cat "$d/$1.start")" ]; }; }
start() { # name cmd...  (background, log + pid file in $LOGS and $PIDS)
  local n=$1; shift
  if alive "$n"; then ts "$n already running"; return; fi
  setsid "$@" >>"$LOGS/$n.log" 2>&1 < /dev/null 8>&- &   # 8>&-: daemons must not inherit the lock
  savepid $! "$PIDS/$n"
}
# containerd answers on socket $1. Not `test -S`: a containerd killed with SIGKILL (a crashed node) leaves its socket
# file behind, and a kubelet started against it exits at once ("connection refused") and never comes back.
containerd_ready() { timeout 5 ctr --address "$1" version >/dev/null 2>&1; }
writecfg() { # file <stdin> : replace only when content changes (kube-proxy exits when its config file changes)
  cat > "$1.new"; if cmp -s "$1.new" "$1"; then rm -f "$1.new"; else mv -f "$1.new" "$1"; fi
}
waitfor() { # desc timeout cmd...
  local d=$1 t=$2; shift 2; local i=0
  until "$@" >/dev/null 2>&1; do i=$((i+1)); [ $i -gt $((t*5)) ] && { echo "$PROG: TIMEOUT waiting for $d (logs in $LOGS)"; exit 1; }; sleep 0.2; done
  ts "$d ready"
}

# node_configs DIR NODE IP POD_CIDR CGROUP_ROOT: writes DIR/containerd.toml, DIR/cni/net.d/10-bridge.conflist,
# DIR/kubelet-config.yaml and DIR/kube-proxy-config.yaml for one node, its state under DIR (containerd's root and
# socket DIR/containerd/containerd.sock, pod logs DIR/pod-logs, IPAM DIR/cni/ipam) and its kubeconfigs
# DIR/kube-proxy.kubeconfig (the kubelet's is given on its command line).
node_configs() {
  local dir=$1 node=$2 ip=$3 cidr=$4 cgroot=$5
  mkdir -p "$dir/cni/net.d" "$dir/cni/ipam" "$dir/kubelet" "$dir/pod-logs" "$dir/certs.d/$LOCAL_REGISTRY"
  writecfg "$dir/containerd.toml" <<X
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
[grpc]
  address = "$dir/containerd/containerd.sock"
[ttrpc]
  address = "$dir/containerd/containerd.sock.ttrpc"
[debug]
  level = "warn"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true   # no CAP_SYS_RESOURCE here: cannot lower oom_score_adj below 0
  max_container_log_line_size = 16384
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$dir/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$dir/certs.d"
X
  # The cluster's registry speaks plain HTTP (env.sh LOCAL_REGISTRY); every other registry as containerd's default.
  writecfg "$dir/certs.d/$LOCAL_REGISTRY/hosts.toml" <<X
server = "http://$LOCAL_REGISTRY"
[host."http://$LOCAL_REGISTRY"]
  capabilities = ["pull", "resolve"]
X
  # No masquerade: pods keep their addresses across nodes (NetworkPolicy sees the real source), and nothing of a
  # pod may leave the machine anyway (the guard in up.sh).
  writecfg "$dir/cni/net.d/10-bridge.conflist" <<X
{
  "cniVersion": "1.0.0",
  "name": "k8s-real",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$dir/cni/ipam",
              "ranges": [[{"subnet": "$cidr"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
X
  # The control plane keeps Kubernetes' default timeouts (node-monitor-grace-period, the eviction tolerations):
  # the node-loss tests measure what a real cluster does. Only how often this kubelet reports is shortened.
  writecfg "$dir/kubelet-config.yaml" <<X
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$dir/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: $cgroot
failCgroupV1: false
failSwapOn: false
clusterDomain: $CLUSTER_DOMAIN
clusterDNS: [$CLUSTER_DNS]
resolvConf: /etc/resolv.conf
podLogsDir: $dir/pod-logs
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
protectKernelDefaults: false
makeIPTablesUtilChains: true
maxPods: 110
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 2s   # a test cluster: Ready and device-plugin changes show up fast
X
  writecfg "$dir/kube-proxy-config.yaml" <<X
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$dir/kube-proxy.kubeconfig"}
mode: iptables
hostnameOverride: $node
clusterCIDR: $POD_CIDR
detectLocalMode: ClusterCIDR
metricsBindAddress: 127.0.0.1:$PROXY_METRICS_PORT
healthzBindAddress: 127.0.0.1:$PROXY_HEALTHZ_PORT
conntrack: {maxPerCore: 0, min: 0}
iptables: {syncPeriod: 5s, minSyncPeriod: 0s}
X
}

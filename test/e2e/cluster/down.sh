#!/bin/bash
# Stops everything up.sh started (by pid file only, never by name) and undoes every host change:
# pods (through CRI, so CNI DEL runs), processes, mounts, kube-proxy/kube-router/CNI/guard iptables rules,
# kube-router's ipsets, cni0, the node IP on lo, the guard's routes, rules and nftables table, kubelet cgroups and
# files, sysctls.
# Safe to run when nothing runs.
#   down.sh          stop and clean up, keep $RUN (pki, etcd data: a later up.sh restarts faster)
#   down.sh --purge  also delete $RUN
set -uo pipefail
. "$(dirname "$(readlink -f "$0")")/env.sh"
[ "$(id -u)" = 0 ] || { echo "down: must run as root"; exit 1; }
if [ -f "$INSTANCE_FILE" ] && [ "$(cat "$INSTANCE_FILE")" != "$RUN" ]; then
  echo "down: the running instance is not ours (state in $(cat "$INSTANCE_FILE")); use ET_CACHE=$(dirname "$(cat "$INSTANCE_FILE")") to stop it"; exit 1
fi
mkdir -p "$(dirname "$LOCK_FILE")"; exec 8>"$LOCK_FILE"; flock 8
T0=$(date +%s.%N)
stop() { # name... : SIGTERM all in parallel, wait up to 15s, then SIGKILL
  local T0=$(( $(date +%s%N)/1000000 )) n p pids=()
  for n in "$@"; do [ -f "$PIDS/$n.pid" ] || continue; p=$(cat "$PIDS/$n.pid")
    kill -0 "$p" 2>/dev/null && { kill -TERM "$p"; pids+=("$n:$p"); }; done
  for _ in $(seq 150); do local alive=0
    for x in "${pids[@]}"; do kill -0 "${x#*:}" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break; sleep 0.1; done
  for x in "${pids[@]}"; do kill -0 "${x#*:}" 2>/dev/null && { echo "${x%%:*} did not exit, SIGKILL"; kill -KILL "${x#*:}"; }; done
  for n in "$@"; do rm -f "$PIDS/$n.pid" "$PIDS/$n.start"; done
  echo "down: stopped $* ($(( $(date +%s%N)/1000000 - T0 ))ms)"
}
# 0. the other nodes (node.sh), while the API server still runs to delete their Node objects
for d in "$RUN"/nodes/*/; do [ -d "$d" ] && T0=$T0 "$CLUSTER_DIR/node.sh" down "$(basename "$d")"; done
for n in $(ip netns list 2>/dev/null | awk '/^et-node/{print $1}'); do T0=$T0 "$CLUSTER_DIR/node.sh" down "${n#et-}"; done
# 1. stop kubelet first so it does not restart what we remove, then tear pods down through CRI (runs CNI DEL)
stop kubelet
if [ -S "$CTR_SOCK" ] && [ -f "$PIDS/containerd.pid" ] && kill -0 "$(cat "$PIDS/containerd.pid")" 2>/dev/null; then
  "$BIN/cri-cleanup" -endpoint "unix://$CTR_SOCK" rmall || true
fi
stop kube-router kube-proxy coredns registry fake-device-plugin kube-scheduler kube-controller-manager containerd kube-apiserver
stop etcd
# 2. leftover shims (children of our containerd only: their socket/bundle lives under $RUN)
for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $CTR_SOCK" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
# 3. mounts under $RUN (kubelet tmpfs volumes, containerd overlay/shm), deepest first
grep -F " $RUN/" /proc/self/mountinfo | awk '{print $5}' | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
# 4. network: kube-proxy rules, CNI bridge + masquerade chains, node IP
[ -x "$BIN/kube-proxy" ] && "$BIN/kube-proxy" --cleanup >/dev/null 2>&1
ip link del cni0 2>/dev/null
iptables -t nat -S POSTROUTING 2>/dev/null | grep -E -- '-j CNI-[0-9a-f]+' | sed 's/^-A/-D/' | while read -r r; do iptables -t nat $r; done
for c in $(iptables -t nat -S 2>/dev/null | awk '/^-N CNI-/{print $2}'); do iptables -t nat -F "$c"; iptables -t nat -X "$c"; done
# remaining KUBE-* chains (kubelet canaries/firewall; kube-router's KUBE-ROUTER-*, KUBE-POD-FW-*, KUBE-NWPLCY-*:
# it removes nothing when it stops, and its --cleanup-config would flush every IPVS service and ipset of the host)
# in iptables + ip6tables. eval: `-S` quotes comments with spaces ("kube-router netpol - ...").
for ipt in iptables ip6tables; do for t in filter nat mangle; do
  chains=$($ipt -t $t -S 2>/dev/null | awk '/^-N KUBE-/{print $2}')
  for c in $chains; do $ipt -t $t -S | grep -E -- "-j $c( |$)" | sed 's/^-A/-D/' | while read -r r; do eval "$ipt -t $t $r" 2>/dev/null; done; done
  for c in $chains; do $ipt -t $t -F "$c" 2>/dev/null; done
  for c in $chains; do $ipt -t $t -X "$c" 2>/dev/null; done
done; done
# kube-router's ipsets (its NetworkPolicy controller's: KUBE-SRC-*, KUBE-DST-*), now that no rule uses them
for s in $(ipset list -n 2>/dev/null | grep -E '^KUBE-(SRC|DST)-'); do ipset destroy "$s" 2>/dev/null; done
for t in kube-proxy; do nft list table ip $t >/dev/null 2>&1 && nft delete table ip $t; nft list table ip6 $t >/dev/null 2>&1 && nft delete table ip6 $t; done
ip addr del "$NODE_IP/32" dev lo 2>/dev/null
# Service CIDR guard (see up.sh)
while iptables -D OUTPUT -j "$GUARD_CHAIN" 2>/dev/null; do :; done
while iptables -D FORWARD -j "$GUARD_CHAIN" 2>/dev/null; do :; done   # left by an up.sh older than the nftables guard
iptables -F "$GUARD_CHAIN" 2>/dev/null; iptables -X "$GUARD_CHAIN" 2>/dev/null
while ip rule del pref "$GUARD_TABLE" 2>/dev/null; do :; done
ip route flush table "$GUARD_TABLE" 2>/dev/null
nft list table ip "$GUARD_NFT" >/dev/null 2>&1 && nft delete table ip "$GUARD_NFT"
ip route del unreachable "$SVC_CIDR" 2>/dev/null
# 5. netns pins left by CRI, kubelet cgroups
for n in /var/run/netns/cni-*; do [ -e "$n" ] && { umount "$n" 2>/dev/null; rm -f "$n"; }; done
for ctl in /sys/fs/cgroup/*/; do [ -d "$ctl/kubepods" ] && find "$ctl/kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null; done
# hard-coded kubelet paths outside --root-dir: /var/log/containers symlinks, device-plugin socket
for l in /var/log/containers/*.log; do [ -L "$l" ] && readlink "$l" | has "^$RUN/" && rm -f "$l"; done
rmdir /var/log/containers 2>/dev/null
rm -f "$DEVICE_PLUGIN_DIR"/kubelet.sock "$DEVICE_PLUGIN_DIR"/kubelet_internal_checkpoint "$DEVICE_PLUGIN_DIR"/et-fake-*.sock
rmdir "$DEVICE_PLUGIN_DIR" /var/lib/kubelet 2>/dev/null
# 6. sysctls
if [ -f "$RUN/sysctl.orig" ]; then while IFS== read -r k v; do sysctl -qw "$k=$v" 2>/dev/null; done < "$RUN/sysctl.orig"; rm -f "$RUN/sysctl.orig"; fi
rm -f "$RUN/imported"/* 2>/dev/null   # containerd's root survives, but re-import is cheap and always right
[ -f "$INSTANCE_FILE" ] && rm -f "$INSTANCE_FILE"
[ "${1:-}" = "--purge" ] && rm -rf "$RUN"
awk -v t0="$T0" -v t1="$(date +%s.%N)" 'BEGIN{printf "down: done in %.1fs\n", t1-t0}'

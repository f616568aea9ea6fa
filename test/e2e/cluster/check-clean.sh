#!/bin/bash
# Proves that down.sh left nothing behind.
#   check-clean.sh snapshot   record the host's network/sysctl state (up.sh does this before its first change)
#   check-clean.sh            compare with that snapshot and look for anything of ours; exit 1 listing leftovers
set -uo pipefail
. "$(dirname "$(readlink -f "$0")")/env.sh"
SNAP=$ET_CACHE/host-before
state() { # the host state that up.sh changes, normalised
  echo "## addrs"; ip -o addr show | awk '{print $2, $3, $4}' | sort
  # No list of links: other tests on the machine create veth pairs for their own network namespaces. Ours
  # (cni0, pod veths) are checked by name below, pod network namespaces by their cni- prefix.
  echo "## routes"; ip route show table all | grep -v -e '^local ' -e '^broadcast ' -e ' proto kernel' -e '^fe80' -e '^multicast' | sort
  echo "## rules"; ip rule show | sort
  for ipt in iptables ip6tables; do for t in filter nat mangle raw; do
    echo "## $ipt $t"; $ipt -t $t -S 2>/dev/null | grep -v '^-P' | sort; done; done
  echo "## ipsets"; ipset list -n 2>/dev/null | sort
  echo "## nft tables"; nft list tables 2>/dev/null | grep -v -e 'table ip filter' -e 'table ip nat' -e 'table ip mangle' -e 'table ip raw' \
    -e 'table ip6 filter' -e 'table ip6 nat' -e 'table ip6 mangle' -e 'table ip6 raw' | sort
  echo "## sysctls"; for s in net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables \
    vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.conf.all.route_localnet; do echo "$s=$(sysctl -n $s 2>/dev/null)"; done
}
if [ "${1:-}" = snapshot ]; then mkdir -p "$SNAP"; state > "$SNAP/state"; exit 0; fi
bad=0
leak() { echo "check-clean: LEFT BEHIND: $*"; bad=1; }
for f in "$PIDS"/*.pid; do [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && leak "process $(basename "$f" .pid) pid $(cat "$f")"; done
# Processes running one of our binaries, and containerd shims of our containerd (their -address is our socket).
for e in /proc/[0-9]*/exe; do x=$(readlink "$e" 2>/dev/null) || continue; p=${e#/proc/}; p=${p%/exe}
  case $x in "$BIN"/*) leak "process $p: $x";; esac; done
for p in $(pgrep -f -- "containerd-shim.* -address $CTR_SOCK" 2>/dev/null); do leak "containerd shim pid $p"; done
grep -F " $RUN/" /proc/self/mountinfo | awk '{print $5}' | while read -r m; do echo "check-clean: LEFT BEHIND: mount $m"; done | grep . && bad=1
for port in $KUBELET_PORT $APISERVER_PORT $ETCD_CLIENT_PORT $ETCD_PEER_PORT $KUBELET_HEALTHZ_PORT $PROXY_HEALTHZ_PORT; do
  ss -Hltn "sport = :$port" 2>/dev/null | has . && leak "listener on port $port"; done
ip link show cni0 >/dev/null 2>&1 && leak "bridge cni0"
ip -o addr show dev lo | has " $NODE_IP/" && leak "address $NODE_IP on lo"
ip route show type unreachable | has "$SVC_CIDR" && leak "unreachable route $SVC_CIDR"
ip rule show pref "$GUARD_TABLE" | has . && leak "ip rule pref $GUARD_TABLE"
ip route show table "$GUARD_TABLE" 2>/dev/null | has . && leak "routes in table $GUARD_TABLE"
nft list table ip "$GUARD_NFT" >/dev/null 2>&1 && leak "nftables table ip $GUARD_NFT"
for s in $(ipset list -n 2>/dev/null | grep -E '^KUBE-'); do leak "ipset $s"; done
for ipt in iptables ip6tables; do for t in filter nat mangle; do
  $ipt -t $t -S 2>/dev/null | grep -E -e '^-N (KUBE-|CNI-|ET-)' -e '-j (KUBE-|CNI-|ET-)' | while read -r r; do echo "check-clean: LEFT BEHIND: $ipt -t $t $r"; done | grep . && bad=1
done; done
ls /var/run/netns/cni-* >/dev/null 2>&1 && leak "netns $(ls /var/run/netns/cni-*)"
for ctl in /sys/fs/cgroup/*/; do [ -d "$ctl/kubepods" ] && leak "cgroup ${ctl}kubepods"; done
[ -e "$DEVICE_PLUGIN_DIR" ] && leak "$DEVICE_PLUGIN_DIR"
ls /var/log/containers/ 2>/dev/null | has . && for l in /var/log/containers/*; do readlink "$l" | has "^$RUN/" && leak "log link $l"; done
for n in $(ip netns list 2>/dev/null | awk '/^et-node/{print $1}'); do leak "network namespace $n"; done
ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | grep -E '^et-node' | while read -r l; do echo "check-clean: LEFT BEHIND: link $l"; done | grep . && bad=1
for ctl in /sys/fs/cgroup/*/; do for c in "$ctl"et-node*; do [ -d "$c" ] && leak "cgroup $c"; done; done
nft list tables 2>/dev/null | grep -E 'et-partition' | while read -r t; do echo "check-clean: LEFT BEHIND: nftables $t"; done | grep . && bad=1
for d in "$RUN"/nodes/*/pids; do for f in "$d"/*.pid; do [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && leak "process $f"; done; done
[ -e "$INSTANCE_FILE" ] && leak "instance file $INSTANCE_FILE"
if [ -f "$SNAP/state" ]; then
  d=$(diff <(cat "$SNAP/state") <(state)) || { leak "host state differs from before the first up (< before, > now):"; echo "$d"; }
else
  echo "check-clean: no snapshot of the host before up ($SNAP/state); compared only against known leftovers"
fi
[ $bad = 0 ] && echo "check-clean: nothing left behind"
exit $bad

#!/bin/bash
# Installs the Debian packages the cluster runs on, when missing: containerd + runc (container runtime),
# containernetworking-plugins (bridge/host-local/portmap/loopback CNI), iptables/iproute2 (kube-proxy, routes),
# busybox-static (test image), openssl (pki), curl (health checks), util-linux (flock, setsid), procps (pgrep).
set -euo pipefail
pkgs=(containerd runc containernetworking-plugins iptables iproute2 busybox-static openssl curl util-linux procps)
missing=()
for p in "${pkgs[@]}"; do [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p"); done
[ ${#missing[@]} = 0 ] && exit 0
[ "$(id -u)" = 0 ] || { echo "deps: missing Debian packages ${missing[*]} and not root to install them"; exit 1; }
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian's containerd package starts a system containerd; ours runs with its own socket and root, but the
# system one would share runc's state dir, so stop it (it was not running before we installed it).
systemctl disable --now containerd >/dev/null 2>&1 || true

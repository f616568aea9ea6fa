#!/bin/bash
# Installs the Debian packages the cluster runs on, when missing: containerd + runc (container runtime),
# containernetworking-plugins (bridge/host-local/portmap/loopback CNI), iptables/iproute2 (kube-proxy, routes),
# busybox-static (test image), openssl (pki), curl (health checks), util-linux (flock, setsid), procps (pgrep),
# mmdebstrap (the trainer root filesystems, rootfs.sh). Nothing of torch, MPI or sshd: pods and the integration
# tests run those from the root filesystems.
set -euo pipefail
pkgs=(containerd runc containernetworking-plugins iptables iproute2 busybox-static openssl curl util-linux procps mmdebstrap)
missing=()
for p in "${pkgs[@]}"; do [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p"); done
[ ${#missing[@]} = 0 ] && exit 0
[ "$(id -u)" = 0 ] || { echo "deps: missing Debian packages ${missing[*]} and not root to install them"; exit 1; }
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Packages must not start host services (containerd would start a system containerd): policy-rc.d exit 101 tells
# invoke-rc.d not to start anything. Keep one that is already there (Docker images ship it).
norc=""
if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; norc=1; fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || { [ -z "$norc" ] || rm -f /usr/sbin/policy-rc.d; exit 1; }
[ -z "$norc" ] || rm -f /usr/sbin/policy-rc.d
# Debian's containerd package starts a system containerd; ours runs with its own socket and root, but the
# system one would share runc's state dir, so stop it (it was not running before we installed it).
systemctl disable --now containerd >/dev/null 2>&1 || true

#!/bin/bash
# rootfs.sh SUITE...: builds the trainer root filesystems from Debian's packages with mmdebstrap, one per suite,
# into $ROOTFS/<suite>. The local images (images.sh packs them) and the integration tests (chroot) run torch, python-etcd,
# Open MPI, MPICH and sshd from these, never from the host. A root filesystem is rebuilt only when its stamp changes:
# the suite, the package list, the mirror and the mmdebstrap options. Needs root (mmdebstrap's root mode) and the Debian mirror.
#   trixie  Debian 13: torch 2.6.0, python-etcd 0.4.5, Open MPI 5, MPICH 4.2, mpi4py 4.0
#   forky   testing:   torch 2.14.1, python-etcd 0.4.5, Open MPI 6, MPICH 4.3, mpi4py 4.1
# Usage: rootfs.sh [--stamp SUITE] [SUITE...]   (default: $TRAINER_SUITES; --stamp prints the stamp)
# `make rootfs` (before `make integration` and `make bench-sidecar`) and images.sh run it.
set -euo pipefail
. "$(dirname "$(readlink -f "$0")")/../test/e2e/cluster/env.sh"
# What the examples and tests run: torchrun with both etcd backends, mpirun/mpiexec.hydra with mpi4py (Open MPI's),
# sshd and ssh for MPI workers, pkill/pgrep for the preStop path.
PACKAGES=python3-torch,python3-etcd,python3-mpi4py,openmpi-bin,mpich,openssh-server,openssh-client,procps
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# openssh-server's postinst made host keys: an image must not carry them (every pod would share one key), so they
# go; an MPI worker makes its own. The suites' Release files read as expired by this machine's clock: apt does not
# check their validity dates. Documentation, man pages and locales are left out (about 100 MB).
OPTS=(--variant=minbase --include="$PACKAGES" --aptopt='Acquire::Check-Valid-Until "false"'
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --customize-hook='chroot "$1" apt-get clean' --customize-hook='rm -rf "$1"/var/lib/apt/lists/*'
  --customize-hook='rm -f "$1"/etc/ssh/ssh_host_*')
# Per suite (today the same for all). torch's c10d rendezvous (2.6 and 2.14) creates the hosting agent's TCPStore
# with torch's C++ default, libuv, whatever USE_LIBUV says; Debian's build lacks libuv, official wheels have it.
# Only in these local images, that one call honours USE_LIBUV, so the c10d backend can be tested as users run it
# on wheels.
suite_opts() {
  case $1 in
    *) printf '%s\n' --customize-hook='sed -i "s/^\( *\)multi_tenant=True,$/&\n\1use_libuv=os.environ.get(\"USE_LIBUV\", \"1\") == \"1\",/" "$1"/usr/lib/python3/dist-packages/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py && grep -q "use_libuv=os.environ" "$1"/usr/lib/python3/dist-packages/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py' ;;
  esac
}
stamp() { { printf '%s\n' "$1" "$MIRROR" "${OPTS[@]}"; suite_opts "$1"; } | sha256sum | cut -c1-16; }
if [ "${1:-}" = --stamp ]; then stamp "$2"; exit 0; fi
suites=(${@:-$TRAINER_SUITES})
"$HACK_DIR/deps.sh"   # mmdebstrap
mkdir -p "$ROOTFS"
exec 8>"$ROOTFS/.lock"; flock 8
for suite in "${suites[@]}"; do
  dir=$ROOTFS/$suite s=$(stamp "$suite")
  if [ -f "$dir/.et-stamp" ] && [ "$(cat "$dir/.et-stamp")" = "$s" ]; then
    echo "rootfs: $suite up to date ($(chroot "$dir" dpkg-query -W -f='python3-torch ${Version}' python3-torch))"
    continue
  fi
  echo "rootfs: building $suite ($PACKAGES) into $dir: about 2 minutes, log $ROOTFS/$suite.log"
  t0=$(date +%s); rm -rf "$dir.new"
  # Progress: mmdebstrap names each phase; print one line every 20 s. The old root filesystem stays until the new
  # one is complete.
  mapfile -t extra < <(suite_opts "$suite")
  mmdebstrap "${OPTS[@]}" "${extra[@]}" "$suite" "$dir.new" "$MIRROR" >"$ROOTFS/$suite.log" 2>&1 &
  pid=$!
  while kill -0 $pid 2>/dev/null; do
    sleep 20; kill -0 $pid 2>/dev/null && echo "rootfs:   $suite: $(( $(date +%s) - t0 )) s, $(grep -E '^I: ' "$ROOTFS/$suite.log" | tail -1 | cut -c1-80)"
  done
  wait $pid || { echo "rootfs: $suite FAILED, last lines of $ROOTFS/$suite.log:"; tail -20 "$ROOTFS/$suite.log"; rm -rf "$dir.new"; exit 1; }
  echo "$s" > "$dir.new/.et-stamp"; rm -rf "$dir"; mv "$dir.new" "$dir"
  echo "rootfs: $suite done in $(( $(date +%s) - t0 )) s ($(chroot "$dir" dpkg-query -W -f='python3-torch ${Version}' python3-torch), $(du -sh "$dir" | cut -f1))"
done

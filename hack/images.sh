#!/bin/bash
# Builds the local images (docker-archive tarballs in $IMAGES; no Docker, no registry) and, when the cluster's
# containerd is running, imports them into its k8s.io namespace (test/e2e/cluster/up.sh imports them on start too).
# Their names are set in test/e2e/cluster/env.sh:
#   $PAUSE_IMAGE        static pause (containerd's sandbox image)
#   $BUSYBOX_IMAGE      Debian busybox-static with its applets, for test pods
#   $TRAINER_IMAGE:<suite>  a trainer image per Debian suite in $TRAINER_SUITES (forky: torch 2.14, trixie: torch 2.6),
#                       packed from the root filesystems rootfs.sh builds: torch, python-etcd, Open MPI, MPICH, mpi4py,
#                       sshd. Rebuilt only when that root filesystem was rebuilt.
#   $STOCK_TRAINER_IMAGE  the forky one without python-etcd (a stock torch image's view of the rendezvous)
#   $WEBHOOK_IMAGE, $SIDECAR_IMAGE
#                       the project's ./cmd/webhook and ./cmd/rdzv-sidecar, static (CGO_ENABLED=0); a command
#                       that does not exist yet is skipped with a message.
# `make images`, `make demo`, the e2e tests (test/e2e/framework) and test/e2e/cluster/up.sh (--base) run it.
# The release workflow builds the published images from build/*.Dockerfile instead.
# Push to a registry of yours (docs/install.md): `make images REGISTRY=host[:port][/path] PUSH=1` pushes the webhook
# and the sidecar as $REGISTRY/elastic-training/{webhook,rdzv-sidecar}:<the charts' appVersion>, where both charts
# look with global.imageRegistry=$REGISTRY; PUSH_TRAINERS=1 also pushes the local trainer images as
# $REGISTRY/local/trainer:<suite> (gigabytes each; PUSH_TRAINERS="forky" only those suites); PLAIN_HTTP=1 for a
# registry without TLS. crane (hack/tools)
# pushes them, with the credentials of ~/.docker/config.json.
# Usage: images.sh [--base | --import-only | --remove PREFIX]   (--base: only pause, busybox and the trainer images;
# --import-only: build nothing, import what $IMAGES has into the nodes that lack it; --remove: build nothing, delete
# from every node the images whose name starts with PREFIX, as a fresh node has none: the registry test's pulls)
set -euo pipefail
. "$(dirname "$(readlink -f "$0")")/../test/e2e/cluster/env.sh"
mkdir -p "$IMAGES"; cd "$IMAGES"
exec 9>"$IMAGES/.lock"; flock 9
if [ "${1:-}" = --remove ]; then
  prefix=${2:?images: --remove needs a PREFIX}
  for sock in "$CTR_SOCK" "$RUN"/nodes/*/containerd/containerd.sock; do
    [ -S "$sock" ] || continue
    refs=$(ctr -a "$sock" -n k8s.io images ls -q | awk -v p="$prefix" 'index($0, p) == 1') || continue
    [ -z "$refs" ] || { ctr -a "$sock" -n k8s.io images rm $refs >/dev/null; echo "images: removed $(echo "$refs" | wc -l) images $prefix* from $sock"; }
  done
  exit 0
fi
if [ "${1:-}" != --import-only ]; then
mk() { "$HACK_DIR/mkimage.sh" "$@" >/dev/null; echo "images: built $(basename "$3") ($1)"; }
# Base images only change with this script; rebuild them when it changes.
base_stamp=$(cat "$HACK_DIR/images.sh" "$HACK_DIR/mkimage.sh" "$TOOLS/pause/pause.c" | sha256sum | cut -c1-16)
if [ "$(cat .base-stamp 2>/dev/null)" != "$base_stamp" ] || [ ! -f pause.tar ] || [ ! -f busybox.tar ]; then
  rm -rf rootfs; mkdir -p rootfs/pause
  if ! { gcc -Os -static -o rootfs/pause/pause "$TOOLS/pause/pause.c" && strip rootfs/pause/pause; } 2>/dev/null; then
    (cd "$TOOLS/pause/go" && CGO_ENABLED=0 go build -ldflags "-s -w" -o "$IMAGES/rootfs/pause/pause" .)   # no gcc/static libc
  fi
  mk "$PAUSE_IMAGE" rootfs/pause pause.tar /pause
  BB=$(command -v busybox || true)
  # ldd fails on a static binary, which is what an image without libc needs.
  if [ -z "$BB" ] || ldd "$BB" >/dev/null 2>&1; then echo "images: need a static busybox (apt-get install busybox-static)"; exit 1; fi
  R=rootfs/busybox; mkdir -p $R/{bin,etc,tmp,root}; cp "$BB" $R/bin/busybox
  for a in $($BB --list | grep -vx busybox); do ln -s busybox $R/bin/$a; done
  printf 'root:x:0:0:root:/root:/bin/sh\n' > $R/etc/passwd; printf 'root:x:0:\n' > $R/etc/group
  printf 'hosts: files dns\n' > $R/etc/nsswitch.conf
  mk "$BUSYBOX_IMAGE" $R busybox.tar /bin/sh
  rm -rf rootfs; echo "$base_stamp" > .base-stamp
fi
rm -f hostrt.tar   # the host-runtime image of earlier versions
# Trainer images: one per suite, from its root filesystem; repacked when the root filesystem or mkimage.sh changes.
"$HACK_DIR/rootfs.sh"
for suite in $TRAINER_SUITES; do
  s="$(cat "$ROOTFS/$suite/.et-stamp") $(sha256sum < "$HACK_DIR/mkimage.sh" | cut -c1-16)"   # and how it is packed
  [ -f "trainer-$suite.tar" ] && [ "$(cat ".trainer-$suite-stamp" 2>/dev/null)" = "$s" ] && continue
  echo "images: packing $TRAINER_IMAGE:$suite from $ROOTFS/$suite (about 30 s)"
  mk "$TRAINER_IMAGE:$suite" "$ROOTFS/$suite" "trainer-$suite.tar" && echo "$s" > ".trainer-$suite-stamp"
done
# $STOCK_TRAINER_IMAGE: the forky image without python-etcd, as stock torch images are (c10d needs nothing
# more); a second layer of whiteouts over the same first layer.
if [[ " $TRAINER_SUITES " == *" forky "* ]]; then
  s="$(cat "$ROOTFS/forky/.et-stamp") $(sha256sum < "$HACK_DIR/mkimage.sh" | cut -c1-16) no-etcd"
  if [ ! -f trainer-forky-no-etcd.tar ] || [ "$(cat .trainer-forky-no-etcd-stamp 2>/dev/null)" != "$s" ]; then
    echo "images: packing $STOCK_TRAINER_IMAGE (about 30 s)"
    REMOVE="$(cd "$ROOTFS/forky" && echo usr/lib/python3/dist-packages/etcd usr/lib/python3/dist-packages/python_etcd-*)" \
      mk "$STOCK_TRAINER_IMAGE" "$ROOTFS/forky" trainer-forky-no-etcd.tar && echo "$s" > .trainer-forky-no-etcd-stamp
  fi
fi
if [ "${1:-}" != --base ]; then
  for pair in "webhook:$WEBHOOK_IMAGE" "rdzv-sidecar:$SIDECAR_IMAGE"; do
    cmd=${pair%%:*}; img=${pair#*:}
    if [ ! -d "$REPO_ROOT/cmd/$cmd" ]; then echo "images: skipped $img: $REPO_ROOT/cmd/$cmd does not exist yet"; rm -f "$cmd.tar"; continue; fi
    R=rootfs/$cmd; rm -rf $R; mkdir -p $R/usr/local/bin $R/etc $R/tmp
    (cd "$REPO_ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$IMAGES/$R/usr/local/bin/$cmd" "./cmd/$cmd")
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > $R/etc/passwd
    printf 'root:x:0:\nnonroot:x:65532:\n' > $R/etc/group; chmod 1777 $R/tmp
    mk "$img" $R "$cmd.tar" "/usr/local/bin/$cmd"; rm -rf $R
  done
  rm -rf rootfs
fi
fi
# Import into every running node of the cluster (node1's containerd, and each node of node.sh); skip tarballs
# that node already has unchanged.
import_into() { # socket stampdir
  mkdir -p "$2"
  for t in "$IMAGES"/*.tar; do
    s=$(stat -c "%s %Y %i" "$t"); n=$(basename "$t")   # size, mtime, inode: hashing 4 GB each time costs 20 s
    [ "$(cat "$2/$n" 2>/dev/null)" = "$s" ] && continue
    ctr -a "$1" -n k8s.io images import "$t" >/dev/null && echo "$s" > "$2/$n"
    echo "images: imported $n${3:+ into $3}"
  done
}
if [ -S "$CTR_SOCK" ] && [ -f "$PIDS/containerd.pid" ] && kill -0 "$(cat "$PIDS/containerd.pid")" 2>/dev/null; then
  import_into "$CTR_SOCK" "$RUN/imported"
fi
for d in "$RUN"/nodes/*/; do
  [ -S "$d/containerd/containerd.sock" ] && [ -f "$d/pids/containerd.pid" ] && kill -0 "$(cat "$d/pids/containerd.pid")" 2>/dev/null || continue
  import_into "$d/containerd/containerd.sock" "$d/imported" "$(basename "$d")"
done
# Push (REGISTRY, PUSH, PUSH_TRAINERS, PLAIN_HTTP: the header).
if [ -n "${PUSH:-}" ] && [ "$PUSH" != 0 ]; then
  [ -n "${REGISTRY:-}" ] || { echo "images: PUSH=1 needs REGISTRY=host[:port][/path] (where to push)"; exit 2; }
  REGISTRY=${REGISTRY%/}
  version=$(awk '$1 == "appVersion:" { gsub(/"/, "", $2); print $2 }' "$REPO_ROOT/charts/elastic-training/Chart.yaml")
  (cd "$HACK_DIR/tools" && go build -o "$IMAGES/.crane" github.com/google/go-containerregistry/cmd/crane)
  insecure=(); [ -n "${PLAIN_HTTP:-}" ] && [ "$PLAIN_HTTP" != 0 ] && insecure=(--insecure)
  # Each image is pushed with a label of its own, so that its image ID (its config's digest) differs from the local
  # image of the same content: containerd 1.6's CRI keeps one reference per image ID, and a node that pulls the
  # pushed image repoints it, losing the imported name that shares the ID (ErrImageNeverPull for it, seen).
  push() {
    "$IMAGES/.crane" push "${insecure[@]}" "$1" "$2" >/dev/null &&
      "$IMAGES/.crane" mutate "${insecure[@]}" --label "io.elastic-training.pushed-to=${REGISTRY%%/*}" -t "$2" "$2" >/dev/null &&
      echo "images: pushed $2"
  }
  push webhook.tar "$REGISTRY/elastic-training/webhook:$version"
  push rdzv-sidecar.tar "$REGISTRY/elastic-training/rdzv-sidecar:$version"
  if [ -n "${PUSH_TRAINERS:-}" ] && [ "$PUSH_TRAINERS" != 0 ]; then
    suites=$TRAINER_SUITES; [ "$PUSH_TRAINERS" = 1 ] || suites=$PUSH_TRAINERS
    for suite in $suites; do push "trainer-$suite.tar" "$REGISTRY/$TRAINER_IMAGE:$suite"; done
  fi
fi

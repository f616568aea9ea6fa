#!/bin/bash
# torch-tests.sh: torch's own tests that test/integration runs against elastic-training's rendezvous backend
# (TestTorchAgentTests: test/distributed/elastic/agent/server/test/local_elastic_agent_test.py), taken from Debian's
# source package of the torch in each trainer root filesystem, checked against the suite's Sources index, into
# $ET_CACHE/torch-tests/<torch version>/ with torch's LICENSE. Nothing of it is committed. A torch whose source the
# mirror does not serve is noted, and its tests run the newest older file there is. Needs the root filesystems
# (hack/rootfs.sh) and the Debian mirror. `make integration` runs it.
set -euo pipefail
. "$(dirname "$(readlink -f "$0")")/../test/e2e/cluster/env.sh"
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEST=$ET_CACHE/torch-tests
FILES=(LICENSE test/distributed/elastic/agent/server/test/local_elastic_agent_test.py)
mkdir -p "$DEST"
exec 8>"$DEST/.lock"; flock 8
got=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for suite in $TRAINER_SUITES; do
  # shellcheck disable=SC2016 # dpkg-query's format, not the shell's
  deb=$(chroot "$ROOTFS/$suite" dpkg-query -W -f='${source:Version}' python3-torch)  # 2.6.0+dfsg-7
  version=${deb%%+*}
  if [ -f "$DEST/$version/.done" ]; then echo "torch-tests: $version present"; got=1; continue; fi
  if [ -f "$DEST/.missing-$deb" ]; then echo "torch-tests: $deb: the mirror had no source (remove $DEST/.missing-$deb to retry)"; continue; fi
  curl -fsS "$MIRROR/dists/$suite/main/source/Sources.xz" | xz -d >"$tmp/Sources"
  # The orig tarball's name and sha256 from the stanza of this version.
  sha='' orig=''
  read -r sha orig < <(awk -v v="$deb" 'BEGIN{RS=""} /(^|\n)Package: pytorch\n/ && index($0, "\nVersion: " v "\n") {
      n = split($0, l, "\n"); s = 0
      for (i = 1; i <= n; i++) { if (l[i] ~ /^Checksums-Sha256:/) s = 1; else if (l[i] !~ /^ /) s = 0
        else if (s && l[i] ~ /orig\.tar/) { split(l[i], f, " "); print f[1], f[3]; exit } } }' "$tmp/Sources") || true
  if [ -z "$orig" ]; then echo "torch-tests: $suite's Sources has no pytorch $deb"; touch "$DEST/.missing-$deb"; continue; fi
  if ! curl -fsS -o "$tmp/$orig" "$MIRROR/pool/main/p/pytorch/${orig//+/%2B}"; then
    echo "torch-tests: $orig is not on $MIRROR: torch $version's tests run the newest older torch's file"
    touch "$DEST/.missing-$deb"; continue
  fi
  echo "$sha  $tmp/$orig" | sha256sum -c --quiet
  rm -rf "$DEST/$version.new"; mkdir -p "$DEST/$version.new"
  tar -xJf "$tmp/$orig" -C "$DEST/$version.new" --strip-components=1 "${FILES[@]/#/pytorch-v$version/}"
  touch "$DEST/$version.new/.done"; rm -rf "${DEST:?}/$version"; mv "$DEST/$version.new" "$DEST/$version"
  echo "torch-tests: torch $version's tests from $orig"; got=1
done
[ $got = 1 ] || { echo "torch-tests: no torch source from $MIRROR"; exit 1; }

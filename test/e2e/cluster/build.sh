#!/bin/bash
# Builds every binary the cluster needs from the pinned versions, through the Go module proxy, into $BIN:
#   Kubernetes (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl),
#   etcd, cri-cleanup and fake-device-plugin (module tools/), CoreDNS (tools/coredns), helm (tools/helm), the
#   cluster's OCI registry (tools/registry), and
#   kube-router ($KUBE_ROUTER_VERSION, `go install` of its own module: its go.mod and go.sum pin its dependencies),
#   and, only when named (`build.sh kueue`: the queue tests build it on first use), Kueue ($KUEUE_VERSION, likewise).
# A binary is rebuilt only when its stamp changes: the hash of its module's go.mod/go.sum, its main package,
# its ldflags and the Go version (for kube-router: its module version, ldflags and the Go version). The first
# build takes minutes (kube-apiserver alone ~5 min on 2 cores, kube-router ~6 min).
# Usage: build.sh [binary...]
set -euo pipefail
. "$(dirname "$(readlink -f "$0")")/env.sh"
mkdir -p "$BIN/.stamps"
exec 9>"$BIN/.build.lock"; flock 9   # two builds of the same binary would only fight over the CPU
K8S_MINOR=${K8S_VERSION#v1.}; K8S_MINOR=${K8S_MINOR%%.*}
grep -q "k8s.io/kubernetes $K8S_VERSION\$" "$TOOLS/go.mod" || { echo "build: tools/go.mod does not pin k8s.io/kubernetes $K8S_VERSION"; exit 1; }
grep -q "helm.sh/helm/v3 $HELM_VERSION\$" "$TOOLS/helm/go.mod" || { echo "build: tools/helm/go.mod does not pin helm $HELM_VERSION"; exit 1; }
KLDF="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$K8S_MINOR -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.buildDate=2026-01-01T00:00:00Z"
# helm's defaults for `helm template` and lint (Capabilities.KubeVersion) come from ldflags, as helm's own Makefile
# sets them from its k8s.io modules; without them it assumes Kubernetes 1.20 and fails a chart's kubeVersion.
HELM_K8S=$(awk '$1 == "k8s.io/client-go" { print $2 }' "$TOOLS/helm/go.mod"); HELM_K8S_MINOR=${HELM_K8S#v0.}; HELM_K8S_MINOR=${HELM_K8S_MINOR%%.*}
HLDF="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
for p in pkg/chartutil pkg/lint/rules; do HLDF+=" -X helm.sh/helm/v3/$p.k8sVersionMajor=1 -X helm.sh/helm/v3/$p.k8sVersionMinor=$HELM_K8S_MINOR"; done
KRMOD=github.com/cloudnativelabs/kube-router/v2
KRLDF="-s -w -X $KRMOD/pkg/version.Version=$KUBE_ROUTER_VERSION -X $KRMOD/pkg/version.BuildDate=2026-01-01T00:00:00Z"
KQMOD=sigs.k8s.io/kueue
KQLDF="-s -w -X $KQMOD/pkg/version.GitVersion=$KUEUE_VERSION"
all="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl etcd cri-cleanup fake-device-plugin coredns helm registry kube-router"
spec() { # binary -> "moduledir|package|ldflags" (moduledir "-": `go install package@version`, outside any module here)
  case $1 in
    kube-router) echo "-|$KRMOD/cmd/kube-router@$KUBE_ROUTER_VERSION|$KRLDF" ;;
    kueue) echo "-|$KQMOD/cmd/kueue@$KUEUE_VERSION|$KQLDF" ;;
    coredns) echo "$TOOLS/coredns|.|-s -w" ;;
    registry) echo "$TOOLS/registry|.|-s -w" ;;
    helm) echo "$TOOLS/helm|helm.sh/helm/v3/cmd/helm|$HLDF" ;;
    etcd|cri-cleanup|fake-device-plugin) echo "$TOOLS|./cmd/$1|-s -w" ;;
    kube-*|kubelet|kubectl) echo "$TOOLS|./cmd/$1|$KLDF" ;;
    *) echo "build: unknown binary $1" >&2; return 1 ;;
  esac
}
stamp() { # moduledir package ldflags
  [ "$1" = - ] && { { go version; echo "$2"; echo "$3"; } | sha256sum | cut -c1-16; return; }
  local src=$1; [ "${2#./}" != "$2" ] && src=$1/${2#./}
  { go version; echo "$3"; cat "$1/go.mod" "$1/go.sum"; find "$src" -maxdepth 1 -type f -name '*.go' | sort | xargs cat; } | sha256sum | cut -c1-16
}
list=(${@:-$all}); n=0; todo=()
for b in "${list[@]}"; do
  IFS='|' read -r dir pkg ldf < <(spec "$b")
  s=$(stamp "$dir" "$pkg" "$ldf")
  [ -x "$BIN/$b" ] && [ "$(cat "$BIN/.stamps/$b" 2>/dev/null)" = "$s" ] || todo+=("$b|$dir|$pkg|$ldf|$s")
done
[ ${#todo[@]} = 0 ] && { echo "build: all ${#list[@]} binaries up to date in $BIN"; exit 0; }
echo "build: ${#todo[@]} binaries to build into $BIN (log: $ET_CACHE/build.log); the first build takes several minutes"
T0=$(date +%s)
for t in "${todo[@]}"; do
  IFS='|' read -r b dir pkg ldf s <<<"$t"; n=$((n+1)); t1=$(date +%s)
  echo "build: [$n/${#todo[@]}] $b ..."
  # go build -v names each package it compiles: count them as progress, every 15 s.
  # `go install package@version` builds with that module's own go.mod and go.sum, whatever the current directory
  # (pure Go: CGO_ENABLED=0, as its releases are); it writes only to GOBIN, so it goes through $BIN/.gobin.
  if [ "$dir" = - ]; then
    (cd "$BIN" && rm -rf "$BIN/.gobin" "$BIN/$b.new" && GOBIN="$BIN/.gobin" CGO_ENABLED=0 go install -v -ldflags "$ldf" "$pkg" &&
      mv -f "$BIN/.gobin/$b" "$BIN/$b.new"; rm -rf "$BIN/.gobin")
  else
    (cd "$dir" && rm -f "$BIN/$b.new" && go build -v -ldflags "$ldf" -o "$BIN/$b.new" "$pkg")
  fi 2>&1 | tee -a "$ET_CACHE/build.log" |
    { c=0; last=$SECONDS; while read -r _; do c=$((c+1))
        if [ $((SECONDS-last)) -ge 15 ]; then last=$SECONDS; echo "build:       $b: $c packages compiled so far"; fi; done; } || true
  [ -x "$BIN/$b.new" ] || { echo "build: $b FAILED, last lines of $ET_CACHE/build.log:"; tail -20 "$ET_CACHE/build.log"; exit 1; }
  mv -f "$BIN/$b.new" "$BIN/$b"; echo "$s" > "$BIN/.stamps/$b"
  echo "build: [$n/${#todo[@]}] $b done in $(( $(date +%s) - t1 ))s"
done
echo "build: done in $(( $(date +%s) - T0 ))s"

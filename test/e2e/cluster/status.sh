#!/bin/bash
# Exit 0 when this checkout's cluster ($RUN) is running (node1, the control plane and every node of EXTRA_NODES)
# and its API server answers; 1 otherwise.
. "$(dirname "$(readlink -f "$0")")/env.sh"
for n in etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kube-router coredns registry fake-device-plugin; do
  [ -f "$PIDS/$n.pid" ] && kill -0 "$(cat "$PIDS/$n.pid")" 2>/dev/null || { echo "cluster: $n not running"; exit 1; }
done
curl -sf --max-time 5 --cacert "$PKI/ca.crt" "https://127.0.0.1:$APISERVER_PORT/readyz" >/dev/null || { echo "cluster: kube-apiserver not ready"; exit 1; }
# --control-plane: node1 and the control plane only (node.sh asks before it starts a node)
if [ "${1:-}" != --control-plane ]; then
  for node in $EXTRA_NODES; do for n in holder containerd kubelet kube-proxy kube-router fake-device-plugin; do
    f=$RUN/nodes/$node/pids/$n.pid
    [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null || { echo "cluster: $node's $n not running"; exit 1; }
  done; done
fi
echo "cluster: running (state in $RUN)"
echo "export KUBECONFIG=$KUBECONFIG"

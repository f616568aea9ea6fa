#!/bin/bash
# Creates CA, apiserver serving cert, apiserver->kubelet client cert, SA keys, static tokens, kubeconfigs, and
# kube-router's client certificate (made when missing, also in a pki made before it: the API server trusts every
# certificate of the CA, so, unlike a new static token, it needs no API server restart).
set -euo pipefail
. "$(dirname "$(readlink -f "$0")")/env.sh"
mkdir -p "$PKI"; cd "$PKI"
kube_router() {
  [ -f "$RUN/kube-router.kubeconfig" ] && return
  printf 'extendedKeyUsage=clientAuth\n' > client.ext
  openssl genrsa -out kube-router.key 2048 2>/dev/null
  openssl req -new -key kube-router.key -subj "/CN=system:kube-router" -out kube-router.csr
  openssl x509 -req -in kube-router.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile client.ext -out kube-router.crt 2>/dev/null
  cat > "$RUN/kube-router.kubeconfig" <<X
apiVersion: v1
kind: Config
clusters:
- cluster: {server: "https://127.0.0.1:$APISERVER_PORT", certificate-authority: "$PKI/ca.crt"}
  name: local
users:
- name: kube-router
  user: {client-certificate: "$PKI/kube-router.crt", client-key: "$PKI/kube-router.key"}
contexts:
- context: {cluster: local, user: kube-router}
  name: local
current-context: local
X
  echo "kube-router client certificate created in $PKI"
}
[ -f ca.crt ] && { kube_router; echo "pki exists"; exit 0; }
openssl genrsa -out ca.key 2048 2>/dev/null
openssl req -x509 -new -nodes -key ca.key -subj "/CN=elastic-training-e2e-ca" -days 3650 -out ca.crt
cat > apiserver.ext <<X
subjectAltName=DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$CLUSTER_DOMAIN,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP,IP:$KUBERNETES_SVC_IP
extendedKeyUsage=serverAuth
X
openssl genrsa -out apiserver.key 2048 2>/dev/null
openssl req -new -key apiserver.key -subj "/CN=kube-apiserver" -out apiserver.csr
openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile apiserver.ext -out apiserver.crt 2>/dev/null
printf 'extendedKeyUsage=clientAuth\n' > client.ext
openssl genrsa -out apiserver-kubelet-client.key 2048 2>/dev/null
openssl req -new -key apiserver-kubelet-client.key -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" -out apiserver-kubelet-client.csr
openssl x509 -req -in apiserver-kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile client.ext -out apiserver-kubelet-client.crt 2>/dev/null
openssl genrsa -out sa.key 2048 2>/dev/null
openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
rnd() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
ADMIN=$(rnd); KUBELET=$(rnd); PROXY=$(rnd); KCM=$(rnd); SCHED=$(rnd); DNS=$(rnd)
cat > tokens.csv <<X
$ADMIN,admin,admin-uid,system:masters
$KUBELET,system:node:$NODE_NAME,node-uid,system:nodes
$PROXY,system:kube-proxy,kube-proxy-uid
$KCM,system:kube-controller-manager,kcm-uid
$SCHED,system:kube-scheduler,sched-uid
$DNS,system:coredns,coredns-uid
X
mk() { # name token server
cat > "$RUN/$1.kubeconfig" <<X
apiVersion: v1
kind: Config
clusters:
- cluster: {server: "$3", certificate-authority: "$PKI/ca.crt"}
  name: local
users:
- name: $1
  user: {token: "$2"}
contexts:
- context: {cluster: local, user: $1}
  name: local
current-context: local
X
}
S=https://127.0.0.1:$APISERVER_PORT
mk admin $ADMIN $S; mk kubelet $KUBELET $S; mk kube-proxy $PROXY $S; mk kcm $KCM $S; mk scheduler $SCHED $S; mk coredns $DNS $S
kube_router
echo "pki created in $PKI"

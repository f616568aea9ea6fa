#!/usr/bin/env bash
# make demo: an elastic PyTorch job on the local two-node cluster, scaled with `helm upgrade`.
# Builds what is missing (Kubernetes from the Go module proxy, the trainer image from Debian forky's packages:
# torch 2.14), starts the cluster, installs the webhook chart and a job that really trains, scales it
# 2 -> 3 -> 4 -> 2 and prints what happened. Needs nothing installed beforehand but Go and root.
# The cluster is left running.
set -euo pipefail
cd "$(dirname "$0")/.."
. test/e2e/cluster/env.sh        # KUBECONFIG, PATH with the cluster's kubectl and helm
export PATH=$BIN:$PATH
JOB=${DEMO_JOB:-demo} NS=${DEMO_NAMESPACE:-default} STEPS=${DEMO_STEPS:-240}

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
since() { echo $(( $(date +%s) - $1 )); }

# world N: wait until exactly N live workers last trained at world size N; print the seconds it took.
world() {
  local n=$1 t0=$(date +%s) pods ok w p
  while :; do
    pods=$(kubectl -n "$NS" get pods -l "elastic-training.io/job=$JOB,elastic-training.io/group=worker" \
      --field-selector=status.phase!=Succeeded,status.phase!=Failed \
      -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}' 2>/dev/null |
      awk 'NF == 1 { print $1 }' || true)   # pods being deleted print a second field
    ok=0
    if [ "$(grep -c . <<<"$pods")" = "$n" ]; then
      ok=1
      for p in $pods; do
        w=$(kubectl -n "$NS" logs "$p" -c trainer --tail=20 2>/dev/null | grep -o 'world_size=[0-9]*' | tail -1 || true)
        [ "$w" = "world_size=$n" ] || ok=0
      done
    fi
    if [ $ok = 1 ]; then
      echo "   every worker trains at world size $n after $(since $t0) s, on:" \
        $(for p in $pods; do echo "${p#"$JOB"-worker-}@$(kubectl -n "$NS" get pod "$p" -o jsonpath='{.spec.nodeName}')"; done)
      return
    fi
    [ $(since $t0) -gt 240 ] && { echo "demo: workers did not reach world size $n in 240 s" >&2; kubectl -n "$NS" get pods -o wide >&2; exit 1; }
    sleep 1
  done
}

say "Local cluster (the first run builds Kubernetes from source: minutes)"
test/e2e/cluster/up.sh
hack/images.sh

say "Webhook (once per cluster)"
helm upgrade --install elastic-training-webhook charts/elastic-training-webhook \
  -n elastic-training-system --create-namespace --wait --timeout 3m \
  --set "image.repository=${WEBHOOK_IMAGE%:*},image.tag=${WEBHOOK_IMAGE##*:},image.pullPolicy=Never" \
  --set "sidecar.image.repository=${SIDECAR_IMAGE%:*},sidecar.image.tag=${SIDECAR_IMAGE##*:},sidecar.image.pullPolicy=Never"
# Ready webhook pods are not yet a working webhook (kube-proxy lags): wait until admission really mutates.
probe='{"apiVersion":"v1","kind":"Pod","metadata":{"name":"probe","labels":{"elastic-training.io/job":"probe","elastic-training.io/role":"worker","elastic-training.io/group":"worker"},"annotations":{"elastic-training.io/framework":"custom","batch.kubernetes.io/job-completion-index":"1"}},"spec":{"hostname":"probe-worker-1","subdomain":"probe","containers":[{"name":"trainer","image":"'"$BUSYBOX_IMAGE"'"}]}}'
for i in $(seq 120); do
  kubectl create --dry-run=server -o jsonpath='{.metadata.annotations}' -f - <<<"$probe" 2>/dev/null | grep -q mutated && break
  [ "$i" = 120 ] && { echo "demo: the webhook does not answer" >&2; exit 1; }
  sleep 1
done

if helm -n "$NS" status "$JOB" >/dev/null 2>&1; then
  say "Removing the previous demo job"
  helm -n "$NS" uninstall "$JOB" --wait
fi

say "helm install $JOB (2 workers, min 1, max 4)"
t0=$(date +%s)
helm -n "$NS" install "$JOB" charts/elastic-training -f examples/local/pytorch-elastic.yaml \
  --set-file script=examples/scripts/elastic_train.py --set "args={--steps=$STEPS,--step-seconds=0.5}"
world 2
echo "   helm install -> first training step: $(since $t0) s"
w0=$(kubectl -n "$NS" get pods -l "elastic-training.io/job=$JOB,elastic-training.io/group=worker,batch.kubernetes.io/job-completion-index=0" -o jsonpath='{.items[0].metadata.name}')
echo "   $(kubectl -n "$NS" logs "$w0" -c trainer | grep -o 'torch=[^ ]*' | head -1) ($(kubectl -n "$NS" get pod "$w0" -o jsonpath='{.spec.containers[?(@.name=="trainer")].image}'))"

for n in 3 4 2; do
  say "helm upgrade $JOB --reuse-values --set workers.replicas=$n"
  helm -n "$NS" upgrade "$JOB" charts/elastic-training --reuse-values --set workers.replicas=$n >/dev/null
  world $n
done

say "helm test $JOB: training progresses (a complete round of every agent, all alive, that holds 30 s)"
t0=$(date +%s)
out=$(helm -n "$NS" test "$JOB" 2>&1) || { echo "$out"; kubectl -n "$NS" logs "$JOB-test-rdzv" || true; exit 1; }
echo "$out" | grep -E "^(TEST SUITE|Phase)"
echo "   helm test: $(since $t0) s"
say "The rendezvous as kubectl shows it: who serves it (the Lease's holder), its current round, and one Event per round on the Job"
holder=$(kubectl -n "$NS" get lease "$JOB-rdzv" -o jsonpath='{.spec.holderIdentity}')
echo "   served by $holder"
kubectl -n "$NS" get --raw "/api/v1/namespaces/$NS/pods/$holder:2381/proxy/rendezvous"; echo
kubectl -n "$NS" describe job "$JOB-worker" | sed -n '/^Events:/,$p' | grep -E "^Events|Reason|RendezvousRound" | tail -6

say "Pods"
kubectl -n "$NS" get pods -l "elastic-training.io/job=$JOB" -o wide
say "Live hostfile and Horovod discovery script in worker 0 (kept current by the rdzv-sidecar)"
w0=$(kubectl -n "$NS" get pods -l "elastic-training.io/job=$JOB,elastic-training.io/group=worker,batch.kubernetes.io/job-completion-index=0" -o jsonpath='{.items[0].metadata.name}')
kubectl -n "$NS" exec "$w0" -c trainer -- cat /etc/elastic-training/hostfile
kubectl -n "$NS" exec "$w0" -c trainer -- /etc/elastic-training/discover_hosts.sh

say "Waiting for training to finish (Job Complete)"
kubectl -n "$NS" wait --for=condition=complete "job/$JOB-worker" --timeout=10m

say "World size per training step, from kubectl logs $w0 -c trainer"
kubectl -n "$NS" logs "$w0" -c trainer | awk '
  / step=[0-9]/ { for (i = 1; i <= NF; i++) { if ($i ~ /^step=/) s = substr($i, 6); if ($i ~ /^world_size=/) w = substr($i, 12) }
            if (w != cur) { if (cur != "") printf "   steps %4d-%-4d world size %s\n", first, last, cur; cur = w; first = s }
            last = s }
  END { if (cur != "") printf "   steps %4d-%-4d world size %s\n", first, last, cur }'
say "The rendezvous' story, from kubectl logs $w0 -c rdzv-sidecar"
kubectl -n "$NS" logs "$w0" -c rdzv-sidecar | grep -iE 'round|member' | tail -15 || true

say "Done. The cluster is still running:"
echo "   export KUBECONFIG=$KUBECONFIG"
echo "   export PATH=$BIN:\$PATH      # kubectl and helm matching the cluster"
echo "   helm -n $NS uninstall $JOB   # remove the job"
echo "   make cluster-down            # stop the cluster and undo every host change"

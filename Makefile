# elastic-training: see README.md.
SHELL := /bin/bash
GO ?= go
# The test targets pipe `go test -json` through hack/testtimes: the tests' output as usual, then each package's and
# its slowest tests' wall time (CI is a budget: the log says where it goes). pipefail: a failed test fails the target.
TESTTIMES = set -o pipefail; $(GO) test -json
TIMES = | $(GO) run ./hack/testtimes

.PHONY: all help build generate lint-workflows test lint unit helm integration e2e rootfs torch-tests bench bench-sidecar bench-scale bench-webhook bench-e2e bench-node-loss bench-checkpoint bench-checkpoint-loss bench-progress bench-hang bench-lease demo cluster-build cluster-up cluster-down cluster-status images

## all: build (the default target).
all: build

## help: the targets and what each runs (these comments; a target's further lines are indented).
help:
	@awk '/^## [a-z-]+:/ { print substr($$0, 4); next } /^##/ { print "    " substr($$0, 4) }' Makefile

## build: go build ./... (the webhook, rdzv-sidecar and every package).
build:
	$(GO) build ./...

## generate: rewrite every generated file from its source; review what changed with `git diff` (a reviewer reads
## the same diff in the change). `make test` fails when one of them is stale. In this order:
##   charts/elastic-training/templates/_contract.tpl  the webhook's rules as the job chart's copy (internal/chartcontract;
##                                         first: the charts' golden files render it)
##   internal/mutate/testdata/*.golden.yaml  the webhook's golden files
##   charts/*/README.md                    from README.md.gotmpl and the `# --` comments of values.yaml (hack/chart-docs.sh,
##                                         helm-docs pinned in hack/tools/go.mod)
##   test/helm/testdata/*.golden.yaml      the charts' golden files
## internal/torchbackends/torchstate/testdata/torch-*.pickle are written by torch itself, in the trainer root filesystems: that needs
## root and the root filesystems, and they change only with testdata/gen.py or a new torch, so only
## `make generate GENERATE_TORCH=1` (as root; builds the root filesystems first) rewrites them too.
generate: $(if $(GENERATE_TORCH),rootfs)
	$(GO) test -count=1 ./internal/chartcontract -update
	$(GO) test -count=1 ./internal/mutate -update
	GO=$(GO) hack/chart-docs.sh
	$(GO) test -count=1 ./test/helm -update
	$(if $(GENERATE_TORCH),$(GO) test -count=1 ./internal/torchbackends/torchstate -update)

## lint-workflows: actionlint + shellcheck on .github/workflows (the release workflow cannot run here).
lint-workflows:
	GO=$(GO) hack/lint-workflows.sh

## test: every test, in this order: lint, unit, helm, integration (real torchrun, etcd, mpirun), e2e (real cluster).
test: lint unit helm integration e2e

## lint: gofmt (lists the files to format) and go vet, on every package.
lint:
	@unformatted=$$($$($(GO) env GOROOT)/bin/gofmt -l $$($(GO) list -f '{{.Dir}}' ./...)); \
	if [ -n "$$unformatted" ]; then echo "gofmt -w these files:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

## unit: the tests of every package outside test/ (cmd/..., internal/...): no root, no root filesystems, no cluster.
## internal/torchbackends/v2api's conformance test runs Debian's etcd 3.4 (/usr/bin/etcd, package etcd-server) as its reference.
unit:
	$(TESTTIMES) -count=1 -timeout 30m $$($(GO) list ./... | grep -v /test/) $(TIMES)

## helm: the charts through the Helm SDK (test/helm): rendering, golden files, schema, lint, chart READMEs, and
## actionlint on the release workflow (shellcheck). No root, no cluster.
helm:
	$(TESTTIMES) -count=1 -timeout 30m ./test/helm/... $(TIMES)

## integration: the sidecar and the c10d store with the real programs (test/integration/...): torchrun of torch 2.14
## and 2.6 chrooted into the trainer root filesystems, etcd 3.4 and etcdctl, Open MPI and MPICH. Root.
integration: rootfs torch-tests
	$(TESTTIMES) -count=1 -parallel 4 -timeout 30m ./test/integration/... $(TIMES)

## e2e: the e2e tests on a real local cluster (root). Starts the cluster if it is not running and
## stops it again afterwards; a cluster that was already running is left running. The stop waits for
## the lock of the e2e test binaries (E2E_LOCK in test/e2e/cluster/env.sh): another run may still use the cluster.
e2e:
	@set -e; started=0; $(CLUSTER)/status.sh >/dev/null || { started=1; $(CLUSTER)/up.sh; }; \
	rc=0; ( $(TESTTIMES) -p 1 -parallel 4 -count=1 -timeout 55m ./test/e2e/... $(TIMES) ) || rc=$$?; \
	if [ $$started = 1 ]; then (. $(CLUSTER)/env.sh; flock "$$E2E_LOCK" $(CLUSTER)/down.sh); fi; exit $$rc

## demo: an elastic PyTorch job on the local cluster, scaled 2 -> 3 -> 4 -> 2 with helm upgrade (root; the first
## run builds Kubernetes). Leaves the cluster running; `make cluster-down` stops it.
demo:
	hack/demo.sh

## bench: every performance measurement, each printing ratios against a baseline measured in the same run.
bench: bench-sidecar bench-scale bench-webhook bench-e2e bench-node-loss bench-checkpoint bench-progress bench-hang bench-lease

## bench-progress: what elastic_training.progress costs a training step (the host's python3 sending to a reader that
## parses every datagram as the sidecar does), against an empty Python call in the same run.
bench-progress:
	$(GO) test -count=1 -run '^$$' -bench BenchmarkProgressCall -benchtime 1x ./test/bench/progress

## bench-hang: a frozen worker (SIGSTOP) of a two-agent job of real torchrun: seconds until both train again, on the
## elastic-training backend at the default hang timeout and on torch's own c10d backend, same run (docs/hangs.md).
bench-hang: rootfs
	$(GO) test -count=1 -timeout 30m -run '^$$' -bench BenchmarkHangRecovery -benchtime 1x ./test/integration/sidecar

## bench-lease: a member lease's TTL (2, 3, 5 s): leases lost while the machine is saturated by busy loops weighted as a
## trainer (the sidecars in cgroups weighted as the webhook's requests), a frozen member -> its key gone, and the serving
## sidecar's CPU while 1,024 members renew at each TTL (root).
bench-lease:
	$(GO) test -count=1 -timeout 30m -run '^$$' -bench 'BenchmarkLeaseTTL|BenchmarkLeaseRenewals' -benchtime 1x ./test/bench/sidecar

## bench-e2e: elastic PyTorch on the local cluster (root): helm install -> first step, scale up/down -> every
## worker at the new world size, the chart's rendezvous defaults vs torch's defaults in the same run; and how long
## the kubelet holds a pod's next container after its native sidecar starts, startup probe vs postStart hook.
bench-e2e:
	$(GO) test -count=1 -timeout 60m -run '^$$' -bench 'BenchmarkScaling|BenchmarkSidecarStartGate' -benchtime 1x ./test/e2e/workloads

## bench-node-loss: a worker node of an elastic PyTorch job crashes on the two-node local cluster (root): seconds
## until the survivors train at the smaller size and until the lost pods are replaced, the chart's defaults against
## torch's own behaviour in the same run.
bench-node-loss:
	$(GO) test -count=1 -timeout 60m -run '^$$' -bench BenchmarkNodeLoss -benchtime 1x ./test/e2e/workloads

## bench-checkpoint: what an in-memory checkpoint save holds a training loop (two ranks of real torchrun, torch 2.14
## and 2.6, 64 and 512 MiB of state; BENCH_CHECKPOINT_SIZES_MIB=64,512,2048 for more) against dcp.save, dcp.async_save
## and torch.save to disk in the same run (root; the trainer root filesystems).
bench-checkpoint: rootfs
	$(GO) test -count=1 -timeout 60m -run '^$$' -bench BenchmarkCheckpointSave -benchtime 1x ./test/bench/checkpoint

## bench-checkpoint-loss: what a node's loss costs a job's work (three agents of real torchrun, torch 2.14 and 2.6, one
## node killed): seconds to training again, steps redone and the work lost, for elastic_training.checkpoint every
## step against dcp.save to disk every step and every 100, same run (root; BENCH_CHECKPOINT_SIZES_MIB, default 64).
bench-checkpoint-loss: rootfs
	$(GO) test -count=1 -timeout 60m -run '^$$' -bench BenchmarkCheckpointNodeLoss -benchtime 1x ./test/integration/sidecar

# Local two-node Kubernetes (test/e2e/cluster, README "Local cluster"). Root. Its settings, and where everything
# built goes (ET_CACHE, default ~/.cache/elastic-training; `make ET_CACHE=DIR ...` moves it), are in
# test/e2e/cluster/env.sh, which the scripts and test/e2e/framework read.
CLUSTER := test/e2e/cluster
# CACHE=DIR: the same as ET_CACHE=DIR.
ifdef CACHE
export ET_CACHE := $(CACHE)
endif

## rootfs: the trainer root filesystems (Debian forky: torch 2.14, trixie: torch 2.6, with python-etcd, Open MPI,
## MPICH, sshd) that the integration tests chroot into and the trainer images are packed from (root; mmdebstrap,
## minutes the first time, then cached under $ET_CACHE/rootfs).
rootfs:
	hack/rootfs.sh

## torch-tests: torch's own LocalElasticAgent tests, from Debian's source package of each root filesystem's torch
## (hack/torch-tests.sh; cached under $ET_CACHE/torch-tests), that `make integration` runs against our rendezvous.
torch-tests: rootfs
	hack/torch-tests.sh

## cluster-build: build the local two-node cluster's binaries (test/e2e/cluster, README "Local cluster"; root) from
## the pinned versions (minutes the first time, then cached under ET_CACHE, default ~/.cache/elastic-training;
## `make ET_CACHE=DIR ...` moves it; settings: test/e2e/cluster/env.sh).
cluster-build:
	$(CLUSTER)/build.sh

## cluster-up: start the cluster (builds first if needed) and print the KUBECONFIG line.
cluster-up:
	$(CLUSTER)/up.sh

## cluster-down: stop it and undo every host change.
cluster-down:
	$(CLUSTER)/down.sh

## cluster-status: which of the cluster's daemons run, on each node.
cluster-status:
	@$(CLUSTER)/status.sh

## images: build the local images (webhook, rdzv-sidecar, trainers) and import them into a running cluster;
## REGISTRY=host[:port][/path] PUSH=1 also pushes the webhook and sidecar images there (PUSH_TRAINERS=1 the trainer
## images too, PLAIN_HTTP=1 for a registry without TLS): docs/install.md.
images:
	hack/images.sh

## bench-sidecar: rdzv-sidecar vs etcd 3.4 (first rendezvous of 4 torchrun agents), hostfile latency; its c10d store
## vs torch's own TCPStore server: torchrun first rendezvous and scale-up 2→3, throughput and p99 latency at
## 64/256/1,024 client connections, RSS per 1,000 connections (PASS/MISS against the goals); the store's start
## until it serves with etcd's default ticks vs ours.
bench-sidecar: rootfs
	$(GO) test -count=1 -timeout 60m -run '^$$' -bench 'V2Ops|RendezvousOnly|^BenchmarkTorchrun$$|HostfileLatency|C10dTorchrun|C10dLoad|C10dRSS' -benchtime 1x ./test/bench/sidecar
	$(GO) test -count=1 -run '^$$' -bench StoreStart -benchtime 20x ./internal/embedetcd

## bench-scale: the rendezvous at the scale of real jobs (docs/scale.md): N = 64, 256, 1,024 of torch's own rendezvous
## handlers through the sidecar vs torch's TCPStore server (c10d) and etcd 3.4 (etcd-v2), the chart's settings and
## torch's; the elastic-training backend vs torch's c10d handler on the sidecar at 64 to 4,096 nodes (BenchmarkElasticTrainingBackendScale;
## BENCH_SIDECAR_BACKEND_* choose); torch's join race with Go clients at 256 to 1,024 nodes; 500 members each kept by
## its own join; 16,384 concurrent c10d clients. BENCH_SIDECAR_SCALE_* and _BACKEND_* choose.
bench-scale: rootfs
	$(GO) test -count=1 -timeout 150m -run '^$$' -bench 'RendezvousScale|BackendScale|C10dJoinRace|^BenchmarkScale$$|C10dClients' -benchtime 1x ./test/bench/sidecar

## bench-webhook: what users feel of the webhook (root): on the local cluster, seconds until the Job controller has
## created every pod of a 500-pod Indexed Job of the chart's PyTorch workers (scheduling-gated, nothing runs), with
## the webhook installed vs its namespace excluded (checked: mutated vs not, webhook calls vs none), 3 repetitions
## each alternating; medians, ratio (goal <= 1.10, PASS/MISS printed, timing never fails it) and the webhook's
## admission latency from the API server's histogram. BENCH_PODCREATION_PODS / _REPS change the size and count.
bench-webhook:
	$(GO) test -count=1 -timeout 60m -run '^$$' -bench BenchmarkPodCreation -benchtime 1x ./test/e2e/webhook/podcreation

# elastic-training: see README.md.
SHELL := /bin/bash
GO ?= go
CACHE ?= $(HOME)/.cache/elastic-training

.PHONY: all build chart-docs lint-workflows test test-unit test-e2e rootfs bench bench-sidecar bench-webhook bench-e2e demo cluster-build cluster-up cluster-down cluster-status images

all: build

build:
	$(GO) build ./...

## chart-docs: regenerate charts/*/README.md from README.md.gotmpl and the `# --` comments of values.yaml, with the
## helm-docs pinned in hack/tools/go.mod. `make test` fails (test/helm, TestChartDocs) when they are out of date.
chart-docs:
	GO=$(GO) hack/chart-docs.sh

## lint-workflows: actionlint + shellcheck on .github/workflows (the release workflow cannot run here).
lint-workflows:
	GO=$(GO) hack/lint-workflows.sh

## test: every test: unit, integration (real torchrun, etcd, mpirun) and e2e (real cluster).
test: test-unit test-e2e

test-unit: rootfs
	@unformatted=$$($$($(GO) env GOROOT)/bin/gofmt -l $$($(GO) list -f '{{.Dir}}' ./...)); \
	if [ -n "$$unformatted" ]; then echo "gofmt -w these files:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 30m $$($(GO) list ./... | grep -v /test/e2e)

# The lock the e2e test binaries hold (test/e2e/framework): stopping the cluster must wait for a running one.
E2E_LOCK := /run/lock/elastic-training-e2e.lock

## test-e2e: the e2e tests on a real local cluster (root). Starts the cluster if it is not running and
## stops it again afterwards; a cluster that was already running is left running.
test-e2e:
	@set -e; started=0; $(CLUSTER)/status.sh >/dev/null || { started=1; $(CLUSTER)/up.sh; }; \
	rc=0; $(GO) test -p 1 -count=1 -timeout 40m ./test/e2e/... || rc=$$?; \
	if [ $$started = 1 ]; then flock $(E2E_LOCK) $(CLUSTER)/down.sh; fi; exit $$rc

## demo: an elastic PyTorch job on the local cluster, scaled 2 -> 3 -> 4 -> 2 with helm upgrade (root; the first
## run builds Kubernetes). Leaves the cluster running; `make cluster-down` stops it.
demo:
	hack/demo.sh

## bench: every performance measurement, each printing ratios against a baseline measured in the same run.
bench: bench-sidecar bench-webhook bench-e2e

## bench-e2e: elastic PyTorch on the local cluster (root): helm install -> first step, scale up/down -> every
## worker at the new world size, the chart's rendezvous defaults vs torch's defaults in the same run.
bench-e2e:
	$(GO) test -count=1 -timeout 60m -run '^$$' -bench BenchmarkScaling -benchtime 1x ./test/e2e/workloads

## Local single-node Kubernetes (test/e2e/cluster, README "Local cluster"). Root; state under $(CACHE).
CLUSTER := test/e2e/cluster
# The scripts and test/e2e/framework read ET_CACHE.
export ET_CACHE := $(CACHE)

## rootfs: the trainer root filesystems (Debian forky: torch 2.14, trixie: torch 2.6, with python-etcd, Open MPI,
## MPICH, sshd) that the integration tests chroot into and the trainer images are packed from (root; mmdebstrap,
## minutes the first time, then cached under $(CACHE)/rootfs).
rootfs:
	$(CLUSTER)/rootfs.sh

## cluster-build: build the cluster's binaries from the pinned versions (minutes the first time, then cached).
cluster-build:
	$(CLUSTER)/build.sh

## cluster-up: start the cluster (builds first if needed) and print the KUBECONFIG line.
cluster-up:
	$(CLUSTER)/up.sh

## cluster-down: stop it and undo every host change.
cluster-down:
	$(CLUSTER)/down.sh

cluster-status:
	@$(CLUSTER)/status.sh

## images: build the local images (webhook, rdzv-sidecar, trainers) and import them into a running cluster.
images:
	$(CLUSTER)/images.sh

## bench-sidecar: rdzv-sidecar vs etcd 3.4 (first rendezvous of 4 torchrun agents), hostfile latency, 1,000 members;
## its c10d store vs torch's own TCPStore server: torchrun first rendezvous and scale-up 2→3, throughput and p99 latency
## at 64/256/1,024 client connections, RSS per 1,000 connections (PASS/MISS against the goals).
bench-sidecar: rootfs
	$(GO) build -o bin/rdzv-sidecar ./cmd/rdzv-sidecar
	$(GO) run ./test/bench/sidecarbench --sidecar=bin/rdzv-sidecar

## bench-webhook: what users feel of the webhook (root): on the local cluster, seconds until the Job controller has
## created every pod of a 500-pod Indexed Job of the chart's PyTorch workers (scheduling-gated, nothing runs), with
## the webhook installed vs its namespace excluded (checked: mutated vs not, webhook calls vs none), 3 repetitions
## each alternating; medians, ratio (goal <= 1.10, PASS/MISS printed, timing never fails it) and the webhook's
## admission latency from the API server's histogram. BENCH_PODCREATION_PODS / _REPS change the size and count.
bench-webhook:
	$(GO) test -count=1 -timeout 60m -run '^$$' -bench BenchmarkPodCreation -benchtime 1x ./test/e2e/webhook/podcreation

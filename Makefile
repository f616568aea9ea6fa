# elastic-training: see README.md.
SHELL := /bin/bash
GO ?= go
CACHE ?= $(HOME)/.cache/elastic-training

.PHONY: all build test test-unit test-e2e bench bench-webhook fuzz demo cluster-up cluster-down images lint

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

bench: bench-webhook

## bench-webhook: admission latency p50/p99 over HTTPS (/mutate-pods vs the no-op path, same server,
## fixed rate) and idle RSS of the webhook binary; writes _out/bench-webhook.json.
bench-webhook:
	$(GO) build -o bin/webhook ./cmd/webhook
	@mkdir -p _out
	$(GO) run ./test/bench/webhook -binary bin/webhook -out _out/bench-webhook.json

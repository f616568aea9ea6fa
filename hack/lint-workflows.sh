#!/usr/bin/env bash
# Lints .github/workflows with the actionlint that hack/tools/go.mod pins, and with shellcheck on every `run:`
# script (actionlint calls it; .ci/run installs it). The workflows cannot run here: this is their check.
# `make lint-workflows` runs it; test/helm/release_test.go too. Usage: lint-workflows.sh [workflow files]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
GO=${GO:-go}
command -v shellcheck >/dev/null || { echo "lint-workflows: shellcheck is missing (apt-get install shellcheck)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$repo/hack/tools" && "$GO" build -o "$tmp/actionlint" github.com/rhysd/actionlint/cmd/actionlint)
if [ $# -eq 0 ]; then set -- "$repo"/.github/workflows/*.yaml; fi
"$tmp/actionlint" -shellcheck "$(command -v shellcheck)" "$@"

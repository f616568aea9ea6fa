#!/usr/bin/env bash
# Generates README.md of every chart under the charts directory (default: charts/) from its README.md.gotmpl,
# Chart.yaml and the `# --` comments of its values.yaml, with the helm-docs that hack/tools/go.mod pins.
# `make generate` runs it on charts/; test/helm/chartdocs_test.go runs it on a copy and fails on any difference.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
charts=$(cd "${1:-$repo/charts}" && pwd)
GO=${GO:-go}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Built from the module cache (or the Go module proxy) into a temporary directory; later builds come from the cache.
(cd "$repo/hack/tools" && "$GO" build -o "$tmp/helm-docs" github.com/norwoodj/helm-docs/cmd/helm-docs)
# Values in values.yaml order (the files are grouped by topic). helm-docs only logs a chart it cannot read or a
# template error and still exits 0, so any warning it prints fails the run.
"$tmp/helm-docs" --chart-search-root "$charts" --sort-values-order file --log-level warning 2>"$tmp/log" ||
  { cat "$tmp/log" >&2; exit 1; }
if [ -s "$tmp/log" ]; then
  cat "$tmp/log" >&2
  echo "chart-docs: helm-docs reported problems (above); the READMEs may be incomplete" >&2
  exit 1
fi

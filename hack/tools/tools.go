//go:build tools

// Package tools pins the Go tools of the repository's own make targets (not the test cluster's: those are in
// test/e2e/cluster/tools). It is a module of its own so that their dependencies stay out of the main go.mod.
// helm-docs generates charts/*/README.md (make generate; test/helm/chartdocs_test.go checks for drift);
// actionlint checks .github/workflows (make lint-workflows; test/helm/release_test.go).
// crane pushes the images `make images REGISTRY=... PUSH=1` builds (hack/images.sh; no Docker needed).
package tools

import (
	_ "github.com/google/go-containerregistry/cmd/crane"
	_ "github.com/norwoodj/helm-docs/cmd/helm-docs"
	_ "github.com/rhysd/actionlint/cmd/actionlint"
)

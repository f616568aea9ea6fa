# Image of the rendezvous sidecar (rdzv-sidecar serve/join/wait/hosts) for real clusters (the local test
# cluster packs the same static binary with hack/images.sh instead, because this machine has
# no Docker and no registry).
#   docker build -f build/rdzv-sidecar.Dockerfile -t REGISTRY/rdzv-sidecar:VERSION .
# .github/workflows/release.yaml builds it for linux/amd64 and linux/arm64 as ghcr.io/elastic-training/rdzv-sidecar.
ARG GO_VERSION=1.26
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
ARG TARGETOS TARGETARCH
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/root/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags "-s -w" -o /out/rdzv-sidecar ./cmd/rdzv-sidecar

# distroless/static: CA certificates and a nonroot user, nothing else.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/rdzv-sidecar /usr/local/bin/rdzv-sidecar
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/rdzv-sidecar"]

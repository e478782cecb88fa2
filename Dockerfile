# rls as one static binary on an empty image: no shell, no package manager, no libc to patch.
#
#   docker build -t rls .
#
# The builder runs on the build machine's own platform and cross-compiles, which needs no
# emulation when building for another architecture (docker buildx build --platform ...).
FROM --platform=$BUILDPLATFORM golang:1.26.8-bookworm AS build
WORKDIR /src
# Modules first: editing the source then reuses the downloaded modules' layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS TARGETARCH
# CGO_ENABLED=0 makes the binary static, which the empty final image requires (a test runs this
# same command and checks the result has no dynamic loader).
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -tags vtprotobuf -ldflags="-s -w" -o /out/rls ./cmd/rls
# envoyproxy/ratelimit's image runs /bin/ratelimit, and so do the deployments written for it
# (Envoy Gateway's among them): the same binary answers there, through a symlink.
RUN mkdir -p /out/bin && ln -s /rls /out/bin/ratelimit

FROM scratch
# Roots for rediss:// (Redis over TLS); nothing else in the image reads them.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/rls /rls
COPY --from=build /out/bin /bin
# Any non-zero uid does: rls writes nothing to disk. 65532 is the uid Kubernetes manifests and
# distroless images conventionally give an unprivileged user.
USER 65532:65532
# 8081: gRPC (ShouldRateLimit, grpc.health.v1); 8080: /healthz /readyz /healthcheck /metrics,
# POST /json.
EXPOSE 8080 8081
ENTRYPOINT ["/rls"]

# One image for the operator and the sidecar: only the podlock binary, non-root, distroless.
#   docker build -t podlock .
#   docker run podlock sidecar --help
# scripts/test.sh lints this file (hadolint) and runs its `cargo build` line itself.

FROM rust:1.95-bookworm AS build
# protoc: etcd-client generates its gRPC code at build time.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends protobuf-compiler \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin podlock

# glibc, CA certificates and a nonroot user (65532), no shell.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/podlock /usr/local/bin/podlock
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/podlock"]

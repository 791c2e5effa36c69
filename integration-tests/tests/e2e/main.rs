//! The real-Envoy tests: one test binary (each test file a module), so that
//! the optimised build links once rather than once per file. Every test
//! starts its own Envoy and simulated upstreams on loopback ports it picks;
//! `make e2e-test` runs them one at a time.
//!
//! `deploy_tools` needs tools only a root install gives: its tests are
//! ignored here and run by `make test-deploy` (after `make setup-deploy`).

mod common;

mod adaptive;
mod config_and_metrics;
mod deploy;
mod deploy_tools;
mod faults;
mod grpc;
mod hedging;
mod hosts;
mod mesh;
mod streaming;
mod tail;

//! adaptive-hedge against the real Envoy binary. Three rooms:
//!
//! - [`harness`]: the Envoy process, the simulated upstream hosts and the
//!   load generators. Every server listens on 127.0.0.1 on a port picked at
//!   run time and is stopped when its handle drops.
//! - `tests/e2e/`: one test binary, a module per promise (hedging, adaptive,
//!   faults, streaming, config and metrics, tail, deploy; `deploy_tools`
//!   needs root-installed tools: ignored by `make test`, run by
//!   `make test-deploy`).
//! - [`tools`] and `src/bin/`: `bench`, `demo`, `soak`, `check-configs`, and
//!   the `sim` and `load` programs the docker-compose demo runs.

pub mod harness;
pub mod tools;

/// A small multi-thread runtime for a test's client side.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

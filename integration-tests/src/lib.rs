//! Test support for adaptive-hedge against the real Envoy binary: an upstream
//! simulator ([`sim`]), an Envoy harness ([`envoy`]) and load generators
//! ([`load`]). Every server listens on 127.0.0.1 on a port picked at run time
//! and is stopped when its handle drops.

pub mod callgrind;
pub mod config_check;
pub mod envoy;
pub mod load;
pub mod scenario;
pub mod sim;
pub mod timer;
pub mod virtual_time;

/// A small multi-thread runtime for a test's client side.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

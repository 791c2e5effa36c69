//! adaptive-hedge: an Envoy proxy-wasm filter that arms Envoy's own request
//! hedging with a delay learned per upstream cluster.
//!
//! - [`policy`]: the logic (config, sketch, window, budget, decision, shared
//!   state encoding, per-worker state). Plain Rust, no host calls.
//! - [`header_pairs`]: reads the request headers from the host's one-call
//!   serialisation (plain Rust, fuzzed).
//! - `proxy` (wasm32 only): the thin glue: root context, HTTP context, and a
//!   host adapter that turns every host status into a value, never a panic.

pub mod header_pairs;
pub mod policy;

#[cfg(target_arch = "wasm32")]
mod proxy;

/// The filter's version, logged at start-up.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

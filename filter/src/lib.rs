//! adaptive-hedge: an Envoy proxy-wasm filter that arms Envoy's own request
//! hedging with a delay learned per upstream cluster.
//!
//! Modules depend inward: `proxy` on `policy`, `header_pairs`, `headers` and
//! `telemetry`; `policy` on `headers`, `route_metadata` and `telemetry`;
//! `header_pairs` and `route_metadata` on `pairs`; `pairs`, `headers` and
//! `telemetry` on nothing.
//!
//! - [`policy`]: the logic (config, sketch, window, budget, the decision,
//!   shared-state encoding, per-worker state). Plain Rust, no host calls.
//! - [`header_pairs`]: reads the request headers from the host's one-call
//!   serialisation (plain Rust, fuzzed).
//! - [`route_metadata`]: reads a route's overrides (its metadata, as Envoy
//!   serialises it) as JSON; [`pairs`]: the host's pairs serialisation
//!   both are read from (plain Rust, fuzzed).
//! - [`headers`]: the header names; [`telemetry`]: the log and stats traits.
//! - [`proxy`]: the thin glue, generic over a `Host` trait: the `.wasm`
//!   implements it with the proxy-wasm ABI, native tests with a fake.

pub mod header_pairs;
pub mod headers;
pub mod pairs;
pub mod policy;
pub mod proxy;
pub mod route_metadata;
pub mod route_metadata_cache;
pub mod telemetry;

/// The filter's version, logged at start-up.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

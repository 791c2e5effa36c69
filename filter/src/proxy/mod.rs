//! The proxy-wasm glue: carries out what `policy` decides, nothing more.
//!
//! - `root`: the plugin (config, tick) and the context of each stream;
//! - `downstream`: a request in the HTTP connection manager's chain (the
//!   plan carried out: headers removed and set, latency sample, settlement);
//! - `upstream`: an attempt in a cluster's chain (the first-byte hold);
//! - `placement`: is each role in its own chain;
//! - `host`: the host calls, behind the `Host` trait: `abi` makes them in
//!   the `.wasm`, `fake` answers in native tests; `sdk` adapts the
//!   proxy-wasm SDK's traits (wasm32 only).

#[cfg(target_arch = "wasm32")]
mod abi;
pub mod downstream;
#[cfg(test)]
mod fake;
#[cfg(feature = "fault-injection")]
mod fault_injection;
pub mod host;
pub mod placement;
pub mod root;
#[cfg(target_arch = "wasm32")]
mod sdk;
pub mod upstream;

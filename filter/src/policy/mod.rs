//! The hedging logic, with no proxy-wasm calls: everything here runs (and is
//! tested) natively, with time passed in by the caller.
//!
//! Follow a request: `worker::Worker::on_request` -> `decision::decide` (when
//! do we hedge) -> the HTTP context sets Envoy's headers -> `on_response`
//! records the latency -> `on_complete` settles the `budget` -> on the tick,
//! `Worker::sync` merges into the `shared_state` window, which refreshes
//! `decision::hedge_delay`.
//!
//! Streaming upstreams: `hold` is the upstream role's rule (which attempt's
//! response headers wait for its first body byte).

pub mod budget;
pub mod config;
pub mod decision;
pub mod duration;
pub mod hold;
pub mod shared_state;
pub mod sketch;
pub mod window;
pub mod worker;

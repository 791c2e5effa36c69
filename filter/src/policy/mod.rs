//! The hedging logic, with no proxy-wasm calls: everything here runs (and is
//! tested) natively, with time passed in by the caller.
//!
//! Follow a request: `worker::Worker::plan` finds the cluster and calls
//! `decision::plan` (when do we hedge: the one place that decides), the proxy
//! glue sets what the plan says, `on_response` records the latency, `settle`
//! returns unsent hedges to the `budget`; on the tick, `Worker::sync` merges
//! into the `shared_state` window and refreshes each cluster's
//! `hedge_delay` (and each named route's: `routes`).
//!
//! Streaming upstreams: `hold` is the upstream role's rule (which attempt's
//! response headers wait for its first body byte).

pub mod backend_latency;
pub mod budget;
pub mod config;
pub mod decision;
pub mod duration;
pub mod hedge_delay;
pub mod hold;
pub mod hosts;
pub mod membership;
pub mod routes;
pub mod shared_state;
pub mod sketch;
pub mod timeouts;
pub mod window;
pub mod worker;

//! The HTTP context: one per request. Headers -> decision -> Envoy's hedge
//! headers; response -> latency sample; end of stream -> budget settlement.
//! Request headers cannot be read on the response path, so everything the
//! later callbacks need is copied into this struct during the request phase.

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::host;
use super::placement::Placement;
use crate::header_pairs::scan;
use crate::policy::config::LatencySignal;
use crate::policy::decision::{Decision, Hedge, Skip};
use crate::policy::hold::FIRST_BYTE_MARKER;
use crate::policy::worker::{ClusterId, Worker};

const CLUSTER_NAME: &[u8] = b"xds\0cluster_name";
const RESPONSE_CODE_DETAILS: &[u8] = b"response\0code_details";
const ATTEMPT_COUNT: &[u8] = b"upstream\0request_attempt_count";
/// `response.code_details` of a response that came from an upstream (not a
/// local reply such as no healthy upstream, connect failure or timeout).
const VIA_UPSTREAM: &[u8] = b"via_upstream";

const PER_TRY_TIMEOUT: &str = "x-envoy-upstream-rq-per-try-timeout-ms";
const HEDGE_ON_PER_TRY_TIMEOUT: &str = "x-envoy-hedge-on-per-try-timeout";
const MAX_RETRIES: &str = "x-envoy-max-retries";
const RETRY_ON: &str = "x-envoy-retry-on";
const RETRY_GRPC_ON: &str = "x-envoy-retry-grpc-on";
/// Response header with the filter's decision, when `debug_header` is on.
const DEBUG_HEADER: &str = "x-adaptive-hedge";
/// Every request header that can make Envoy send more than one attempt.
const CONTROL_HEADERS: [&str; 5] = [
    PER_TRY_TIMEOUT,
    HEDGE_ON_PER_TRY_TIMEOUT,
    MAX_RETRIES,
    RETRY_ON,
    RETRY_GRPC_ON,
];

pub struct HedgeHttp {
    worker: Option<Rc<RefCell<Worker>>>,
    placement: Rc<Placement>,
    signal: LatencySignal,
    trust_client_headers: bool,
    debug_header: bool,
    /// Kept only for the debug header.
    decision: Option<Decision>,
    cluster: Option<ClusterId>,
    started_ns: u64,
    /// Hedges paid for when armed; settled when the stream ends.
    reserved: u32,
    sampled: bool,
}

impl HedgeHttp {
    pub fn new(worker: Option<Rc<RefCell<Worker>>>, placement: Rc<Placement>) -> Self {
        let (signal, trust_client_headers, debug_header) = worker
            .as_ref()
            .and_then(|w| {
                let w = w.try_borrow().ok()?;
                Some((
                    w.config.latency_signal,
                    w.config.trust_client_headers,
                    w.config.debug_header,
                ))
            })
            .unwrap_or((LatencySignal::Headers, false, false));
        HedgeHttp {
            worker,
            placement,
            signal,
            trust_client_headers,
            debug_header,
            decision: None,
            cluster: None,
            started_ns: 0,
            reserved: 0,
            sampled: false,
        }
    }

    /// Sets the router headers. The per-try timeout (the trigger) goes last:
    /// if anything before it fails, nothing is armed and no header is left
    /// that could turn the timeout into a plain retry that cancels the first
    /// attempt.
    fn arm(&self, hedge: Hedge, retry_on: &str) -> bool {
        let (mut hedges, mut timeout) = ([0u8; 20], [0u8; 20]);
        // In first-byte mode the upstream role (a copy of this module in the
        // cluster's filter chain) holds each attempt's 2xx headers until its
        // first body byte, but only on requests marked here: the router has
        // removed the x-envoy-* headers by the time upstream filters run.
        let marked = self.signal != LatencySignal::FirstByte
            || host::set_request_header(FIRST_BYTE_MARKER, b"1").is_ok();
        // x-envoy-retry-grpc-on is left alone here: whatever a client adds
        // to it, Envoy makes at most the `max-retries` attempts set here,
        // which the budget has paid for. Unarmed requests have it removed.
        let armed = marked
            && host::set_request_header(HEDGE_ON_PER_TRY_TIMEOUT, b"true").is_ok()
            && host::set_request_header(MAX_RETRIES, decimal(u64::from(hedge.hedges), &mut hedges))
                .is_ok()
            && host::set_request_header(RETRY_ON, retry_on.as_bytes()).is_ok()
            && host::set_request_header(
                PER_TRY_TIMEOUT,
                decimal(hedge.per_try_timeout_ms, &mut timeout),
            )
            .is_ok();
        if !armed {
            strip_control_headers();
            let _ = host::remove_request_header(FIRST_BYTE_MARKER);
        }
        armed
    }

    /// Records the latency of an upstream response once.
    fn sample(&mut self) {
        if self.sampled {
            return;
        }
        self.sampled = true;
        let (Some(id), Some(worker)) = (self.cluster, &self.worker) else {
            return;
        };
        if self.started_ns == 0 {
            return;
        }
        // Local replies (no healthy host, connect failure, timeouts) are not
        // the upstream's latency.
        if host::property(RESPONSE_CODE_DETAILS)
            .ok()
            .flatten()
            .as_deref()
            != Some(VIA_UPSTREAM)
        {
            return;
        }
        let Ok(now) = host::now_ns() else { return };
        let latency_us = now.saturating_sub(self.started_ns) / 1000;
        if let Ok(mut w) = worker.try_borrow_mut() {
            w.on_response(id, latency_us);
        }
    }
}

/// `n` in decimal, without allocating (the request path runs per request).
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut start = buf.len();
    loop {
        start -= 1;
        if let Some(d) = buf.get_mut(start) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || start == 0 {
            break;
        }
    }
    buf.get(start..).unwrap_or_default()
}

fn strip_control_headers() {
    for name in CONTROL_HEADERS {
        let _ = host::remove_request_header(name);
    }
}

impl Context for HedgeHttp {}

impl HttpContext for HedgeHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if !self.placement.in_place() {
            return Action::Continue;
        }
        // The method and whether any control header is present, from one
        // host call (borrowed from the buffer, not copied). If the headers
        // cannot be read, the method is unknown (so the request is not
        // armed) and control headers are assumed present (so they are
        // stripped): the safe side of both.
        let pairs = host::request_header_pairs().ok().flatten();
        let (method, upgrade, client_set_controls, client_set_marker) = pairs
            .as_deref()
            .and_then(|b| scan(b, &CONTROL_HEADERS))
            .map_or((&b""[..], false, true, true), |h| {
                (h.method, h.upgrade, h.has_any, h.has_marker)
            });
        // Clients never switch hedging on by themselves: Envoy strips their
        // x-envoy-* headers unless it trusts them as internal; this covers
        // the trusted case. Stripping only when present saves five calls.
        // A client's first-byte marker would only make the upstream role
        // delay its headers; it goes too (an armed request gets it back).
        let strip = || {
            if client_set_controls {
                strip_control_headers();
            }
            if client_set_marker {
                let _ = host::remove_request_header(FIRST_BYTE_MARKER);
            }
        };
        let Some(worker) = self.worker.clone() else {
            strip();
            return Action::Continue;
        };
        let cluster = host::property(CLUSTER_NAME).ok().flatten();
        #[cfg(feature = "fault-injection")]
        super::fault_injection::inject(cluster.as_deref());
        if self.trust_client_headers && client_set_controls {
            // The operator trusts clients and this one chose for itself.
            if let Ok(mut w) = worker.try_borrow_mut() {
                w.on_client_controlled(cluster.as_deref());
            }
            self.decision = Some(Decision::Skip(Skip::ClientControlled));
            return Action::Continue;
        }
        let Ok(mut w) = worker.try_borrow_mut() else {
            strip();
            return Action::Continue;
        };
        let (id, decision) = w.on_request(cluster.as_deref(), method, upgrade);
        self.cluster = id;
        // A sample costs three host calls (two clocks, the response's
        // origin); past a few hundred per tick the quantile gains nothing.
        if id.is_some_and(|id| w.take_sample_slot(id)) {
            self.started_ns = host::now_ns().unwrap_or(0);
        }
        if self.debug_header {
            self.decision = Some(decision);
        }
        match (decision, id) {
            (Decision::Arm(hedge), Some(id)) => {
                let retry_on = w.cluster(id).map_or("5xx", |c| c.policy.retry_on.as_str());
                if self.arm(hedge, retry_on) {
                    self.reserved = hedge.hedges;
                } else {
                    w.on_complete(id, hedge.hedges, Some(1)); // not armed: give the tokens back
                }
            }
            _ => strip(),
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if let (true, Some(decision)) = (self.debug_header, self.decision) {
            let _ = host::set_response_header(DEBUG_HEADER, decision.describe().as_bytes());
        }
        if self.signal == LatencySignal::Headers || end_of_stream {
            self.sample();
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.signal == LatencySignal::FirstByte && (body_size > 0 || end_of_stream) {
            self.sample();
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if self.reserved == 0 {
            return;
        }
        let reserved = std::mem::take(&mut self.reserved);
        let (Some(id), Some(worker)) = (self.cluster, &self.worker) else {
            return;
        };
        let attempts = host::int_property(ATTEMPT_COUNT).and_then(|n| u64::try_from(n).ok());
        if let Ok(mut w) = worker.try_borrow_mut() {
            w.on_complete(id, reserved, attempts);
        }
    }
}

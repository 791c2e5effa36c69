//! The downstream role's request: one per HTTP request. Request headers ->
//! the worker's plan, carried out (headers removed and set); response -> a
//! latency sample; end of stream -> the hedges settled. Every decision is
//! the plan's; this file only performs host calls and keeps what the later
//! callbacks need (request headers cannot be read on the response path).

use std::cell::RefCell;
use std::rc::Rc;

use super::host::{int_property, Action, Host, StreamCallbacks};
use super::placement::Placement;
use crate::header_pairs::{scan, scan_response};
use crate::headers::{CONTROL_HEADERS, DEBUG_HEADER, FIRST_BYTE_MARKER, TIMEOUT_ALT_RESPONSE};
use crate::policy::config::LatencySignal;
use crate::policy::decision::{
    unplanned, Arming, ClusterId, Decision, Plan, Request, RouteId, Settlement, Skip, Strip,
};
use crate::policy::hosts::HostPick;
use crate::policy::worker::{HostResponse, Worker};
use crate::telemetry::Level;
use std::sync::Arc;

const CLUSTER_NAME: &[u8] = b"xds\0cluster_name";
const ROUTE_NAME: &[u8] = b"xds\0route_name";
/// The route's overrides, a map (see `route_metadata`).
const ROUTE_OVERRIDES: &[u8] = b"xds\0route_metadata\0filter_metadata\0adaptive_hedge";
const RESPONSE_CODE_DETAILS: &[u8] = b"response\0code_details";
const ATTEMPT_COUNT: &[u8] = b"upstream\0request_attempt_count";
const UPSTREAM_ADDRESS: &[u8] = b"upstream\0address";
/// `response.code_details` of a response that came from an upstream (not a
/// local reply such as no healthy upstream, connect failure or timeout).
const VIA_UPSTREAM: &[u8] = b"via_upstream";

/// Where a response came from and its status, read once per response
/// (`DownstreamRequest::origin`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Origin {
    /// From an upstream, not a local reply (no healthy upstream, connect
    /// failure, timeout, another filter's reply).
    from_upstream: bool,
    status: Option<u16>,
    /// A local reply for the route's timeout (read only when unmarked).
    timed_out: bool,
    /// A local reply given before any attempt reached a host (read only
    /// when unmarked): no healthy host, or the cluster's circuit breaker
    /// full (`UNSENT_DETAILS`).
    unsent: bool,
}

/// Which host answered a request whose cluster learns its hosts
/// (`DownstreamRequest::read_answer`).
struct Answer {
    cluster: ClusterId,
    pick: Option<HostPick>,
    /// `upstream.address`, if read.
    address: Option<Vec<u8>>,
    /// Whether the host named for the primary answered, if known.
    primary_answered: Option<bool>,
}

/// `response.code_details` of the router's reply when the route's timeout
/// fires (the second, Envoy before 1.33's).
const TIMEOUT_DETAILS: [&[u8]; 2] = [b"response_timeout", b"upstream_response_timeout"];
/// `response.code_details` of a reply Envoy gives before any attempt
/// reached a host: none healthy, the cluster in maintenance, or its
/// circuit breaker full (the router's reset reason, `{overflow}`, as the
/// details' prefix). A connection failure is left out: a retry before it
/// may have reached a host.
const UNSENT_DETAILS: [&[u8]; 3] = [
    b"no_healthy_upstream",
    b"maintenance_mode",
    b"upstream_reset_before_response_started{overflow",
];

/// The filter state the attribution goes to (`log_attribution`); Envoy
/// names it `wasm.adaptive_hedge`.
const FILTER_STATE: &str = "adaptive_hedge";

pub struct DownstreamRequest<H: Host> {
    host: H,
    worker: Option<Rc<RefCell<Worker>>>,
    placement: Rc<Placement>,
    signal: LatencySignal,
    debug_header: bool,
    /// For a request no worker can plan.
    trust_client_headers: bool,
    /// Some cluster learns per route: read the route's name.
    learns_routes: bool,
    /// Write the attribution to filter state (`log_attribution`).
    log_attribution: bool,
    /// Some cluster chooses hosts: the header it is written to (and a
    /// client's copy removed from), and the responses' hosts are read.
    host_header: Option<Arc<str>>,
    /// Kept only for the debug header.
    decision: Option<Decision>,
    /// The plan armed the request but its headers could not be written:
    /// the attribution must not say `armed`.
    arming_failed: bool,
    /// Kept only for the debug header: the host header written.
    endpoint: Option<String>,
    /// The request's cluster, if its hosts are learned.
    host_cluster: Option<ClusterId>,
    /// The hosts chosen, until the response (or the end) comes.
    pick: Option<HostPick>,
    /// The hosts chosen, in flight until the stream ends (`on_log`).
    in_flight: Option<(ClusterId, HostPick)>,
    /// The per-try timeout armed with (to time a hedge that won); armed
    /// requests ask the router for a 204 on timeouts (`mend_timeout_reply`).
    per_try_timeout_ms: Option<u64>,
    /// An armed gRPC call: a timeout's reply is mended in `grpc-status`.
    armed_grpc: bool,
    /// Host calls of this request that failed (a header not read, removed
    /// or written): counted in `host_errors_total` when it ends.
    host_failures: u64,
    /// The cluster (and route) a latency sample goes to, and when the
    /// request started: its headers, or for a request with a body its end
    /// (`on_request_end`).
    sample: Option<(ClusterId, Option<RouteId>, u64)>,
    /// A body follows the headers, not ended yet: the sample's clock is
    /// set again when it ends. Timed from the headers, a slow upload was
    /// latency, in the cluster's delay, its latches and its hosts' costs
    /// (found by a review).
    body_follows: bool,
    /// Hedges paid for when armed; settled when the stream ends.
    settlement: Option<Settlement>,
    /// `mode: shadow`: when the request started (its would-be hedges are
    /// settled by whether it outlived the delay).
    shadow_started_ns: Option<u64>,
    /// The name of a cluster no upstream has answered yet: confirmed if
    /// this request's response comes from one.
    unconfirmed_cluster: Option<Vec<u8>>,
    /// The response's origin, once read (on the response headers: the
    /// body callbacks of first-byte mode use it).
    origin: Option<Origin>,
    /// First-byte mode: the attempt count read at the response headers,
    /// and the armed request settled there whose early-timer verdict
    /// waits for the first byte's time.
    attempts_at_headers: Option<u64>,
    first_byte_verdict: Option<Settlement>,
}

impl<H: Host> DownstreamRequest<H> {
    pub fn new(host: H, worker: Option<Rc<RefCell<Worker>>>, placement: Rc<Placement>) -> Self {
        let (
            signal,
            debug_header,
            trust_client_headers,
            learns_routes,
            host_header,
            log_attribution,
        ) = worker
            .as_ref()
            .and_then(|w| {
                let c = w.try_borrow().ok()?;
                let c = c.config();
                Some((
                    c.latency_signal,
                    c.debug_header,
                    c.trust_client_headers,
                    c.learns_routes(),
                    c.chooses_hosts().then(|| Arc::clone(&c.host_header)),
                    c.log_attribution,
                ))
            })
            .unwrap_or((LatencySignal::Headers, false, false, false, None, false));
        DownstreamRequest {
            host,
            worker,
            placement,
            signal,
            debug_header,
            trust_client_headers,
            learns_routes,
            log_attribution,
            host_header,
            decision: None,
            arming_failed: false,
            endpoint: None,
            host_cluster: None,
            pick: None,
            in_flight: None,
            body_follows: false,
            per_try_timeout_ms: None,
            armed_grpc: false,
            host_failures: 0,
            sample: None,
            settlement: None,
            shadow_started_ns: None,
            unconfirmed_cluster: None,
            origin: None,
            attempts_at_headers: None,
            first_byte_verdict: None,
        }
    }

    /// Asks the worker for the plan and carries it out, all under one
    /// borrow of the worker (a failed arm refunds at once).
    fn plan_and_carry_out(&mut self, request: &Request) {
        // cloned: the borrow of the worker outlives this borrow of self
        let Some(worker) = self.worker.clone() else {
            return self.carry_out(unplanned(request, self.trust_client_headers), None, None);
        };
        let cluster = self.host.property(CLUSTER_NAME).ok().flatten();
        // a failed read is an unnamed route: the cluster's delay
        let route = match &cluster {
            Some(_) => self.host.property(ROUTE_NAME).ok().flatten(),
            None => None,
        };
        // A named route's overrides as read within the last second, else
        // read (a host call). None there is no overrides; a failed read is
        // a route not hedged (its overrides may say `disabled`).
        let cached = match (&cluster, &route, worker.try_borrow()) {
            (Some(c), Some(r), Ok(w)) => w.route_metadata(c, r).map(<[u8]>::to_vec),
            _ => None,
        };
        let mut ambiguous = false;
        let overrides = match (cached, &cluster) {
            (Some(cached), _) => cached,
            (None, Some(c)) => {
                let Ok(read) = self.host.property(ROUTE_OVERRIDES) else {
                    let plan = match worker.try_borrow_mut() {
                        Ok(mut w) => w.plan_unreadable_overrides(c, request),
                        Err(_) => unplanned(request, self.trust_client_headers),
                    };
                    return self.carry_out(plan, None, None);
                };
                let read = read.unwrap_or_default();
                if let (Some(r), Ok(mut w)) = (&route, worker.try_borrow_mut()) {
                    ambiguous = w.remember_route_metadata(c, r, &read);
                }
                read
            }
            (None, None) => Vec::new(),
        };
        let route = route.filter(|_| !ambiguous && (self.learns_routes || !overrides.is_empty()));
        #[cfg(feature = "fault-injection")]
        super::fault_injection::inject(
            &self.host,
            cluster.as_deref(),
            worker.try_borrow().ok().map(|w| w.geometry()),
        );
        // one clock read: the sample's start and the armed deadline
        let now = cluster.as_ref().and_then(|_| self.host.now_ns().ok());
        match worker.try_borrow_mut() {
            Ok(mut worker) => {
                let plan = worker.plan_route(
                    cluster.as_deref(),
                    route.as_deref(),
                    &overrides,
                    request,
                    now,
                );
                if plan.decision == Decision::Skip(Skip::Unconfirmed) {
                    self.unconfirmed_cluster = cluster;
                }
                self.carry_out(plan, now, Some(&mut worker));
            }
            Err(_) => self.carry_out(unplanned(request, self.trust_client_headers), None, None),
        };
    }

    /// `now`: the clock read before the plan, if it was.
    fn carry_out(&mut self, plan: Plan, now: Option<u64>, worker: Option<&mut Worker>) {
        if let (true, Some(cluster), Some(now)) = (plan.sample, plan.cluster, now) {
            // A sample costs the clock read before the plan, another at the
            // response and the response's origin.
            self.sample = Some((cluster, plan.route, now));
        }
        // A client's control header left in place must not ride along on
        // an armed request (arming overwrites only what it writes): then
        // the request is not armed (below).
        let mut client_header_left = self.strip(plan.strip) > 0;
        if self.host_header.is_some() && plan.learns_hosts {
            self.host_cluster = plan.cluster;
        }
        let mut worker = worker;
        if let (Some(endpoint), Some(name)) = (&plan.endpoint, &self.host_header) {
            if self
                .host
                .set_request_header(name, endpoint.as_bytes())
                .is_ok()
            {
                self.pick = plan.hosts;
                self.in_flight = plan.cluster.zip(plan.hosts);
            } else {
                // The write was to replace a client's header (the plan did
                // not strip it): it must not choose the host instead.
                self.host_failures += 1;
                if self.host.remove_request_header(name).is_err() {
                    // the client's host may still be there: it must not
                    // choose an armed request's hosts either
                    self.host_failures += 1;
                    client_header_left = true;
                }
                if let (Some(pick), Some(cluster), Some(w)) =
                    (plan.hosts, plan.cluster, worker.as_deref_mut())
                {
                    w.end_pick(cluster, pick);
                }
            }
        }
        if let Decision::Arm(arming) = &plan.decision {
            if arming.shadow {
                // nothing is set: settled from the response's time
                self.settlement = plan.settlement();
                self.shadow_started_ns = now;
            } else if !client_header_left && self.arm(arming) {
                self.settlement = plan.settlement();
                self.per_try_timeout_ms = Some(arming.per_try_timeout_ms);
                self.armed_grpc = arming.retry_grpc_on.is_some();
            } else {
                // Nothing armed may be left behind, and the tokens go back;
                // unless a header could not be removed: then Envoy may still
                // make the attempts, and the request is settled on the count
                // it made, as an armed one is.
                self.host_failures += 1;
                self.arming_failed = true;
                if self.strip(Strip::ARMING) > 0 {
                    self.settlement = plan.settlement();
                } else if let (Some(settlement), Some(worker)) = (plan.settlement(), worker) {
                    worker.settle(settlement, Some(1), None, None, None);
                }
            }
        }
        if self.attributes() {
            self.decision = Some(plan.decision);
            self.endpoint = plan.endpoint;
        }
    }

    /// Sets the arming headers in the plan's order; false at the first
    /// failure. Then the timeouts' 204 where the plan asks for it, best
    /// effort: if that write fails the request is armed all the same (its
    /// timeouts are 504s, as before).
    fn arm(&mut self, arming: &Arming) -> bool {
        let armed = arming.headers().all(|(name, value)| {
            let mut buf = [0u8; 20];
            self.host
                .set_request_header(name, value.bytes(&mut buf))
                .is_ok()
        });
        if armed
            && arming.timeouts_as_204
            && self
                .host
                .set_request_header(TIMEOUT_ALT_RESPONSE, b"true")
                .is_err()
        {
            self.host_failures += 1;
        }
        armed
    }

    /// Removes what the plan strips; a removal that fails is counted
    /// (`host_failures`). Returns how many failed.
    fn strip(&mut self, strip: Strip) -> u64 {
        let mut failed = 0;
        if strip.control {
            for name in CONTROL_HEADERS {
                failed += u64::from(self.host.remove_request_header(name).is_err());
            }
        }
        if strip.marker {
            failed += u64::from(self.host.remove_request_header(FIRST_BYTE_MARKER).is_err());
        }
        if let (true, Some(name)) = (strip.endpoint, &self.host_header) {
            failed += u64::from(self.host.remove_request_header(name).is_err());
        }
        self.host_failures += failed;
        failed
    }

    /// Settles the armed hedges, once: `upstream.request_attempt_count` says
    /// how many attempts Envoy started.
    /// `latency_us`: the response's, if it was timed, and whether the
    /// primary's host answered, if known (to tell a hedge the router sent
    /// before its delay).
    fn settle(
        &mut self,
        attempts: Option<u64>,
        latency_us: Option<u64>,
        primary_answered: Option<bool>,
    ) {
        let (Some(settlement), Some(worker)) = (self.settlement, &self.worker) else {
            return;
        };
        // kept for a later callback if the worker cannot be reached now
        let Ok(mut worker) = worker.try_borrow_mut() else {
            return;
        };
        self.settlement = None;
        // When an untimed armed request with a second attempt ended: the
        // second was a hedge only if that is past the deadline (else a
        // retry after a fast failure). One clock read, on few requests.
        let ended_ns = (latency_us.is_none()
            && settlement.deadline_ns.is_some()
            && attempts.is_some_and(|a| a >= 2))
        .then(|| self.host.now_ns().ok())
        .flatten();
        worker.settle(settlement, attempts, latency_us, ended_ns, primary_answered);
    }

    /// Runs `f` on this worker's state, if there is one and no other
    /// callback holds it (never a panic on a double borrow).
    /// Before this worker state plans its first request: a configuration
    /// pushed to a running Envoy finds what earlier ones learned in shared
    /// memory (a first start finds nothing). Not in `on_configure`: Envoy's
    /// main thread has a root too, which serves no stream and should not
    /// track clusters (nor hold their tokens, nor read the admin interface
    /// for them); and not as the stream is made: a copy of this role in a
    /// cluster's chain (`placement`) plans nothing, and took up every
    /// cluster and held its pool's tokens all the same. One shared-memory
    /// read per plugin and worker; per request, a flag.
    fn adopt_once(&mut self) {
        if self.with_worker(|w| w.has_adopted()).unwrap_or(true) {
            return;
        }
        let Ok(now_ns) = self.host.now_ns() else {
            return; // the next request tries again
        };
        let mut host = self.host.clone();
        let store = &self.host;
        let adopted = self
            .with_worker(|w| w.adopt_shared(now_ns / 1_000_000, store, &mut host))
            .unwrap_or(0);
        if adopted > 0 {
            self.host.log(
                Level::Info,
                &format!("adaptive-hedge: {adopted} clusters taken up from shared memory"),
            );
        }
    }

    fn with_worker<R>(&self, f: impl FnOnce(&mut Worker) -> R) -> Option<R> {
        let mut worker = self.worker.as_ref()?.try_borrow_mut().ok()?;
        Some(f(&mut worker))
    }

    /// `mode: shadow`: the attempts Envoy would have made, had the request
    /// been armed: its hedges if it has outlived the delay by now.
    fn shadow_attempts(&self) -> Option<u64> {
        let (started, settlement) = (self.shadow_started_ns?, self.settlement?);
        let now = self.host.now_ns().ok()?;
        let delay_ns = settlement.per_try_timeout_ms.saturating_mul(1_000_000);
        let outlived = now.saturating_sub(started) >= delay_ns;
        Some(
            1 + if outlived {
                u64::from(settlement.hedges)
            } else {
                0
            },
        )
    }

    /// The decision and hosts are told (debug header, filter state).
    fn attributes(&self) -> bool {
        self.debug_header || self.log_attribution
    }

    fn attempts(&self) -> Option<u64> {
        int_property(&self.host, ATTEMPT_COUNT).and_then(|n| u64::try_from(n).ok())
    }

    /// Reads which host answered a request of a cluster that learns its
    /// hosts, where the worker needs it (a timed or shown response); once.
    /// The pick stays in flight until the stream ends (`on_log`).
    fn read_answer(&mut self, timed: bool, attempts: Option<u64>) -> Option<Answer> {
        let cluster = self.host_cluster.take()?;
        let pick = self.pick.take();
        let worker = self.worker.clone()?;
        let mut worker = worker.try_borrow_mut().ok()?;
        self.answer_of(&mut worker, cluster, pick, timed, attempts)
    }

    /// `read_answer`'s reading: the address, where the worker needs it,
    /// and whether the named primary gave the answer.
    fn answer_of(
        &self,
        worker: &mut Worker,
        cluster: ClusterId,
        pick: Option<HostPick>,
        timed: bool,
        attempts: Option<u64>,
    ) -> Option<Answer> {
        // two host calls: only for the requests timed anyway (the sampled
        // ones: every request below ~1,000/s per worker)
        if !timed && !self.attributes() {
            return None;
        }
        // the named primary of a single attempt is trusted, but for a
        // share of checks (and where the answer is shown)
        let address = if self.attributes() || worker.check_address(cluster, pick, attempts) {
            Some(self.host.property(UPSTREAM_ADDRESS).ok().flatten()?)
        } else {
            None
        };
        // for the early-timer verdict of an armed request, on the headers
        // or (first-byte mode, settled at the headers) on the first byte
        let armed = self.settlement.or(self.first_byte_verdict);
        let primary_answered =
            armed.and(worker.primary_answered(cluster, pick, address.as_deref(), attempts));
        Some(Answer {
            cluster,
            pick,
            address,
            primary_answered,
        })
    }

    /// Tells the worker which host answered (`read_answer`), which ends
    /// the pick. Returns the host's address for the debug header.
    fn report_answer(
        &mut self,
        answer: Answer,
        latency_us: Option<u64>,
        attempts: Option<u64>,
    ) -> Option<Vec<u8>> {
        let Answer {
            cluster,
            pick,
            address,
            primary_answered,
        } = answer;
        let worker = self.worker.clone()?;
        let origin = self.origin();
        let mut worker = worker.try_borrow_mut().ok()?;
        let from_upstream = origin.from_upstream;
        // A reply no host received (the cluster's circuit breaker full, no
        // healthy host) is no host's failure: counted, the host named most
        // (the fastest) went on probation in an overload (found by a review)
        // (after one attempt: a retry that overflowed followed an attempt
        // that reached its host and failed)
        let unsent = origin.unsent && attempts.map_or(true, |a| a <= 1);
        let failed = !unsent && (!from_upstream || origin.status.is_some_and(|c| c >= 500));
        worker.hear_host_response(
            cluster,
            pick,
            HostResponse {
                address: address.as_deref(),
                latency_us,
                failed,
                from_upstream,
                attempts,
                per_try_timeout_ms: self.per_try_timeout_ms,
            },
        );
        // Another host than the named primary answered (the hedge won, or
        // a retry): the primary's attempt was cancelled, so it is in flight
        // no more (kept until the stream's end, a cancelled host looked
        // busy for the whole stream while the winner looked idle); a
        // winning hedge's host is, until the stream ends.
        if primary_answered == Some(false) {
            if let Some((cluster, pick)) = self.in_flight.take() {
                self.in_flight = worker
                    .answered_by_other(cluster, pick, address.as_deref())
                    .map(|winner| (cluster, winner));
            }
        }
        address
    }

    /// The decision, the hosts named, the one that answered and (for the
    /// access log) the attempts: the debug header's and filter state's text.
    fn attribution(&self, answered: Option<&[u8]>, attempts: Option<u64>) -> Option<String> {
        let mut text = match self.decision.as_ref()? {
            // the plan's delay, for the operator who reads why it failed
            Decision::Arm(a) if self.arming_failed => format!(
                "not armed; reason=host_call_failed; delay_ms={}",
                a.per_try_timeout_ms
            ),
            decision => decision.describe(),
        };
        if let Some(endpoint) = &self.endpoint {
            text.push_str("; hosts=");
            text.push_str(endpoint);
        }
        if let Some(host) = answered.and_then(|h| std::str::from_utf8(h).ok()) {
            text.push_str("; answered=");
            text.push_str(host);
        }
        if let Some(attempts) = attempts.filter(|_| self.log_attribution) {
            text.push_str(&format!("; attempts={attempts}"));
        }
        Some(text)
    }

    /// First-byte mode: the first body byte (or the end) came; once.
    fn on_first_byte(&mut self) {
        let timed = self.sample.is_some();
        let latency_us = self.record_sample();
        let attempts = self.attempts_at_headers;
        let answer = self.read_answer(timed, attempts);
        let primary_answered = answer.as_ref().and_then(|a| a.primary_answered);
        if self.shadow_started_ns.is_some() {
            // would-be hedges of a stream: did its first byte outlive the
            // delay (its headers came at once)
            let would_be = self.shadow_attempts();
            self.settle(would_be, latency_us, None);
        }
        if let (Some(settlement), Some(latency_us)) = (self.first_byte_verdict.take(), latency_us) {
            self.with_worker(|worker| {
                worker.judge_first_byte(settlement, attempts, latency_us, primary_answered)
            });
        }
        let answered = answer.and_then(|a| self.report_answer(a, latency_us, attempts));
        // the access log's attribution learns the host that answered now
        // (the debug header left with the response headers)
        if let (Some(host), true) = (answered, self.log_attribution) {
            if let Some(text) = self.attribution(Some(&host), attempts) {
                let set = self.host.set_filter_state(FILTER_STATE, text.as_bytes());
                self.host_failures += u64::from(set.is_err());
            }
        }
    }

    /// Where the response came from, read once: the response headers in
    /// one call (the status, and the router's mark on a relayed response);
    /// `response.code_details` only when the mark is missing (a local
    /// reply, or an operator who suppresses Envoy's headers).
    fn origin(&mut self) -> Origin {
        if let Some(origin) = self.origin {
            return origin;
        }
        let headers = self
            .host
            .response_header_pairs()
            .ok()
            .flatten()
            .as_deref()
            .and_then(scan_response)
            .unwrap_or_default();
        let details = match headers.relayed {
            true => None,
            false => match self.host.property(RESPONSE_CODE_DETAILS) {
                Ok(details) => details,
                // counted; read as no detail (not a timeout, not upstream's)
                Err(_) => {
                    self.host_failures += 1;
                    None
                }
            },
        };
        let details = details.as_deref();
        let origin = Origin {
            from_upstream: headers.relayed || details == Some(VIA_UPSTREAM),
            status: headers.status,
            timed_out: details.is_some_and(|d| TIMEOUT_DETAILS.contains(&d)),
            unsent: details.is_some_and(|d| UNSENT_DETAILS.iter().any(|u| d.starts_with(u))),
        };
        self.origin = Some(origin);
        origin
    }

    /// An armed request asked the router for a 204 on timeouts, so that a
    /// hedge's per-try timeout reaches outlier detection as no failure; the
    /// route timeout's reply (headers only: no body with a 204) goes back
    /// to what the client would have had without the filter: a 504, or
    /// UNAVAILABLE for a gRPC call (whose reply Envoy maps from the code).
    /// Judged from the reply: a call the filter took for gRPC may not be
    /// one to Envoy (which then answers it as plain HTTP).
    fn mend_timeout_reply(&mut self) {
        let origin = self.origin();
        if !origin.timed_out {
            return;
        }
        match origin.status {
            Some(204) => {
                let mended = self.host.set_response_header(":status", b"504");
                self.host_failures += u64::from(mended.is_err());
            }
            Some(200) if self.armed_grpc => {
                let status = self.host.set_response_header("grpc-status", b"14");
                let message = self
                    .host
                    .set_response_header("grpc-message", b"upstream request timeout");
                self.host_failures += u64::from(status.is_err()) + u64::from(message.is_err());
            }
            _ => {}
        }
    }

    /// Records the latency of an upstream response, once; returns it. A
    /// sampled reply no host received gives the budget its earnings back
    /// instead (the sample and the reply's origin meet here).
    fn record_sample(&mut self) -> Option<u64> {
        let (cluster, route, started_ns) = self.sample.take()?;
        // Local replies (no healthy host, connect failure, timeouts) are not
        // the upstream's latency. One that no host received gives back
        // what the requests it was sampled from earned.
        let origin = self.origin();
        if !origin.from_upstream {
            if origin.unsent {
                self.with_worker(|worker| worker.on_unsent(cluster));
            }
            return None;
        }
        let now = self.host.now_ns().ok()?;
        let latency_us = now.saturating_sub(started_ns) / 1000;
        self.with_worker(|worker| worker.on_response(cluster, route, latency_us))?;
        Some(latency_us)
    }
}

impl<H: Host> StreamCallbacks for DownstreamRequest<H> {
    fn on_request_headers(&mut self, end_of_stream: bool) -> Action {
        if !self.placement.in_place(&mut self.host) {
            return Action::Continue;
        }
        self.adopt_once();
        let pairs = match self.host.request_header_pairs() {
            Ok(pairs) => pairs,
            Err(_) => {
                // planned as unreadable: not armed, every control header removed
                self.host_failures += 1;
                None
            }
        };
        let request = pairs
            .as_deref()
            .and_then(|buf| {
                scan(
                    buf,
                    self.host_header.as_deref().unwrap_or_default().as_bytes(),
                )
            })
            .unwrap_or(Request::UNREADABLE);
        let request = Request {
            body_follows: !end_of_stream,
            ..request
        };
        self.body_follows = !end_of_stream;
        self.plan_and_carry_out(&request);
        Action::Continue
    }

    fn on_request_end(&mut self) {
        if !std::mem::replace(&mut self.body_follows, false) {
            return;
        }
        // One clock read, for a sampled request or a shadow with a body
        // only: Envoy starts the per-try timer at the body's end, so a
        // shadow's would-be hedge is timed from there too (timed from the
        // headers, a slow upload counted as a hedge; found by a review).
        if self.sample.is_none() && self.shadow_started_ns.is_none() {
            return;
        }
        let now = self.host.now_ns().ok();
        self.host_failures += u64::from(now.is_none());
        if let Some((cluster, route, _)) = self.sample {
            self.sample = now.map(|now| (cluster, route, now));
        }
        if self.shadow_started_ns.is_some() {
            self.shadow_started_ns = now;
        }
    }

    fn on_response_headers(&mut self, end_of_stream: bool) -> Action {
        if end_of_stream && self.per_try_timeout_ms.is_some() {
            self.mend_timeout_reply();
        }
        let timed = self.sample.is_some();
        if let Some(name) = self.unconfirmed_cluster.take() {
            if self.origin().from_upstream {
                self.with_worker(|worker| worker.confirm_cluster(&name));
            }
        }
        let on_headers = self.signal == LatencySignal::Headers || end_of_stream;
        // First-byte mode reads the origin now, for the first body byte:
        // response headers are read in their own callback.
        if !on_headers && (timed || (self.host_cluster.is_some() && self.attributes())) {
            self.origin();
        }
        let latency_us = if on_headers {
            self.record_sample()
        } else {
            None
        };
        // Read once, for the budget and the hosts.
        let reports_host = self.host_cluster.is_some() && (timed || self.attributes());
        let attempts = (self.settlement.is_some() || reports_host)
            .then(|| self.attempts())
            .flatten();
        // The router has committed to an attempt: no more hedges will start,
        // and what was not sent goes back to the budget now, not when a long
        // (or streamed) response ends. In first-byte mode the host, the
        // early-timer verdict and a shadow's would-be hedges are judged on
        // the first byte.
        let host = if on_headers {
            let settled_attempts = match self.shadow_started_ns {
                Some(_) => self.shadow_attempts(),
                None => attempts,
            };
            let answer = self.read_answer(timed, attempts);
            let primary_answered = answer.as_ref().and_then(|a| a.primary_answered);
            self.settle(settled_attempts, latency_us, primary_answered);
            answer.and_then(|a| self.report_answer(a, latency_us, attempts))
        } else {
            self.attempts_at_headers = attempts;
            if self.shadow_started_ns.is_none() {
                self.first_byte_verdict = self.settlement.filter(|_| timed);
                self.settle(attempts, None, None);
            }
            None
        };
        if let Some(text) = self.attribution(host.as_deref(), attempts) {
            if self.debug_header {
                let set = self.host.set_response_header(DEBUG_HEADER, text.as_bytes());
                self.host_failures += u64::from(set.is_err());
            }
            if self.log_attribution {
                let set = self.host.set_filter_state(FILTER_STATE, text.as_bytes());
                self.host_failures += u64::from(set.is_err());
            }
        }
        Action::Continue
    }

    fn on_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.signal == LatencySignal::FirstByte && (body_size > 0 || end_of_stream) {
            self.on_first_byte();
        }
        Action::Continue
    }

    /// Trailers with no body before them (a gRPC error after its headers)
    /// end the wait for a first byte too: the upstream role releases the
    /// race on them.
    fn on_response_trailers(&mut self) -> Action {
        if self.signal == LatencySignal::FirstByte {
            self.on_first_byte();
        }
        Action::Continue
    }

    /// A stream that ends without response headers (a client that went
    /// away) is settled here.
    fn on_log(&mut self) {
        let attempts = match self.shadow_started_ns {
            Some(_) => self.shadow_attempts(),
            None => self.settlement.and_then(|_| self.attempts()),
        };
        self.settle(attempts, None, None);
        let pick = self.in_flight.take();
        let failures = std::mem::take(&mut self.host_failures);
        if pick.is_none() && failures == 0 {
            return;
        }
        self.with_worker(|worker| {
            if let Some((cluster, pick)) = pick {
                worker.end_pick(cluster, pick);
            }
            if failures > 0 {
                worker.count_host_errors(failures);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::{
        ENDPOINT_HEADER, MAX_RETRIES, PER_TRY_TIMEOUT, RETRIABLE_HEADER_NAMES,
        RETRIABLE_STATUS_CODES, RETRY_GRPC_ON, UPSTREAM_SERVICE_TIME,
    };
    use crate::policy::worker::ADDRESS_CHECK_EVERY;
    use crate::proxy::fake::{plugin, FakeHost};
    use crate::proxy::root::{Plugin, Stream};

    fn request(plugin: &Plugin<FakeHost>) -> DownstreamRequest<FakeHost> {
        match plugin.stream() {
            Stream::Downstream(r) => r,
            Stream::Upstream(_) => panic!("a downstream plugin made an upstream context"),
        }
    }

    /// One request through every callback: `headers` in, a response from
    /// the upstream after `latency_ms`, `attempts` started by the router.
    fn exchange(
        host: &FakeHost,
        plugin: &Plugin<FakeHost>,
        headers: &[(&str, &str)],
        latency_ms: u64,
        attempts: i64,
    ) -> DownstreamRequest<FakeHost> {
        exchange_on(host, plugin, None, headers, latency_ms, attempts)
    }

    /// As `exchange`, routed by the route named `route`.
    fn exchange_on(
        host: &FakeHost,
        plugin: &Plugin<FakeHost>,
        route: Option<&str>,
        headers: &[(&str, &str)],
        latency_ms: u64,
        attempts: i64,
    ) -> DownstreamRequest<FakeHost> {
        host.request(Some("backend"), headers);
        if let Some(route) = route {
            host.set_property(ROUTE_NAME, route.as_bytes());
        }
        let mut r = request(plugin);
        assert_eq!(r.on_request_headers(true), Action::Continue);
        host.advance_ms(latency_ms);
        host.set_property(RESPONSE_CODE_DETAILS, VIA_UPSTREAM);
        host.set_property(ATTEMPT_COUNT, &attempts.to_le_bytes());
        assert_eq!(r.on_response_headers(false), Action::Continue);
        assert_eq!(r.on_response_body(10, true), Action::Continue);
        r.on_log();
        r
    }

    const GET: &[(&str, &str)] = &[(":method", "GET"), (":path", "/")];

    /// A first request to `backend` that an upstream answers: the cluster
    /// is tracked from the next request on (not timed itself).
    fn confirm_backend(host: &FakeHost, plugin: &Plugin<FakeHost>) {
        exchange(host, plugin, GET, 1, 1);
    }

    /// A cluster name no upstream answers (a client's made-up
    /// `cluster_header` value) is never tracked: no state, no registry
    /// slot, no shared value; one that an upstream answers is.
    #[test]
    fn a_cluster_is_tracked_only_once_an_upstream_answered() {
        let (host, mut plugin) = plugin("{}");
        for i in 0..50 {
            let name = format!("made-up-{i}");
            host.request(Some(&name), GET);
            let mut r = request(&plugin);
            r.on_request_headers(true);
            host.set_property(RESPONSE_CODE_DETAILS, b"cluster_not_found");
            r.on_response_headers(true);
            r.on_log();
        }
        plugin.on_tick();
        assert_eq!(host.calls_to("get_shared_data"), 0, "nothing registered");
        assert_eq!(
            host.stat("adaptive_hedge.unconfirmed_requests_total"),
            Some(50)
        );
        confirm_backend(&host, &plugin);
        exchange(&host, &plugin, GET, 1, 1);
        plugin.on_tick();
        assert!(host.calls_to("get_shared_data") > 0, "registered");
        assert_eq!(stat(&host, "requests_total"), 1);
    }

    /// A plugin whose `backend` cluster has learned a ~5 ms delay and saved
    /// up budget.
    fn warmed(json: &str) -> (FakeHost, Plugin<FakeHost>) {
        let (host, mut plugin) = plugin(json);
        for _ in 0..150 {
            exchange(&host, &plugin, GET, 5, 1);
        }
        plugin.on_tick(); // registers the cluster
        plugin.on_tick(); // merges the samples: armed from here
        (host, plugin)
    }

    fn stat(host: &FakeHost, name: &str) -> u64 {
        host.stat(&format!("adaptive_hedge.{name}.backend"))
            .unwrap_or_else(|| panic!("{name} was never defined"))
    }

    /// A configuration pushed to a running Envoy (ECDS, a listener
    /// update) makes a new plugin in the same VM beside the old one: the
    /// new one knows the cluster's delay from its first request, and
    /// hedges with the tokens the old one hands over once its last
    /// request ended.
    #[test]
    fn a_pushed_configuration_hedges_from_its_first_request() {
        let (host, mut old) = warmed("{}");
        // long enough for the worker to fill its reserve and the pool
        for _ in 0..10 {
            for _ in 0..50 {
                exchange(&host, &old, GET, 5, 1);
            }
            host.advance_ms(200);
            old.on_tick();
        }
        let json = br#"{"debug_header": true}"#;
        host.state_mut().configuration = Some(json.to_vec());
        let mut new = Plugin::new(host.clone());
        assert!(new.on_configure(json.len()));
        // not before a first stream (Envoy's main thread has a root that
        // never serves one)
        assert!(!host.logged("taken up"));
        // learned already: neither unconfirmed nor warming up (the old
        // plugin's tokens are its own until it retires)
        exchange(&host, &new, GET, 5, 1);
        assert!(host.logged("1 clusters taken up from shared memory"));
        let said = host.response_header_text(DEBUG_HEADER).unwrap_or_default();
        assert!(
            said.starts_with("skipped; reason=budget_exhausted"),
            "{said}"
        );
        old.on_done();
        assert!(host.logged("configuration retired; 1 clusters' budgets handed over"));
        // the new one's next tick draws them: its reserve goes on
        host.advance_ms(200);
        new.on_tick();
        for _ in 0..20 {
            exchange(&host, &new, GET, 1, 1);
            let said = host.response_header_text(DEBUG_HEADER).unwrap_or_default();
            assert!(said.starts_with("armed;"), "{said}");
        }
        // a first start finds nothing to take up
        let (fresh, _) = plugin("{}");
        assert!(!fresh.logged("taken up"));
    }

    /// A copy of the downstream role pasted into a cluster's chain passes
    /// requests through, and takes up nothing: before, it took up every
    /// shared cluster as its first stream was made, synced them on every
    /// tick and held their pools' tokens from the workers that hedge.
    #[test]
    fn a_copy_in_the_wrong_chain_takes_up_no_cluster() {
        let (host, _old) = warmed("{}");
        let json = b"{}";
        host.state_mut().configuration = Some(json.to_vec());
        let mut misplaced = Plugin::new(host.clone());
        assert!(misplaced.on_configure(json.len()));
        host.request(Some("backend"), GET);
        host.set_property(UPSTREAM_ADDRESS, b"127.0.0.1:8081");
        let mut r = request(&misplaced);
        r.on_request_headers(true);
        assert!(host.logged("Requests pass through untouched"));
        assert!(!host.logged("taken up"));
        // and a copy in its place takes them up at its first request
        let mut placed = Plugin::new(host.clone());
        assert!(placed.on_configure(json.len()));
        exchange(&host, &placed, GET, 5, 1);
        assert!(host.logged("1 clusters taken up from shared memory"));
    }

    /// A request Envoy answered itself before any host received it (no
    /// healthy host, the circuit breaker full) gives back what it earned;
    /// one that may have reached a host (a connection failure, perhaps
    /// after a retry, or a timeout) keeps its earnings. Measured by how
    /// many requests with a second attempt the budget pays for after 200
    /// such replies (20 tokens are about 22: each earns 0.1 of the 1 it
    /// costs).
    #[test]
    fn requests_no_host_received_give_their_earnings_back() {
        let armed_after = |details: &[u8]| {
            let (host, plugin) = warmed(r#"{"debug_header": true}"#);
            for _ in 0..200 {
                host.request(Some("backend"), GET);
                let mut r = request(&plugin);
                r.on_request_headers(true);
                host.respond(&[(":status", "503")]);
                host.set_property(RESPONSE_CODE_DETAILS, details);
                host.set_property(ATTEMPT_COUNT, &1i64.to_le_bytes());
                r.on_response_headers(true);
                r.on_log();
            }
            // then requests whose second attempt Envoy made (a whole token
            // each), until the budget refuses one
            (0..500)
                .take_while(|_| {
                    exchange(&host, &plugin, GET, 2, 2);
                    host.response_header_text(DEBUG_HEADER)
                        .is_some_and(|d| d.starts_with("armed"))
                })
                .count()
        };
        let kept = armed_after(b"upstream_reset_before_response_started{connection_failure}");
        assert_eq!(kept, armed_after(b"upstream_response_timeout"));
        for unsent in [
            &b"no_healthy_upstream"[..],
            b"upstream_reset_before_response_started{overflow}",
        ] {
            let armed = armed_after(unsent);
            assert!(
                armed + 15 < kept,
                "{}: {armed} armed after, {kept} after replies that keep their earnings",
                String::from_utf8_lossy(unsent)
            );
        }
    }

    #[test]
    fn an_armed_request_gets_the_router_headers_and_the_debug_header() {
        let (host, plugin) = warmed(r#"{"debug_header": true}"#);
        host.request(Some("backend"), GET);
        let mut r = request(&plugin);
        r.on_request_headers(true);
        let set: Vec<String> = host
            .state()
            .calls
            .iter()
            .filter(|c| c.starts_with("set_request_header"))
            .cloned()
            .collect();
        assert_eq!(
            set,
            [
                "set_request_header x-envoy-retriable-status-codes",
                "set_request_header x-envoy-hedge-on-per-try-timeout",
                "set_request_header x-envoy-max-retries",
                "set_request_header x-envoy-retry-on",
                "set_request_header x-envoy-upstream-rq-per-try-timeout-ms",
                "set_request_header x-envoy-upstream-rq-timeout-alt-response",
            ]
        );
        assert_eq!(host.request_header_text(MAX_RETRIES).as_deref(), Some("1"));
        assert_eq!(
            host.request_header_text(PER_TRY_TIMEOUT).as_deref(),
            Some("5"),
            "a 5 ms cluster's delay (within the sketch's 1%), rounded up to ms"
        );
        assert_eq!(host.request_header_text(FIRST_BYTE_MARKER), None);
        host.set_property(RESPONSE_CODE_DETAILS, VIA_UPSTREAM);
        r.on_response_headers(false);
        assert_eq!(
            host.response_header_text(DEBUG_HEADER).as_deref(),
            Some("armed; delay_ms=5; hedges=1")
        );
    }

    #[test]
    fn hedges_not_sent_are_refunded_and_sent_ones_paid() {
        let (host, mut plugin) = warmed("{}");
        exchange(&host, &plugin, GET, 2, 1); // ended before its hedge
        exchange(&host, &plugin, GET, 9, 2); // hedged
        host.request(Some("backend"), GET);
        let mut r = request(&plugin);
        r.on_request_headers(true);
        r.on_log(); // no attempt count: paid as sent
        plugin.on_tick();
        assert_eq!(stat(&host, "hedges_armed_total"), 3);
        assert_eq!(stat(&host, "hedges_refunded_total"), 1);
        assert_eq!(stat(&host, "hedges_sent_total"), 2);
        // the warm-up's first request came before any upstream answered:
        // not the cluster's
        assert_eq!(stat(&host, "requests_total"), 152);
    }

    /// `mode: shadow`: decided, nothing set (no arming header, no host),
    /// and the requests that outlived the delay counted as would-be hedges.
    #[test]
    fn a_shadow_sets_nothing_and_counts_what_it_would_have_sent() {
        let (host, mut plugin) = warmed(r#"{"mode": "shadow", "debug_header": true}"#);
        let fast = exchange(&host, &plugin, GET, 2, 1);
        assert!(
            host.state()
                .request_headers
                .iter()
                .all(|(n, _)| !n.starts_with("x-envoy-") && n != ENDPOINT_HEADER),
            "{:?}",
            host.state().request_headers
        );
        assert!(fast.decision.is_some());
        let debug = host.response_header_text(DEBUG_HEADER).unwrap_or_default();
        assert!(debug.starts_with("shadow; delay_ms="), "{debug}");
        exchange(&host, &plugin, GET, 60, 1); // outlived its delay
        plugin.on_tick();
        assert_eq!(stat(&host, "shadow_armed_total"), 2);
        assert_eq!(stat(&host, "shadow_hedges_total"), 1);
        assert_eq!(stat(&host, "hedges_armed_total"), 0);
        assert_eq!(stat(&host, "hedges_sent_total"), 0);
        assert!(stat(&host, "shadow_p99_microseconds") > 0);
    }

    /// `route_retries`: the route's retries are not lowered by arming.
    #[test]
    fn armed_requests_keep_the_routes_retries() {
        let (host, plugin) = warmed(r#"{"route_retries": 2}"#);
        host.request(Some("backend"), GET);
        let mut r = request(&plugin);
        r.on_request_headers(true);
        assert_eq!(host.request_header_text(MAX_RETRIES).as_deref(), Some("2"));
    }

    #[test]
    fn hedges_are_settled_at_the_response_headers() {
        let (host, mut plugin) = warmed("{}");
        host.request(Some("backend"), GET);
        let mut r = request(&plugin);
        r.on_request_headers(true);
        host.set_property(RESPONSE_CODE_DETAILS, VIA_UPSTREAM);
        host.set_property(ATTEMPT_COUNT, &1i64.to_le_bytes());
        r.on_response_headers(false);
        assert_eq!(
            host.calls_to("property"),
            6,
            "cluster, route overrides, route, origin, attempts, the host that answered"
        );
        plugin.on_tick();
        assert_eq!(stat(&host, "hedges_refunded_total"), 1);
        // the stream ends later: nothing is settled twice
        r.on_log();
        plugin.on_tick();
        assert_eq!(stat(&host, "hedges_refunded_total"), 1);
        assert_eq!(stat(&host, "hedges_armed_total"), 1);
    }

    #[test]
    fn a_failed_header_write_disarms_and_refunds_at_once() {
        let (host, mut plugin) = warmed(r#"{"latency_signal": "first_byte"}"#);
        host.fail(&format!("set_request_header {MAX_RETRIES}"));
        host.request(Some("backend"), GET);
        let mut r = request(&plugin);
        r.on_request_headers(true);
        // the marker and the hedge header went in before the failure: gone again
        let s = host.state();
        assert!(
            s.request_headers.iter().all(|(n, _)| !n.starts_with("x-")),
            "{:?}",
            s.request_headers
        );
        assert_eq!(
            s.calls
                .iter()
                .filter(|c| c.starts_with("remove_request_header"))
                .count(),
            CONTROL_HEADERS.len() + 1
        );
        drop(s);
        assert!(r.settlement.is_none(), "settled already");
        r.on_log();
        plugin.on_tick();
        assert_eq!(stat(&host, "hedges_armed_total"), 1);
        assert_eq!(stat(&host, "hedges_refunded_total"), 1);
        assert_eq!(stat(&host, "hedges_sent_total"), 0);
    }

    /// The debug header must not tell an operator chasing a failure that
    /// a request was armed when its headers could not be written.
    #[test]
    fn a_request_whose_arming_failed_is_not_said_to_be_armed() {
        let (host, plugin) = warmed(r#"{"debug_header": true}"#);
        host.fail(&format!("set_request_header {MAX_RETRIES}"));
        host.request(Some("backend"), GET);
        let mut r = request(&plugin);
        r.on_request_headers(true);
        assert_eq!(host.request_header_text(PER_TRY_TIMEOUT), None);
        host.set_property(RESPONSE_CODE_DETAILS, VIA_UPSTREAM);
        r.on_response_headers(false);
        let said = host.response_header_text(DEBUG_HEADER).unwrap_or_default();
        assert_eq!(said, "not armed; reason=host_call_failed; delay_ms=5");
    }

    /// A client's control header that could not be removed: the request
    /// is not armed (the header would ride along on the router's retries),
    /// and it is settled on the attempts Envoy made.
    #[test]
    fn a_client_header_left_in_place_disarms() {
        let (host, mut plugin) = warmed("{}");
        host.fail(&format!("remove_request_header {RETRIABLE_HEADER_NAMES}"));
        host.request(
            Some("backend"),
            &[(":method", "GET"), (RETRIABLE_HEADER_NAMES, "x-a")],
        );
        let mut r = request(&plugin);
        r.on_request_headers(true);
        assert_eq!(host.request_header_text(MAX_RETRIES), None);
        assert_eq!(host.request_header_text(PER_TRY_TIMEOUT), None);
        assert!(r.settlement.is_some(), "settled on the attempts made");
        host.respond(&[(":status", "200")]);
        host.set_property(ATTEMPT_COUNT, &1i64.to_le_bytes());
        r.on_response_headers(true);
        r.on_log();
        plugin.on_tick();
        assert_eq!(stat(&host, "hedges_armed_total"), 1);
        assert_eq!(stat(&host, "hedges_refunded_total"), 1);
        assert!(host.stat("adaptive_hedge.host_errors_total").unwrap_or(0) >= 2);
    }

    #[test]
    fn a_client_never_switches_hedging_on() {
        let (host, plugin) = warmed("{}");
        let hostile = [
            (":method", "POST"),
            (MAX_RETRIES, "5"),
            (PER_TRY_TIMEOUT, "1"),
            (RETRY_GRPC_ON, "cancelled"),
            (FIRST_BYTE_MARKER, "1"),
            (RETRIABLE_STATUS_CODES, "200"),
            (RETRIABLE_HEADER_NAMES, "content-type"),
        ];
        host.request(Some("backend"), &hostile);
        request(&plugin).on_request_headers(true);
        let left: Vec<String> = host
            .state()
            .request_headers
            .iter()
            .map(|(n, _)| n.clone())
            .collect();
        assert_eq!(left, [":method"]);
        // armed: the client's values are overwritten; its marker removed
        let mut get = hostile;
        get[0] = (":method", "GET");
        host.request(Some("backend"), &get);
        request(&plugin).on_request_headers(true);
        assert_eq!(host.request_header_text(MAX_RETRIES).as_deref(), Some("1"));
        assert_ne!(
            host.request_header_text(PER_TRY_TIMEOUT).as_deref(),
            Some("1")
        );
        assert_eq!(host.request_header_text(FIRST_BYTE_MARKER), None);
        // nor what arming does not write: a plain request's gRPC retry
        // codes and the retriable headers; the retriable codes are the
        // filter's own
        for name in [RETRY_GRPC_ON, RETRIABLE_HEADER_NAMES] {
            assert_eq!(host.request_header_text(name), None, "{name}");
        }
        assert_eq!(
            host.request_header_text(RETRIABLE_STATUS_CODES).as_deref(),
            Some("429")
        );
    }

    #[test]
    fn a_named_route_learns_its_own_delay_and_arms_with_it() {
        let (host, mut plugin) = plugin(r#"{"min_samples": 50}"#);
        for _ in 0..100 {
            exchange_on(&host, &plugin, Some("lookup"), GET, 2, 1);
            exchange_on(&host, &plugin, Some("search"), GET, 40, 1);
        }
        plugin.on_tick(); // registers the cluster
        plugin.on_tick(); // merges the samples: armed from here
                          // the per-try timeout in ms (the sketch's 1% may round 2 ms up to 3)
        let armed_with = |route: Option<&str>| {
            exchange_on(&host, &plugin, route, GET, 1, 1);
            host.request_header_text(PER_TRY_TIMEOUT)
                .and_then(|ms| ms.parse::<u64>().ok())
                .unwrap_or(0)
        };
        assert!((2..=3).contains(&armed_with(Some("lookup"))));
        assert!((40..=41).contains(&armed_with(Some("search"))));
        // unnamed, or a route not seen before the tick: the cluster's (the
        // mix's p92 is the slow route's)
        assert!((40..=41).contains(&armed_with(None)));
        assert!((40..=41).contains(&armed_with(Some("new"))));
        plugin.on_tick();
        let gauge = |route: &str| {
            host.stat(&format!(
                "adaptive_hedge.route_hedge_delay_microseconds.backend.route.{route}"
            ))
        };
        assert!(gauge("lookup").is_some_and(|us| (1_950..2_050).contains(&us)));
        assert!(gauge("search").is_some_and(|us| (39_500..40_500).contains(&us)));
        assert_eq!(gauge("new"), Some(0), "too few samples: the cluster's");
    }

    /// Route metadata `filter_metadata.adaptive_hedge`: a route hedged as a
    /// cluster of its own with its overrides; a route that turns hedging
    /// off; a refused override named in the log, its route not hedged.
    #[test]
    fn a_route_s_metadata_overrides_the_cluster_s_policy() {
        use crate::route_metadata::encode;
        let (host, mut plugin) = warmed(r#"{"debug_header": true, "min_samples": 20}"#);
        fn on_route(
            host: &FakeHost,
            plugin: &Plugin<FakeHost>,
            route: &str,
            overrides: serde_json::Value,
            latency_ms: u64,
        ) -> (Option<String>, String) {
            host.request(Some("backend"), GET);
            host.set_property(ROUTE_NAME, route.as_bytes());
            host.set_property(ROUTE_OVERRIDES, &encode(&overrides));
            let mut r = request(plugin);
            r.on_request_headers(true);
            let armed = host.request_header_text(MAX_RETRIES);
            host.advance_ms(latency_ms);
            host.set_property(RESPONSE_CODE_DETAILS, VIA_UPSTREAM);
            host.set_property(ATTEMPT_COUNT, &1i64.to_le_bytes());
            r.on_response_headers(false);
            r.on_log();
            (
                armed,
                host.response_header_text(DEBUG_HEADER).unwrap_or_default(),
            )
        }
        let two = serde_json::json!({"max_hedges": 2, "budget_percent": 50});
        for _ in 0..40 {
            let (armed, debug) = on_route(&host, &plugin, "export", two.clone(), 30);
            assert_eq!(armed, None, "{debug}");
        }
        plugin.on_tick(); // registers backend.route.export
        plugin.on_tick(); // its window: armed from here, at its own delay
        let (armed, debug) = on_route(&host, &plugin, "export", two.clone(), 30);
        assert_eq!(armed.as_deref(), Some("2"), "{debug}");
        assert!(debug.starts_with("armed; delay_ms=3"), "{debug}");
        // the cluster's requests keep the cluster's policy and delay
        exchange(&host, &plugin, GET, 5, 1);
        assert_eq!(host.request_header_text(MAX_RETRIES).as_deref(), Some("1"));
        let off = serde_json::json!({"disabled": true});
        let (armed, debug) = on_route(&host, &plugin, "admin", off, 5);
        assert_eq!((armed, debug.as_str()), (None, "skipped; reason=disabled"));
        let bad = serde_json::json!({"max_hedges": 9});
        let (armed, debug) = on_route(&host, &plugin, "bulk", bad, 5);
        assert_eq!(
            (armed, debug.as_str()),
            (None, "skipped; reason=route_metadata")
        );
        plugin.on_tick();
        assert!(host.logged(
            "route \"bulk\" of cluster \"backend\": filter_metadata.adaptive_hedge.max_hedges = 9: must be between 1 and 5"
        ));
        assert_eq!(
            host.stat("adaptive_hedge.route_overrides_refused_total"),
            Some(1)
        );
        assert!(host
            .stat("adaptive_hedge.hedges_armed_total.backend.route.export")
            .is_some());
    }

    /// A route's overrides changed by xDS and changed back: each time the
    /// route is hedged with the overrides it has now (the first ones'
    /// entry once led to the policy of the second).
    #[test]
    fn a_route_s_overrides_rolled_back_take_effect_again() {
        use crate::route_metadata::encode;
        let (host, mut plugin) = warmed(r#"{"debug_header": true, "min_samples": 20}"#);
        let mut on_route = |overrides: &serde_json::Value| {
            for _ in 0..crate::route_metadata_cache::fresh_ticks(200_000) {
                plugin.on_tick(); // the overrides are read again
            }
            let mut debug = String::new();
            for i in 0..30 {
                host.request(Some("backend"), GET);
                host.set_property(ROUTE_NAME, b"export");
                host.set_property(ROUTE_OVERRIDES, &encode(overrides));
                let mut r = request(&plugin);
                r.on_request_headers(true);
                host.advance_ms(1 + i % 3); // all before the delay
                host.set_property(RESPONSE_CODE_DETAILS, VIA_UPSTREAM);
                host.set_property(ATTEMPT_COUNT, &1i64.to_le_bytes());
                r.on_response_headers(false);
                r.on_log();
                debug = host.response_header_text(DEBUG_HEADER).unwrap_or_default();
                plugin.on_tick();
            }
            debug
        };
        let two = serde_json::json!({"max_hedges": 2});
        let off = serde_json::json!({"disabled": true});
        let first = on_route(&two);
        assert!(first.starts_with("armed"), "{first}");
        assert_eq!(on_route(&off), "skipped; reason=disabled");
        let back = on_route(&two);
        assert!(back.starts_with("armed"), "rolled back: {back}");
        assert_eq!(host.request_header_text(MAX_RETRIES).as_deref(), Some("2"));
        assert_eq!(on_route(&off), "skipped; reason=disabled");
    }

    /// Two routes named `default` to one cluster (two virtual hosts), one
    /// with no overrides, one turned off: once the name's overrides have
    /// gone back and forth, each request is hedged by its own route's (read
    /// each time), not by the other's cached under the shared name.
    #[test]
    fn one_route_name_on_two_routes_keeps_each_route_s_overrides() {
        use crate::route_metadata::encode;
        let (host, mut plugin) = warmed(r#"{"debug_header": true}"#);
        let off = encode(&serde_json::json!({"disabled": true}));
        let send = |plugin: &Plugin<FakeHost>, overrides: Option<&[u8]>| {
            host.request(Some("backend"), GET);
            host.set_property(ROUTE_NAME, b"default");
            if let Some(o) = overrides {
                host.set_property(ROUTE_OVERRIDES, o);
            }
            let mut r = request(plugin);
            r.on_request_headers(true);
            host.set_property(RESPONSE_CODE_DETAILS, VIA_UPSTREAM);
            host.set_property(ATTEMPT_COUNT, &1i64.to_le_bytes());
            r.on_response_headers(false);
            r.on_log();
            host.response_header_text(DEBUG_HEADER).unwrap_or_default()
        };
        let expire = |plugin: &mut Plugin<FakeHost>| {
            for _ in 0..crate::route_metadata_cache::fresh_ticks(200_000) {
                plugin.on_tick();
            }
        };
        // the public route's read, then the internal one's, and back and
        // forth again: the name's overrides went back twice running
        assert!(send(&plugin, None).starts_with("armed"));
        expire(&mut plugin);
        assert_eq!(send(&plugin, Some(&off)), "skipped; reason=disabled");
        expire(&mut plugin);
        assert!(send(&plugin, None).starts_with("armed"));
        expire(&mut plugin);
        assert_eq!(send(&plugin, Some(&off)), "skipped; reason=disabled");
        // within the same second, each its own
        for _ in 0..3 {
            assert_eq!(send(&plugin, Some(&off)), "skipped; reason=disabled");
            assert!(send(&plugin, None).starts_with("armed"));
        }
        plugin.on_tick();
        let warned = host
            .state()
            .log
            .iter()
            .filter(|(_, l)| l.contains("routes of this name carry different overrides"))
            .count();
        assert_eq!(warned, 1);
    }

    /// `n` GETs whose body takes half a second to upload, each answered
    /// 3 ms after its end by one attempt.
    fn uploads_answered_3_ms_after(host: &FakeHost, plugin: &Plugin<FakeHost>, n: usize) {
        for _ in 0..n {
            host.request(Some("backend"), GET);
            let mut r = request(plugin);
            r.on_request_headers(false);
            host.advance_ms(500);
            r.on_request_end();
            host.advance_ms(3);
            host.respond(RELAYED);
            host.set_property(ATTEMPT_COUNT, &1i64.to_le_bytes());
            r.on_response_headers(true);
            r.on_log();
        }
    }

    /// A shadow's request whose body takes half a second to upload,
    /// answered 3 ms after it ends, would not have been hedged: Envoy's
    /// per-try timer starts at the body's end.
    #[test]
    fn a_shadow_times_a_request_with_a_body_from_its_end() {
        let (host, mut plugin) = warmed(r#"{"mode": "shadow"}"#);
        uploads_answered_3_ms_after(&host, &plugin, 5);
        plugin.on_tick();
        assert_eq!(stat(&host, "shadow_armed_total"), 5);
        assert_eq!(stat(&host, "shadow_hedges_total"), 0);
    }

    /// Requests whose body takes half a second to upload, answered 3 ms
    /// after it ends: the delay learned is of the 3 ms, not the upload.
    #[test]
    fn a_request_with_a_body_is_timed_from_its_end() {
        let (host, mut plugin) = plugin(r#"{"min_samples": 10, "debug_header": true}"#);
        uploads_answered_3_ms_after(&host, &plugin, 30);
        plugin.on_tick();
        plugin.on_tick();
        host.request(Some("backend"), GET);
        request(&plugin).on_request_headers(true);
        let delay: u64 = host
            .request_header_text(PER_TRY_TIMEOUT)
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_default();
        assert!((1..50).contains(&delay), "armed at {delay} ms");
    }

    /// Requests whose body is still coming (an upload) are armed, but a
    /// per-try timer Envoy has not started yet is no timeout fired: two of
    /// them past their delay, counted from the headers, pace nothing.
    #[test]
    fn requests_still_sending_their_body_pace_nothing() {
        let (host, plugin) = warmed(r#"{"debug_header": true}"#);
        let start = |host: &FakeHost, end_of_stream: bool| {
            host.request(Some("backend"), GET);
            let mut r = request(&plugin);
            r.on_request_headers(end_of_stream);
            r
        };
        let decision = |r: &DownstreamRequest<FakeHost>| {
            r.decision
                .as_ref()
                .map(Decision::describe)
                .unwrap_or_default()
        };
        let uploads = [start(&host, false), start(&host, false)];
        assert!(uploads.iter().all(|r| decision(r).starts_with("armed")));
        host.advance_ms(20); // past the ~5 ms delay, counted from the headers
        let next = start(&host, true);
        assert!(decision(&next).starts_with("armed"), "{}", decision(&next));
    }

    /// Outlier detection with the local-origin split counts each fired
    /// per-try timeout as a failure: a worker arms no more while two of its
    /// armed requests are past their delay, and arms again once one ends.
    #[test]
    fn arming_waits_while_two_armed_requests_are_past_their_delay() {
        let (host, mut plugin) = warmed(r#"{"debug_header": true}"#);
        let start = |host: &FakeHost, plugin: &Plugin<FakeHost>| {
            host.request(Some("backend"), GET);
            let mut r = request(plugin);
            r.on_request_headers(true);
            r
        };
        let mut first = start(&host, &plugin);
        let mut second = start(&host, &plugin);
        let decision = |r: &DownstreamRequest<FakeHost>| {
            r.decision
                .as_ref()
                .map(Decision::describe)
                .unwrap_or_default()
        };
        host.advance_ms(3); // before the ~5 ms delay: both in their race window
        let third = start(&host, &plugin);
        assert!(
            decision(&third).starts_with("armed"),
            "{}",
            decision(&third)
        );
        host.advance_ms(20); // all three past their delay, none answered
        let paced = start(&host, &plugin);
        assert_eq!(decision(&paced), "skipped; reason=paced");
        host.set_property(RESPONSE_CODE_DETAILS, VIA_UPSTREAM);
        host.set_property(ATTEMPT_COUNT, &2i64.to_le_bytes());
        first.on_response_headers(false);
        first.on_log();
        let paced = start(&host, &plugin);
        assert_eq!(decision(&paced), "skipped; reason=paced", "two still past");
        second.on_response_headers(false);
        second.on_log();
        let armed = start(&host, &plugin);
        assert!(
            decision(&armed).starts_with("armed"),
            "{}",
            decision(&armed)
        );
        drop(third);
        plugin.on_tick();
        assert_eq!(stat(&host, "paced_total"), 2);
    }

    #[test]
    fn a_named_route_s_overrides_are_read_once_a_second() {
        let (host, mut plugin) = warmed("{}");
        let on_route = |host: &FakeHost| {
            host.request(Some("backend"), GET);
            host.set_property(ROUTE_NAME, b"r");
        };
        on_route(&host);
        request(&plugin).on_request_headers(true);
        // the cluster, the route's name, its overrides (it has none)
        assert_eq!(host.calls_to("property"), 3, "{:?}", host.state().calls);
        on_route(&host);
        request(&plugin).on_request_headers(true);
        // the overrides are known
        assert_eq!(host.calls_to("property"), 2, "{:?}", host.state().calls);
        for _ in 0..crate::route_metadata_cache::fresh_ticks(200_000) {
            plugin.on_tick();
        }
        on_route(&host);
        request(&plugin).on_request_headers(true);
        assert_eq!(host.calls_to("property"), 3, "read again");
        // an unnamed route's are read each time
        host.request(Some("backend"), GET);
        request(&plugin).on_request_headers(true);
        host.request(Some("backend"), GET);
        request(&plugin).on_request_headers(true);
        assert_eq!(host.calls_to("property"), 3, "{:?}", host.state().calls);
    }

    /// Envoy answers an error, not "none", for a route's overrides: the
    /// request is not armed (the overrides may say `disabled`), the failure
    /// is not remembered, and the next read that works arms again.
    #[test]
    fn unreadable_route_overrides_are_not_taken_for_none() {
        let (host, mut plugin) = warmed("{}");
        host.fail("property xds.route_metadata.filter_metadata.adaptive_hedge");
        host.request(Some("backend"), GET);
        host.set_property(ROUTE_NAME, b"r");
        request(&plugin).on_request_headers(true);
        assert_eq!(host.request_header_text(PER_TRY_TIMEOUT), None);
        plugin.on_tick();
        assert!(host.logged("cannot be read"), "{:?}", host.state().log);
        host.state_mut().failing.clear();
        host.request(Some("backend"), GET);
        host.set_property(ROUTE_NAME, b"r");
        request(&plugin).on_request_headers(true);
        assert!(host.request_header_text(PER_TRY_TIMEOUT).is_some());
    }

    #[test]
    fn nothing_to_remove_costs_no_host_call() {
        let (host, plugin) = warmed("{}");
        host.request(Some("backend"), &[(":method", "POST")]);
        request(&plugin).on_request_headers(true);
        assert_eq!(host.calls_to("remove_request_header"), 0);
        assert_eq!(host.calls_to("set_request_header"), 0);
        // the headers, the cluster, the route's overrides and its name, the
        // clock (a deadline, were it armed)
        assert_eq!(host.state().calls.len(), 5, "{:?}", host.state().calls);
        // a GET's turn to be a sample costs a clock read
        host.request(Some("backend"), GET);
        request(&plugin).on_request_headers(true);
        assert_eq!(host.calls_to("now_ns"), 1);
    }

    /// A trusted client keeps its retry and hedge headers, not the
    /// first-byte marker: the filter's own, which would have the upstream
    /// role hold an unarmed request.
    #[test]
    fn a_trusted_client_keeps_its_headers_but_not_the_marker() {
        let (host, plugin) = warmed(r#"{"trust_client_headers": true}"#);
        host.request(
            Some("backend"),
            &[
                (":method", "GET"),
                (MAX_RETRIES, "5"),
                (FIRST_BYTE_MARKER, "1"),
            ],
        );
        request(&plugin).on_request_headers(true);
        assert_eq!(host.request_header_text(MAX_RETRIES).as_deref(), Some("5"));
        assert_eq!(host.request_header_text(FIRST_BYTE_MARKER), None);
        assert_eq!(host.calls_to("set_request_header"), 0);
    }

    #[test]
    fn unreadable_headers_mean_not_armed_and_everything_removed() {
        let (host, plugin) = warmed("{}");
        host.fail("request_header_pairs");
        host.request(Some("backend"), GET);
        request(&plugin).on_request_headers(true);
        assert_eq!(host.calls_to("set_request_header"), 0);
        assert_eq!(
            host.calls_to("remove_request_header"),
            CONTROL_HEADERS.len() + 2,
            "the control headers, the marker and the host header"
        );
    }

    #[test]
    fn an_unreadable_cluster_is_no_cluster() {
        let (host, plugin) = warmed(r#"{"debug_header": true}"#);
        host.fail("property xds.cluster_name");
        host.request(Some("backend"), &[(":method", "GET"), (MAX_RETRIES, "3")]);
        let mut r = request(&plugin);
        r.on_request_headers(true);
        assert_eq!(host.request_header_text(MAX_RETRIES), None);
        r.on_response_headers(true);
        assert_eq!(
            host.response_header_text(DEBUG_HEADER).as_deref(),
            Some("skipped; reason=no_cluster")
        );
    }

    #[test]
    fn only_upstream_responses_are_latency_samples() {
        let (host, mut plugin) = plugin(r#"{"min_samples": 1}"#);
        confirm_backend(&host, &plugin);
        for origin in [
            &b"via_upstream"[..],
            b"upstream_reset_before_response_started",
        ] {
            host.request(Some("backend"), GET);
            let mut r = request(&plugin);
            r.on_request_headers(true);
            host.advance_ms(50);
            host.set_property(RESPONSE_CODE_DETAILS, origin);
            r.on_response_headers(false);
            r.on_response_headers(false); // once only
        }
        // a clock that fails: no sample either
        host.request(Some("backend"), GET);
        let mut r = request(&plugin);
        r.on_request_headers(true);
        host.fail("now_ns");
        r.on_response_headers(false);
        host.state_mut().failing.clear();
        plugin.on_tick();
        plugin.on_tick();
        assert_eq!(stat(&host, "window_samples"), 1);
        let delay = stat(&host, "hedge_delay_microseconds") as f64;
        assert!((delay / 50_000.0 - 1.0).abs() < 0.01, "{delay}");
    }

    #[test]
    fn first_byte_mode_times_the_first_body_chunk_and_marks_armed_requests() {
        let (host, mut plugin) = plugin(r#"{"min_samples": 1, "latency_signal": "first_byte"}"#);
        confirm_backend(&host, &plugin);
        host.request(Some("backend"), GET);
        let mut r = request(&plugin);
        r.on_request_headers(true);
        host.set_property(RESPONSE_CODE_DETAILS, VIA_UPSTREAM);
        host.advance_ms(1);
        r.on_response_headers(false); // headers at once: not the sample
        host.advance_ms(200);
        r.on_response_body(0, false); // an empty chunk: not a first byte
        host.advance_ms(100);
        r.on_response_body(5, false);
        plugin.on_tick();
        plugin.on_tick();
        let delay = stat(&host, "hedge_delay_microseconds") as f64;
        assert!((delay / 301_000.0 - 1.0).abs() < 0.01, "{delay}");
        for _ in 0..20 {
            exchange(&host, &plugin, GET, 300, 1);
        }
        plugin.on_tick();
        host.request(Some("backend"), GET);
        request(&plugin).on_request_headers(true);
        assert_eq!(
            host.request_header_text(FIRST_BYTE_MARKER).as_deref(),
            Some("1")
        );
    }

    /// A plugin in first-byte mode whose `backend` has learned a ~20 ms
    /// delay to the first byte (`extra` configuration fields first).
    fn first_byte_warmed(extra: &str) -> (FakeHost, Plugin<FakeHost>) {
        let (host, mut plugin) = plugin(&format!(
            r#"{{{extra}"min_samples": 10, "budget_percent": 50, "latency_signal": "first_byte", "host_choice": false}}"#
        ));
        confirm_backend(&host, &plugin);
        for _ in 0..60 {
            host.request(Some("backend"), GET);
            let mut r = request(&plugin);
            r.on_request_headers(true);
            host.set_property(RESPONSE_CODE_DETAILS, VIA_UPSTREAM);
            host.set_property(ATTEMPT_COUNT, &1i64.to_le_bytes());
            r.on_response_headers(false);
            host.advance_ms(20);
            r.on_response_body(5, false);
            r.on_log();
        }
        plugin.on_tick();
        plugin.on_tick();
        (host, plugin)
    }

    /// One streamed request: headers after `headers_ms`, the first byte
    /// (or trailers with no body) `first_byte_ms` later, `attempts`.
    fn stream(
        host: &FakeHost,
        plugin: &Plugin<FakeHost>,
        headers_ms: u64,
        first_byte_ms: u64,
        attempts: i64,
        trailers_only: bool,
    ) {
        host.request(Some("backend"), GET);
        let mut r = request(plugin);
        r.on_request_headers(true);
        host.advance_ms(headers_ms);
        host.set_property(RESPONSE_CODE_DETAILS, VIA_UPSTREAM);
        host.set_property(ATTEMPT_COUNT, &attempts.to_le_bytes());
        r.on_response_headers(false);
        host.advance_ms(first_byte_ms);
        match trailers_only {
            true => r.on_response_trailers(),
            false => r.on_response_body(5, false),
        };
        r.on_log();
    }

    /// First-byte mode: a hedge sent although the first byte came before
    /// the per-try timeout was sent early (the verdict waits for the first
    /// byte; before, first-byte mode was never judged); a first byte past
    /// it, not.
    #[test]
    fn first_byte_mode_judges_early_hedges_on_the_first_byte() {
        let (host, mut plugin) = first_byte_warmed("");
        for _ in 0..10 {
            stream(&host, &plugin, 0, 19, 2, false); // early (within 5 ms)
            stream(&host, &plugin, 0, 40, 2, false); // after the delay
        }
        plugin.on_tick();
        assert_eq!(stat(&host, "early_hedges_total"), 10);
        assert_eq!(stat(&host, "hedges_sent_total"), 20);
    }

    /// First-byte mode with host choice: as on the headers, a hedge's
    /// first byte before the per-try timeout is early only if the
    /// primary's host sent it. Before, the verdict never knew which host
    /// answered (the request was settled at the headers), so a fast 503
    /// retried on the hedge's host within 5 ms of the timeout counted as
    /// early (found by a review).
    #[test]
    fn first_byte_mode_knows_which_host_sent_an_early_first_byte() {
        let (host, mut plugin) =
            plugin(r#"{"min_samples": 10, "budget_percent": 50, "latency_signal": "first_byte"}"#);
        confirm_backend(&host, &plugin);
        let streamed = |r: &mut DownstreamRequest<FakeHost>, attempts: i64, address: &str| {
            host.set_property(RESPONSE_CODE_DETAILS, VIA_UPSTREAM);
            host.set_property(ATTEMPT_COUNT, &attempts.to_le_bytes());
            host.set_property(UPSTREAM_ADDRESS, address.as_bytes());
            r.on_response_headers(false);
            host.advance_ms(if attempts == 1 { 20 } else { 18 });
            r.on_response_body(5, false);
            r.on_log();
        };
        for i in 0..60 {
            host.request(Some("backend"), GET);
            let mut r = request(&plugin);
            r.on_request_headers(true);
            let address = match host.request_header_text(ENDPOINT_HEADER) {
                Some(named) => named.split(',').next().unwrap_or_default().to_string(),
                None => format!("10.0.0.{}:80", i % 3),
            };
            streamed(&mut r, 1, &address);
        }
        plugin.on_tick();
        plugin.on_tick();
        // two attempts, the first byte 18 ms in (before the ~20 ms per-try
        // timeout, within 5 ms of it)
        let early = answered_early_by_either(&host, &plugin, |r, address| streamed(r, 2, address));
        plugin.on_tick();
        assert!(early[0] >= 10 && early[1] >= 10, "{early:?}");
        assert_eq!(stat(&host, "early_hedges_total"), early[1]);
    }

    /// Shadow mode with first-byte timing: streams send headers at once,
    /// so the would-be hedges are judged on the first byte (before, on the
    /// headers: a shadow predicted no hedges for streams).
    #[test]
    fn a_shadow_of_streams_counts_would_be_hedges_on_the_first_byte() {
        let (host, mut plugin) = first_byte_warmed(r#""mode": "shadow", "#);
        for _ in 0..5 {
            stream(&host, &plugin, 0, 60, 1, false);
            stream(&host, &plugin, 0, 5, 1, false);
        }
        plugin.on_tick();
        assert_eq!(stat(&host, "shadow_armed_total"), 10);
        assert_eq!(stat(&host, "shadow_hedges_total"), 5);
    }

    /// Trailers with no body before them end the wait for the first byte:
    /// a latency sample (before, none: only body chunks were looked at).
    #[test]
    fn trailers_without_a_body_are_a_first_byte() {
        let (host, mut plugin) = first_byte_warmed("");
        let before = stat(&host, "window_samples");
        for _ in 0..5 {
            stream(&host, &plugin, 0, 20, 1, true);
        }
        plugin.on_tick();
        assert_eq!(stat(&host, "window_samples"), before + 5);
    }

    #[test]
    fn a_busy_worker_leaves_the_request_alone_but_strips_the_client() {
        for (config, kept) in [
            ("{}", None),
            (r#"{"trust_client_headers": true}"#, Some("5")),
        ] {
            let (host, plugin) = warmed(config);
            let mut r = request(&plugin);
            let worker = r.worker.clone().unwrap();
            let _busy = worker.borrow_mut();
            host.request(Some("backend"), &[(":method", "GET"), (MAX_RETRIES, "5")]);
            r.on_request_headers(true);
            assert_eq!(host.request_header_text(MAX_RETRIES).as_deref(), kept);
            assert_eq!(host.calls_to("set_request_header"), 0);
        }
        let (host, plugin) = warmed(r#"{"debug_header": true}"#);
        let mut r = request(&plugin);
        let worker = r.worker.clone().unwrap();
        let busy = worker.borrow_mut();
        host.request(Some("backend"), GET);
        r.on_request_headers(true);
        drop(busy);
        r.on_response_headers(true);
        assert_eq!(
            host.response_header_text(DEBUG_HEADER).as_deref(),
            Some("skipped; reason=no_worker")
        );
    }

    /// A request of `backend` the filter armed naming a primary and a
    /// hedge's host, and their names; `None` (the request ended) if it was
    /// explored or not armed.
    fn armed_naming_two_hosts(
        host: &FakeHost,
        plugin: &Plugin<FakeHost>,
    ) -> Option<(DownstreamRequest<FakeHost>, Vec<String>)> {
        host.request(Some("backend"), GET);
        let mut r = request(plugin);
        r.on_request_headers(true);
        let endpoint = host
            .request_header_text(ENDPOINT_HEADER)
            .unwrap_or_default();
        let named: Vec<String> = endpoint.split(',').map(str::to_string).collect();
        if named.len() < 2 || host.request_header_text(PER_TRY_TIMEOUT).is_none() {
            r.on_log();
            return None;
        }
        Some((r, named))
    }

    /// 40 requests; each one armed naming two hosts is answered by
    /// `answer` (from the host it is given), in turn the primary's and the
    /// hedge's. Returns how many each answered: [hedge's, primary's].
    fn answered_early_by_either(
        host: &FakeHost,
        plugin: &Plugin<FakeHost>,
        answer: impl Fn(&mut DownstreamRequest<FakeHost>, &str),
    ) -> [u64; 2] {
        let mut early = [0u64; 2];
        for i in 0..40 {
            let Some((mut r, named)) = armed_naming_two_hosts(host, plugin) else {
                continue;
            };
            let primary_answered = i % 2 == 0;
            answer(&mut r, &named[usize::from(!primary_answered)]);
            early[usize::from(primary_answered)] += 1;
        }
        early
    }

    /// One request answered after `latency_ms` by the host the filter
    /// named, as Envoy's override_host does, else by `address` (the
    /// balancer's pick); returns the host header the filter wrote.
    fn answered_by(
        host: &FakeHost,
        plugin: &Plugin<FakeHost>,
        headers: &[(&str, &str)],
        address: &str,
        latency_ms: impl Fn(&str) -> u64,
    ) -> Option<String> {
        host.request(Some("backend"), headers);
        let mut r = request(plugin);
        r.on_request_headers(true);
        let written = host.request_header_text(ENDPOINT_HEADER);
        let address = written
            .as_deref()
            .and_then(|w| w.split(',').next())
            .unwrap_or(address)
            .to_string();
        host.advance_ms(latency_ms(&address));
        host.set_property(RESPONSE_CODE_DETAILS, VIA_UPSTREAM);
        host.set_property(ATTEMPT_COUNT, &1i64.to_le_bytes());
        host.set_property(UPSTREAM_ADDRESS, address.as_bytes());
        r.on_response_headers(false);
        r.on_log();
        written
    }

    /// A hedged request answered before its per-try timeout was hedged
    /// early only if the primary's host answered (Envoy's timer fired
    /// early, the primary was about to answer); answered by the hedge's
    /// host, the second attempt was a retry after a fast failure.
    #[test]
    fn only_the_primary_s_early_answer_counts_as_an_early_hedge() {
        let (host, mut plugin) = plugin(r#"{"min_samples": 10, "budget_percent": 50}"#);
        for i in 0..60 {
            answered_by(&host, &plugin, GET, &format!("10.0.0.{}:80", i % 3), |_| 20);
        }
        plugin.on_tick();
        plugin.on_tick();
        // before the ~20 ms per-try timeout (within 5 ms of it, where an
        // answer from an unknown host would count), two attempts
        let early = answered_early_by_either(&host, &plugin, |r, address| {
            host.advance_ms(18);
            host.respond(RELAYED);
            host.set_property(ATTEMPT_COUNT, &2i64.to_le_bytes());
            host.set_property(UPSTREAM_ADDRESS, address.as_bytes());
            r.on_response_headers(false);
            r.on_log();
        });
        plugin.on_tick();
        assert!(early[0] >= 10 && early[1] >= 10, "{early:?}");
        assert_eq!(stat(&host, "early_hedges_total"), early[1]);
    }

    /// A request in flight whose primary another worker forgot (its host
    /// silent past `FORGET_MS` there), won by a hedge to a host new to the
    /// filter: the new host takes a slot of its own. Ending the pick before
    /// the worker heard the answer (as the glue did) freed the primary's
    /// slot for the new address, and the hedge's win went to the primary.
    #[test]
    fn a_hedge_s_win_is_not_taken_for_a_forgotten_primary_s() {
        use crate::policy::shared_state::{cluster_key, SharedCluster, SharedStore};
        use crate::policy::window::WindowGeometry;
        let (host, mut plugin) = plugin(r#"{"min_samples": 10, "budget_percent": 50}"#);
        for i in 0..60 {
            answered_by(&host, &plugin, GET, &format!("10.0.0.{}:80", i % 3), |_| 20);
        }
        plugin.on_tick();
        plugin.on_tick();
        let (mut r, named) = (0..20)
            .find_map(|_| armed_naming_two_hosts(&host, &plugin))
            .expect("an armed request naming two hosts");
        let primary = named[0].clone();
        // the shared value without the primary, as another worker left it
        let geometry = WindowGeometry::new(std::time::Duration::from_secs(30));
        let key = cluster_key(geometry, "backend");
        let (bytes, cas) = host.state().store.get(&key).unwrap().unwrap();
        let mut shared = SharedCluster::decode(&bytes, geometry).unwrap();
        shared.hosts.retain(|h| h.address != primary);
        assert_eq!(shared.hosts.len(), 2);
        host.state().store.set(&key, &shared.encode(), cas).unwrap();
        plugin.on_tick();
        // past the ~20 ms per-try timeout, the hedge's host answers first
        host.advance_ms(45);
        host.respond(RELAYED);
        host.set_property(ATTEMPT_COUNT, &2i64.to_le_bytes());
        host.set_property(UPSTREAM_ADDRESS, b"10.0.0.9:80");
        r.on_response_headers(false);
        r.on_log();
        plugin.on_tick();
        assert_eq!(stat(&host, "hedges_won_total"), 1);
    }

    #[test]
    fn the_chosen_hosts_are_written_and_the_answer_attributed() {
        let (host, mut plugin) = plugin(r#"{"min_samples": 10, "debug_header": true}"#);
        // three hosts, the third 15x slower; round robin until the filter
        // knows them
        let ms = |address: &str| if address == "10.0.0.2:80" { 30 } else { 2 };
        for i in 0..60 {
            answered_by(&host, &plugin, GET, &format!("10.0.0.{}:80", i % 3), ms);
        }
        plugin.on_tick();
        plugin.on_tick();
        let mut named = 0;
        for _ in 0..50 {
            let Some(endpoint) = answered_by(&host, &plugin, GET, "10.0.0.1:80", ms) else {
                continue; // explored: the balancer's pick
            };
            named += 1;
            assert!(!endpoint.contains("10.0.0.2:80"), "{endpoint}");
            let primary = endpoint.split(',').next().unwrap();
            let response = host.response_header_text(DEBUG_HEADER).unwrap();
            assert!(
                response.contains(&format!("; hosts={endpoint}; answered={primary}")),
                "{response}"
            );
        }
        assert!(named >= 45, "{named}");
        plugin.on_tick();
        assert_eq!(stat(&host, "hosts_on_probation"), 1);
        assert_eq!(stat(&host, "hosts_tracked"), 3);
        // a client's own header: overwritten when the filter chooses...
        let sent = [(":method", "GET"), (ENDPOINT_HEADER, "10.0.0.2:80")];
        let written = answered_by(&host, &plugin, &sent, "10.0.0.0:80", ms);
        assert!(written.is_some_and(|w| !w.contains("10.0.0.2")));
        // ...and removed when it does not (no cluster to choose in)
        host.request(None, &sent);
        request(&plugin).on_request_headers(true);
        assert_eq!(host.request_header_text(ENDPOINT_HEADER), None);
    }

    /// A relayed response: the status and the router's mark in one read.
    const RELAYED: &[(&str, &str)] = &[(":status", "200"), (UPSTREAM_SERVICE_TIME, "2")];

    /// At defaults, three hosts learned (10.0.0.2:80 three times slower).
    /// The cluster's circuit breaker overflows: Envoy answers 503 itself,
    /// no host received the request, and the host named is not blamed.
    #[test]
    fn a_circuit_breaker_s_overflow_is_no_host_s_failure() {
        let (host, mut plugin) = three_hosts_learned();
        for _ in 0..40 {
            host.request(Some("backend"), GET);
            let mut r = request(&plugin);
            r.on_request_headers(true);
            host.respond(&[(":status", "503")]);
            host.set_property(
                RESPONSE_CODE_DETAILS,
                b"upstream_reset_before_response_started{overflow}",
            );
            host.set_property(ATTEMPT_COUNT, &1i64.to_le_bytes());
            r.on_response_headers(false);
            r.on_log();
        }
        plugin.on_tick();
        use crate::policy::shared_state::SharedStore;
        // the default window's geometry
        let geometry =
            crate::policy::window::WindowGeometry::new(std::time::Duration::from_secs(30));
        let key = crate::policy::shared_state::cluster_key(geometry, "backend");
        let (bytes, _) = SharedStore::get(&host, &key).unwrap().unwrap();
        let shared = crate::policy::shared_state::SharedCluster::decode(&bytes, geometry).unwrap();
        assert_eq!(shared.hosts.len(), 3);
        for h in &shared.hosts {
            assert_eq!(h.failures, 0.0, "{}", h.address);
        }
    }

    /// A stream's host is in flight until the stream ends, not only until
    /// its headers: the load term of the choice sees a host busy with
    /// streams, the winning hedge's host included.
    #[test]
    fn a_stream_s_host_stays_in_flight_until_it_ends() {
        let (host, plugin) = three_hosts_learned();
        let (mut r, named) = first_naming(&host, &plugin, 1, 100);
        let primary = named[0].clone();
        let in_flight = |r: &DownstreamRequest<FakeHost>| {
            let worker = r.worker.as_ref().unwrap().borrow();
            worker.cluster(0).unwrap().in_flight_to(&primary)
        };
        assert_eq!(in_flight(&r), Some(1));
        host.advance_ms(3);
        host.respond(RELAYED);
        host.set_property(ATTEMPT_COUNT, &1i64.to_le_bytes());
        host.set_property(UPSTREAM_ADDRESS, primary.as_bytes());
        r.on_response_headers(false);
        r.on_response_body(10, false);
        assert_eq!(in_flight(&r), Some(1), "the stream goes on");
        r.on_response_body(10, true);
        r.on_log();
        assert_eq!(in_flight(&r), Some(0));
        // the hedge's host answered: the cancelled primary is in flight no
        // more, from the headers on
        let (mut r, named) = first_naming(&host, &plugin, 2, 200);
        let (primary, hedge) = (named[0].clone(), named[1].clone());
        let worker = r.worker.clone().unwrap();
        let in_flight = |address: &str| worker.borrow().cluster(0).unwrap().in_flight_to(address);
        assert_eq!(in_flight(&primary), Some(1));
        let before = in_flight(&hedge);
        assert!(before.is_some(), "the hedge's host is known");
        host.advance_ms(30);
        host.respond(RELAYED);
        host.set_property(ATTEMPT_COUNT, &2i64.to_le_bytes());
        host.set_property(UPSTREAM_ADDRESS, hedge.as_bytes());
        r.on_response_headers(false);
        assert_eq!(in_flight(&primary), Some(0), "the primary was cancelled");
        // the stream goes on at the hedge's host: in flight there
        assert_eq!(in_flight(&hedge), before.map(|n| n + 1));
        r.on_response_body(10, false);
        assert_eq!(in_flight(&hedge), before.map(|n| n + 1));
        r.on_response_body(10, true);
        r.on_log();
        assert_eq!(in_flight(&primary), Some(0));
        assert_eq!(in_flight(&hedge), before, "ended with the stream");
    }

    /// The first of at most `tries` requests whose host header names at
    /// least `hosts` hosts (a primary, a hedge), and the names; the others
    /// end unanswered.
    fn first_naming(
        host: &FakeHost,
        plugin: &Plugin<FakeHost>,
        hosts: usize,
        tries: usize,
    ) -> (DownstreamRequest<FakeHost>, Vec<String>) {
        for _ in 0..tries {
            host.request(Some("backend"), GET);
            let mut r = request(plugin);
            r.on_request_headers(true);
            let named: Vec<String> = host
                .request_header_text(ENDPOINT_HEADER)
                .unwrap_or_default()
                .split(',')
                .filter(|h| !h.is_empty())
                .map(str::to_string)
                .collect();
            if named.len() >= hosts {
                return (r, named);
            }
            r.on_log();
        }
        panic!("no request named {hosts} hosts in {tries}");
    }

    fn three_hosts_learned() -> (FakeHost, Plugin<FakeHost>) {
        let (host, mut plugin) = plugin("{}");
        let ms = |address: &str| if address == "10.0.0.2:80" { 9 } else { 3 };
        for i in 0..300 {
            answered_by(&host, &plugin, GET, &format!("10.0.0.{}:80", i % 3), ms);
            if i % 50 == 49 {
                plugin.on_tick();
            }
        }
        (host, plugin)
    }

    /// The host calls of one request at the default configuration, by
    /// phase: armed, two hosts chosen, timed (a sample), its host learned.
    /// What each costs Envoy is in docs/evaluation.md ("The filter's own
    /// cost"); a new call on this path should be a deliberate change here.
    #[test]
    fn the_host_calls_of_a_request_at_defaults_by_phase() {
        let (host, plugin) = three_hosts_learned();
        // the route's overrides are read once a second, not per request
        host.request(Some("backend"), GET);
        host.set_property(ROUTE_NAME, b"default");
        request(&plugin).on_request_headers(true);
        // four chosen requests in a row: one reads which host answered
        let mut chosen = Vec::new();
        let mut tries = 0;
        while chosen.len() < ADDRESS_CHECK_EVERY as usize {
            tries += 1;
            assert!(tries < 100, "no host chosen in {tries} requests");
            host.request(Some("backend"), GET);
            host.set_property(ROUTE_NAME, b"default");
            let mut r = request(&plugin);
            r.on_request_headers(true);
            let request_calls = std::mem::take(&mut host.state_mut().calls);
            let Some(endpoint) = host.request_header_text(ENDPOINT_HEADER) else {
                r.on_log(); // explored: the balancer's pick; try again
                continue;
            };
            let primary = endpoint.split(',').next().unwrap_or_default().to_string();
            host.advance_ms(3);
            host.respond(RELAYED);
            host.set_property(ATTEMPT_COUNT, &1i64.to_le_bytes());
            host.set_property(UPSTREAM_ADDRESS, primary.as_bytes());
            r.on_response_headers(false);
            let response_calls = std::mem::take(&mut host.state_mut().calls);
            r.on_response_body(10, true);
            r.on_log();
            let end_calls = std::mem::take(&mut host.state_mut().calls);
            chosen.push([request_calls, response_calls, end_calls]);
        }
        let expected: [&[&str]; 3] = [
            &[
                "request_header_pairs",
                "property xds.cluster_name",
                "property xds.route_name",
                "now_ns",
                "set_request_header x-gateway-destination-endpoint",
                "set_request_header x-envoy-retriable-status-codes",
                "set_request_header x-envoy-hedge-on-per-try-timeout",
                "set_request_header x-envoy-max-retries",
                "set_request_header x-envoy-retry-on",
                "set_request_header x-envoy-upstream-rq-per-try-timeout-ms",
                "set_request_header x-envoy-upstream-rq-timeout-alt-response",
            ],
            &[
                "response_header_pairs",
                "now_ns",
                "property upstream.request_attempt_count",
            ],
            &[],
        ];
        let mut address_reads = 0;
        for mut phases in chosen {
            // the named host is trusted after a single attempt, but for one
            // response in ADDRESS_CHECK_EVERY
            if phases[1].last().map(String::as_str) == Some("property upstream.address") {
                phases[1].pop();
                address_reads += 1;
            }
            for (phase, (made, expected)) in ["request headers", "response headers", "body and log"]
                .iter()
                .zip(phases.iter().zip(expected))
            {
                assert_eq!(made, expected, "{phase}");
            }
        }
        assert_eq!(address_reads, 1);
    }

    /// A request the filter does not time (past `SAMPLES_PER_TICK` a tick)
    /// still reads the clock at its request headers: its armed deadline
    /// and the pacing need it (the docs once said it skipped the clock).
    /// At its response it reads only the attempt count (armed: for the
    /// budget), not the response header map, the clock or the address.
    #[test]
    fn an_untimed_request_reads_the_clock_but_not_its_response() {
        let (host, mut plugin) = three_hosts_learned();
        host.request(Some("backend"), GET);
        host.set_property(ROUTE_NAME, b"default");
        request(&plugin).on_request_headers(true);
        // a busy tick: the next one times one request in a stride
        for _ in 0..1_000 {
            answered_by(&host, &plugin, GET, "10.0.0.0:80", |_| 3);
        }
        plugin.on_tick();
        let mut untimed = 0;
        for _ in 0..8 {
            host.request(Some("backend"), GET);
            host.set_property(ROUTE_NAME, b"default");
            let mut r = request(&plugin);
            r.on_request_headers(true);
            let request_calls = std::mem::take(&mut host.state_mut().calls);
            assert!(request_calls.iter().any(|c| c == "now_ns"));
            assert!(request_calls
                .iter()
                .any(|c| c.starts_with("set_request_header")));
            if r.sample.is_some() {
                r.on_log();
                continue;
            }
            untimed += 1;
            host.advance_ms(3);
            host.respond(RELAYED);
            host.set_property(ATTEMPT_COUNT, &1i64.to_le_bytes());
            host.set_property(UPSTREAM_ADDRESS, b"10.0.0.0:80");
            r.on_response_headers(false);
            r.on_response_body(10, true);
            r.on_log();
            let response_calls = std::mem::take(&mut host.state_mut().calls);
            assert_eq!(response_calls, ["property upstream.request_attempt_count"]);
        }
        assert!(untimed >= 4, "{untimed} of 8 untimed");
    }

    /// The response's origin costs one read when the router marked it, a
    /// second only when it did not; a 5xx from an upstream is the
    /// upstream's, a local reply is nobody's latency.
    #[test]
    fn a_response_s_origin_is_read_from_its_headers_and_details_only_when_unmarked() {
        let (host, plugin) = warmed("{}");
        let respond = |headers: &[(&str, &str)], details: Option<&[u8]>| {
            host.request(Some("backend"), GET);
            let mut r = request(&plugin);
            r.on_request_headers(true);
            host.respond(headers);
            if let Some(details) = details {
                host.set_property(RESPONSE_CODE_DETAILS, details);
            }
            host.state_mut().calls.clear();
            let origin = r.origin();
            let details_read = host.calls_to("property") > 0;
            (origin, details_read)
        };
        let (origin, details_read) =
            respond(&[(":status", "503"), (UPSTREAM_SERVICE_TIME, "4")], None);
        assert_eq!(
            origin,
            Origin {
                from_upstream: true,
                status: Some(503),
                timed_out: false,
                unsent: false,
            }
        );
        assert!(!details_read);
        let (origin, details_read) = respond(&[(":status", "503")], Some(b"no_healthy_upstream"));
        assert_eq!(
            origin,
            Origin {
                from_upstream: false,
                status: Some(503),
                timed_out: false,
                unsent: true,
            }
        );
        assert!(details_read);
        // an operator who suppresses Envoy's headers: the details decide
        let (origin, _) = respond(&[(":status", "200")], Some(VIA_UPSTREAM));
        assert_eq!(
            origin,
            Origin {
                from_upstream: true,
                status: Some(200),
                timed_out: false,
                unsent: false,
            }
        );
        // neither readable: not from an upstream
        let (origin, _) = respond(&[], None);
        assert!(!origin.from_upstream);
    }

    /// Armed requests ask for a 204 on timeouts (no 504 to outlier
    /// detection when a hedge's per-try timeout fires); the route timeout's
    /// reply is mended back to what the client would have had. An
    /// upstream's own 204 and an unarmed request's reply are left alone.
    #[test]
    fn an_armed_request_s_timeout_reply_is_mended_to_a_504() {
        let (host, mut plugin) = warmed(r#"{"idempotent_grpc_methods": ["/demo.Echo/Get"]}"#);
        let reply =
            |request_headers: &[(&str, &str)], response: &[(&str, &str)], details: &[u8]| {
                host.request(Some("backend"), request_headers);
                let mut r = request(&plugin);
                r.on_request_headers(true);
                let armed = host
                    .request_header_text(TIMEOUT_ALT_RESPONSE)
                    .is_some_and(|v| v == "true");
                host.respond(response);
                host.set_property(RESPONSE_CODE_DETAILS, details);
                r.on_response_headers(true);
                r.on_log();
                let grpc_status = host.response_header_text("grpc-status");
                (armed, host.response_header_text(":status"), grpc_status)
            };
        let timeout = b"response_timeout";
        let (armed, status, _) = reply(GET, &[(":status", "204")], timeout);
        assert!(armed);
        assert_eq!(status.as_deref(), Some("504"));
        // an upstream's own 204
        let relayed = [(":status", "204"), (UPSTREAM_SERVICE_TIME, "3")];
        let (_, status, _) = reply(GET, &relayed, VIA_UPSTREAM);
        assert_eq!(status.as_deref(), Some("204"));
        // not armed: whatever a (trusted) client asked the router for
        let post = [(":method", "POST"), (":path", "/")];
        let (armed, status, _) = reply(&post, &[(":status", "204")], timeout);
        assert!(!armed);
        assert_eq!(status.as_deref(), Some("204"));
        // a gRPC call's reply: UNKNOWN (mapped from the 204) -> UNAVAILABLE
        let call = [
            (":method", "POST"),
            (":path", "/demo.Echo/Get"),
            ("content-type", "application/grpc"),
        ];
        let grpc_reply = [
            (":status", "200"),
            ("content-type", "application/grpc"),
            ("grpc-status", "2"),
        ];
        let (armed, status, grpc_status) = reply(&call, &grpc_reply, timeout);
        assert!(armed);
        assert_eq!(status.as_deref(), Some("200"));
        assert_eq!(grpc_status.as_deref(), Some("14"));
        // a call the filter took for gRPC that Envoy answered as HTTP
        let (armed, status, grpc_status) = reply(&call, &[(":status", "204")], timeout);
        assert!(armed);
        assert_eq!(status.as_deref(), Some("504"));
        assert_eq!(grpc_status, None);
        // a mending that fails is counted
        host.fail("set_response_header :status");
        let (_, status, _) = reply(GET, &[(":status", "204")], timeout);
        assert_eq!(status.as_deref(), Some("204"));
        host.state_mut().failing.clear();
        plugin.on_tick();
        assert_eq!(host.stat("adaptive_hedge.host_errors_total"), Some(1));
        // the 204 is best effort: a failed write leaves the request armed
        host.fail(&format!("set_request_header {TIMEOUT_ALT_RESPONSE}"));
        host.request(Some("backend"), GET);
        request(&plugin).on_request_headers(true);
        assert!(host.request_header_text(PER_TRY_TIMEOUT).is_some());
        assert_eq!(host.request_header_text(TIMEOUT_ALT_RESPONSE), None);
    }

    /// Where Envoy's admin interface shows the cluster with no outlier
    /// detector, armed requests do not ask for the timeouts' 204 (nothing
    /// would read it: a header write saved); until it is read they do.
    #[test]
    fn the_timeouts_204_is_not_asked_for_where_no_detector_reads_it() {
        let (host, mut plugin) = warmed(r#"{"admin_cluster": "envoy_admin"}"#);
        let asks = |plugin: &Plugin<FakeHost>| {
            host.request(Some("backend"), GET);
            let mut r = request(plugin);
            r.on_request_headers(true);
            assert!(host.request_header_text(PER_TRY_TIMEOUT).is_some(), "armed");
            let asks = host.request_header_text(TIMEOUT_ALT_RESPONSE).is_some();
            r.on_log();
            asks
        };
        assert!(asks(&plugin), "not known yet");
        plugin.on_tick();
        let token = host.state().dispatched.len() as u32;
        assert!(token > 0, "no admin read dispatched");
        let body = b"backend::10.0.0.1:80::health_flags::healthy\n";
        {
            let mut s = host.state_mut();
            s.call_response_headers = vec![(":status".into(), b"200".to_vec())];
            s.call_response_body = body.to_vec();
        }
        plugin.on_http_call_response(token, body.len());
        plugin.on_tick();
        assert!(!asks(&plugin), "no detector there");
    }

    /// A header write or removal that fails is counted in
    /// `host_errors_total`, and a failed write of the chosen host does not
    /// leave the client's own header to choose it.
    #[test]
    fn failed_header_calls_are_counted_and_leave_the_client_no_choice() {
        let (host, mut plugin) = three_hosts_learned();
        let errors = |plugin: &mut Plugin<FakeHost>| {
            plugin.on_tick();
            host.stat("adaptive_hedge.host_errors_total").unwrap_or(0)
        };
        let before = errors(&mut plugin);
        host.fail(&format!("set_request_header {ENDPOINT_HEADER}"));
        let sent = [(":method", "GET"), (ENDPOINT_HEADER, "10.0.0.9:80")];
        for _ in 0..20 {
            host.request(Some("backend"), &sent);
            let mut r = request(&plugin);
            r.on_request_headers(true);
            assert_eq!(host.request_header_text(ENDPOINT_HEADER), None);
            r.on_log();
        }
        let failed_writes = errors(&mut plugin) - before;
        assert!(
            (10..=20).contains(&failed_writes),
            "{failed_writes} failed writes counted"
        );
        // an arming that fails half-way, its headers not all removed: the
        // attempts Envoy may still make are paid for (settled on the count)
        host.state_mut().failing.clear();
        host.fail(&format!("set_request_header {PER_TRY_TIMEOUT}"));
        host.fail(&format!("remove_request_header {MAX_RETRIES}"));
        let sent_before = stat(&host, "hedges_sent_total");
        host.request(Some("backend"), GET);
        let mut r = request(&plugin);
        r.on_request_headers(true);
        assert_eq!(host.request_header_text(MAX_RETRIES).as_deref(), Some("1"));
        host.set_property(ATTEMPT_COUNT, &2i64.to_le_bytes());
        r.on_log();
        plugin.on_tick();
        assert_eq!(stat(&host, "hedges_sent_total") - sent_before, 1);
        // nor, the write failing and its removal too, is a request armed
        // with the client's host still named
        host.state_mut().failing.clear();
        host.fail(&format!("set_request_header {ENDPOINT_HEADER}"));
        host.fail(&format!("remove_request_header {ENDPOINT_HEADER}"));
        let mut armed_with_the_client_s_host = 0;
        for _ in 0..20 {
            host.request(Some("backend"), &sent);
            let mut r = request(&plugin);
            r.on_request_headers(true);
            let named = host.request_header_text(ENDPOINT_HEADER).is_some();
            armed_with_the_client_s_host +=
                u32::from(named && host.request_header_text(PER_TRY_TIMEOUT).is_some());
            r.on_log();
        }
        assert_eq!(armed_with_the_client_s_host, 0);
        // a client's control header that cannot be removed
        host.state_mut().failing.clear();
        host.fail(&format!("remove_request_header {MAX_RETRIES}"));
        let before = errors(&mut plugin);
        host.request(Some("backend"), &[(":method", "POST"), (MAX_RETRIES, "5")]);
        let mut r = request(&plugin);
        r.on_request_headers(true);
        r.on_log();
        assert_eq!(errors(&mut plugin) - before, 1);
    }

    #[test]
    fn without_host_choice_no_host_is_read_or_written() {
        let (host, plugin) = warmed(r#"{"host_choice": false}"#);
        let sent = [(":method", "GET"), (ENDPOINT_HEADER, "10.0.0.2:80")];
        host.request(Some("backend"), &sent);
        let mut r = request(&plugin);
        r.on_request_headers(true);
        assert_eq!(
            host.request_header_text(ENDPOINT_HEADER).as_deref(),
            Some("10.0.0.2:80"),
            "not the filter's business: the header is the operator's"
        );
        host.set_property(RESPONSE_CODE_DETAILS, VIA_UPSTREAM);
        r.on_response_headers(false);
        assert!(
            !host
                .state()
                .calls
                .iter()
                .any(|c| c.contains("upstream.address")),
            "{:?}",
            host.state().calls
        );
    }

    /// Host choice off for one cluster (or one route) while on for others:
    /// its answers are not read for the host that answered, which nothing
    /// would use. Before, every timed response of such a cluster read
    /// `upstream.address` (about 12,500 instructions) and threw it away.
    #[test]
    fn a_cluster_without_host_choice_reads_no_host_while_others_choose() {
        let (host, plugin) = warmed(r#"{"clusters": {"backend": {"host_choice": false}}}"#);
        for _ in 0..20 {
            host.request(Some("backend"), GET);
            let mut r = request(&plugin);
            r.on_request_headers(true);
            assert_eq!(host.request_header_text(ENDPOINT_HEADER), None);
            host.respond(RELAYED);
            host.set_property(ATTEMPT_COUNT, &1i64.to_le_bytes());
            host.set_property(UPSTREAM_ADDRESS, b"10.0.0.1:80");
            r.on_response_headers(false);
            r.on_log();
        }
        let calls = &host.state().calls;
        assert!(
            !calls.iter().any(|c| c.contains("upstream.address")),
            "{calls:?}"
        );
    }

    #[test]
    fn log_attribution_writes_the_decision_hosts_and_attempts_to_filter_state() {
        let (host, mut plugin) = plugin(r#"{"min_samples": 10, "log_attribution": true}"#);
        let ms = |address: &str| if address == "10.0.0.2:80" { 30 } else { 2 };
        for i in 0..60 {
            answered_by(&host, &plugin, GET, &format!("10.0.0.{}:80", i % 3), ms);
        }
        plugin.on_tick();
        plugin.on_tick();
        let state = |host: &FakeHost| {
            host.state()
                .filter_state
                .get(FILTER_STATE)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default()
        };
        let mut chosen = 0;
        for _ in 0..20 {
            let Some(endpoint) = answered_by(&host, &plugin, GET, "10.0.0.1:80", ms) else {
                continue;
            };
            chosen += 1;
            let primary = endpoint.split(',').next().unwrap();
            let logged = state(&host);
            assert!(logged.starts_with("armed; delay_ms="), "{logged}");
            assert!(
                logged.ends_with(&format!(
                    "; hosts={endpoint}; answered={primary}; attempts=1"
                )),
                "{logged}"
            );
        }
        assert!(chosen >= 15);
        assert_eq!(
            host.response_header_text(DEBUG_HEADER),
            None,
            "no debug header asked for"
        );
        // a write Envoy refuses is counted, as every failed host call is
        plugin.on_tick();
        let errors = host.stat("adaptive_hedge.host_errors_total").unwrap_or(0);
        host.fail(&format!("set_filter_state {FILTER_STATE}"));
        answered_by(&host, &plugin, GET, "10.0.0.1:80", ms);
        plugin.on_tick();
        assert_eq!(
            host.stat("adaptive_hedge.host_errors_total"),
            Some(errors + 1)
        );
    }

    /// First-byte mode judges the host on the first byte, after the
    /// response headers wrote the attribution: the access log's copy is
    /// written again then, with the host that answered (it had none).
    #[test]
    fn in_first_byte_mode_the_access_log_learns_who_answered() {
        let (host, mut plugin) = plugin(
            r#"{"min_samples": 10, "log_attribution": true, "latency_signal": "first_byte"}"#,
        );
        let mut round_robin = 0;
        let mut stream = |host: &FakeHost, plugin: &Plugin<FakeHost>| {
            host.request(Some("backend"), GET);
            let mut r = request(plugin);
            r.on_request_headers(true);
            let endpoint = host.request_header_text(ENDPOINT_HEADER);
            round_robin += 1;
            let fallback = format!("10.0.0.{}:80", round_robin % 3);
            let answered = endpoint
                .as_deref()
                .and_then(|e| e.split(',').next())
                .unwrap_or(&fallback)
                .to_string();
            host.set_property(RESPONSE_CODE_DETAILS, VIA_UPSTREAM);
            host.set_property(ATTEMPT_COUNT, &1i64.to_le_bytes());
            host.set_property(UPSTREAM_ADDRESS, answered.as_bytes());
            r.on_response_headers(false);
            host.advance_ms(2);
            r.on_response_body(5, false);
            r.on_log();
            (endpoint, answered)
        };
        for _ in 0..60 {
            stream(&host, &plugin);
        }
        plugin.on_tick();
        plugin.on_tick();
        let mut chosen = 0;
        for _ in 0..20 {
            let (Some(endpoint), answered) = stream(&host, &plugin) else {
                continue;
            };
            chosen += 1;
            let logged = host
                .state()
                .filter_state
                .get(FILTER_STATE)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default();
            assert!(
                logged.ends_with(&format!(
                    "; hosts={endpoint}; answered={answered}; attempts=1"
                )),
                "{logged}"
            );
        }
        assert!(chosen >= 15);
    }
}

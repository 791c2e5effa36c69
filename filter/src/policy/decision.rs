//! When do we hedge. [`plan`] is the one function that decides: from what is
//! known of a request when its headers pass the filter (method, upgrade,
//! which control headers the client sent), the config and the routed
//! cluster's state, it returns the whole plan: skip (and why) or arm, the
//! exact request headers to set and to remove, whether to time the response
//! for a latency sample, and the hedges to settle when the request ends. It
//! changes nothing; the worker books the plan (counters, budget) and the
//! proxy glue carries it out.
//!
//! The rules, in order:
//! - a client that set the control headers itself, where the operator
//!   trusts clients (`trust_client_headers`), keeps them and is not armed;
//! - no routed cluster, or a cluster past `max_clusters`: not armed;
//! - armed only if the cluster is not disabled, the method is one that is
//!   safe to repeat, the request is not a protocol upgrade, the long horizon holds
//!   `min_samples` samples from all workers, and the budget can pay for a
//!   hedge even if every armed request in flight hedges (see `budget`);
//! - every client-sent control header and first-byte marker of a request
//!   that is not armed is removed: a client never switches hedging on;
//! - where the cluster chooses hosts (`hosts`), any request (armed or not)
//!   gets its host by power of d choices and, if armed, the hedge the best
//!   other host; a client's own host header is overwritten or removed
//!   unless the operator trusts clients.

use std::sync::Arc;

use super::budget::LocalBudget;
use super::config::{ClusterPolicy, Config, LatencySignal, Mode};
use super::hedge_delay::HedgeDelay;
use super::hosts::{HostPick, Hosts};
use super::timeouts::{ArmedRequests, MAX_PAST_DELAY};
use crate::headers::{
    FIRST_BYTE_MARKER, HEDGE_ON_PER_TRY_TIMEOUT, MAX_RETRIES, PER_TRY_TIMEOUT,
    RETRIABLE_STATUS_CODES, RETRY_GRPC_ON, RETRY_ON,
};

/// What the filter reads from a request's headers (one host call; see
/// `header_pairs`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request<'a> {
    pub method: &'a [u8],
    /// `:path`, read for gRPC calls only (their method's name).
    pub path: &'a [u8],
    /// A gRPC call: `content-type: application/grpc` (or `+proto` etc.).
    pub grpc: bool,
    /// An `upgrade` header (WebSocket, h2c): the request opens a connection.
    pub upgrade: bool,
    /// The client sent at least one router control header.
    pub client_controls: bool,
    /// The client sent the first-byte marker.
    pub client_marker: bool,
    /// The client sent the host header (`host_header`).
    pub client_endpoint: bool,
    /// A body follows the headers. Envoy starts the per-try timer when the
    /// request is complete, not at its headers: with a body sent slowly
    /// (an upload, a search query streamed in chunks) a deadline counted
    /// from the headers fired where no timer had. A unary gRPC call's
    /// message follows its headers at once. (Such a request is still a
    /// latency sample, timed by the glue from its body's end: left out, a
    /// cluster whose requests all carry a body, or an empty one in a frame
    /// of its own, never learned a delay.)
    pub body_follows: bool,
}

impl Request<'_> {
    /// What to assume when the headers cannot be read: the method is unknown
    /// (so the request is not armed) and the client may have sent anything
    /// (so everything is removed, unless clients are trusted). The safe side
    /// of both.
    pub const UNREADABLE: Request<'static> = Request {
        method: b"",
        path: b"",
        grpc: false,
        upgrade: false,
        client_controls: true,
        client_marker: true,
        client_endpoint: true,
        body_follows: false,
    };

    /// Whether Envoy's per-try timer starts about when the filter sees the
    /// headers (see `body_follows`): only then is a deadline counted from
    /// them.
    pub fn timed_from_headers(&self) -> bool {
        !self.body_follows || self.grpc
    }
}

/// A cluster handle the HTTP context keeps between callbacks.
pub type ClusterId = usize;

/// A named route of a cluster (an index into its routes), for the routes
/// that learn their own delay.
pub type RouteId = usize;

/// The routed cluster as the worker knows it when the request arrives.
#[derive(Clone, Copy, Debug)]
pub enum Cluster<'a> {
    /// No routed cluster (direct response, redirect, no route).
    None,
    /// Past `max_clusters`: not tracked.
    Untracked,
    /// No upstream of it has answered this worker yet: a name a client may
    /// have made up (`cluster_header` routes), so not tracked until one does.
    Unconfirmed,
    /// The route's `adaptive_hedge` metadata was refused (logged).
    Misconfigured,
    Tracked(ClusterView<'a>),
}

#[derive(Clone, Copy, Debug)]
pub struct ClusterView<'a> {
    pub id: ClusterId,
    /// The request's route, if it learns its own delay.
    pub route: Option<RouteId>,
    pub policy: &'a ClusterPolicy,
    /// Cached on the tick (the route's once it has learned one, else the
    /// cluster's); `None` while warming up.
    pub delay: Option<HedgeDelay>,
    pub budget: &'a LocalBudget,
    /// It is this request's turn to be a latency sample, if it belongs to
    /// the sampled population (see `in_sample_population`).
    pub sample_turn: bool,
    /// The cluster's hosts, if it chooses them (`host_choice`, and the
    /// cluster has not been seen to ignore the choice).
    pub hosts: Option<&'a Hosts>,
    /// A fresh random number for the choice.
    pub random: u64,
    /// The clock (ns), if read: the armed request's deadline is kept.
    pub now_ns: Option<u64>,
    /// This worker's armed requests to the cluster past their delay and
    /// still running, and those it armed (see `timeouts`).
    pub past_delay: usize,
    pub armed: Option<&'a ArmedRequests>,
    /// The delay is known stale: no request is armed with it.
    pub stale_delay: bool,
    /// Armed requests are paced for outlier detection (`outlier_pacing`,
    /// unless Envoy says its outlier detection cannot count a hedge's
    /// timeout there: see `timeouts`).
    pub pacing: bool,
    /// Armed requests ask the router for a 204 on timeouts (see
    /// `Arming::timeouts_as_204`): false only where Envoy's admin interface
    /// says no outlier detector would read the code.
    pub timeouts_as_204: bool,
}

/// Everything the filter does with one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub decision: Decision,
    /// Client-sent headers to remove.
    pub strip: Strip,
    /// The tracked cluster the request counts for.
    pub cluster: Option<ClusterId>,
    /// Its route, if the route learns its own delay (the sample goes there too).
    pub route: Option<RouteId>,
    /// The budget's tick its hedges are armed in (see `budget`).
    pub cohort: u64,
    /// Time the response: a latency sample for the cluster's window.
    pub sample: bool,
    /// The hosts chosen (the header names them).
    pub hosts: Option<HostPick>,
    /// The host header's value: `primary[,hedge]`.
    pub endpoint: Option<String>,
    /// The cluster chooses hosts (`host_choice`): its answers say which host
    /// answered and after how many attempts, read at the response. Without
    /// it those two property reads would be thrown away (found by a review).
    pub learns_hosts: bool,
    /// When an armed request's per-try timeout fires (ns; see `timeouts`).
    pub deadline_ns: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Arm(Arming),
    Skip(Skip),
}

/// An armed request: Envoy's router races the attempts and cancels losers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arming {
    /// The hedge delay, in the router's millisecond resolution.
    pub per_try_timeout_ms: u64,
    /// Hedges paid for (at most `max_hedges`).
    pub hedges: u32,
    /// `x-envoy-max-retries`: the hedges, or the route's own retries if
    /// more (the header replaces the route's `num_retries`; hedges and
    /// retries share the count).
    pub max_retries: u32,
    /// Extra attempts paid for up front: `max_retries`, since Envoy may
    /// spend the whole count on hedges (each attempt's own per-try timeout
    /// sends the next); a shadow's would-be hedges alone.
    pub reserved: u32,
    pub retry_on: Arc<str>,
    /// `x-envoy-retriable-status-codes` (`retriable_status_codes`), if any:
    /// a hedge's fast 429 must not end the race while the other attempt
    /// runs (Envoy drops a retriable answer when no retry is left and
    /// another attempt still waits for its headers).
    pub retriable_status_codes: Option<Arc<str>>,
    /// `x-envoy-retry-grpc-on`, for gRPC calls: a fast UNAVAILABLE from
    /// one attempt must not end the race (Envoy reads the status of a
    /// trailers-only answer).
    pub retry_grpc_on: Option<Arc<str>>,
    /// Mark the request for the upstream role's first-byte hold.
    pub first_byte_marker: bool,
    /// `mode: shadow`: decided, not armed; settled as if it had been, from
    /// the response's time (would the hedge have been sent?).
    pub shadow: bool,
    /// Ask the router for a 204 on timeouts (`headers::TIMEOUT_ALT_RESPONSE`),
    /// so that a hedge's per-try timeout is no 5xx to outlier detection.
    /// Where the admin interface says the cluster has no outlier detector,
    /// or one that splits local-origin errors (which ignores the code),
    /// nothing reads it, and the write (a host call) is saved.
    pub timeouts_as_204: bool,
}

/// Why a request was not armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// No routed cluster (direct response, redirect, no route).
    NoCluster,
    /// Past `max_clusters`: the cluster is not tracked.
    Untracked,
    /// No upstream of the cluster has answered this worker yet.
    Unconfirmed,
    /// The filter's worker state could not be reached (not configured, or
    /// busy): nothing to decide with.
    NoWorker,
    Disabled,
    /// The method is not in `idempotent_methods`.
    Method,
    /// A gRPC call to a method not in `idempotent_grpc_methods`.
    GrpcMethod,
    /// The request asks to switch protocols (WebSocket).
    Upgrade,
    /// Fewer than `min_samples` in the long horizon.
    WarmingUp,
    /// The client set the control headers itself and `trust_client_headers` is on.
    ClientControlled,
    BudgetExhausted,
    /// The route's `adaptive_hedge` metadata was refused (logged).
    RouteMetadata,
    /// Enough of this worker's armed requests to the cluster are past
    /// their delay (see `timeouts`).
    Paced,
    /// The delay is stale (armed requests fired one after the other) and
    /// the window has not learned the slower latency yet (`StaleLatch`).
    StaleDelay,
}

/// Which client-sent request headers to remove.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Strip {
    /// Every router control header (`headers::CONTROL_HEADERS`).
    pub control: bool,
    pub marker: bool,
    /// The host header.
    pub endpoint: bool,
}

impl Strip {
    /// What the client sent: removing only that saves a host call per
    /// header it did not send.
    pub fn client_sent(request: &Request) -> Strip {
        Strip {
            control: request.client_controls,
            marker: request.client_marker,
            endpoint: request.client_endpoint,
        }
    }

    /// What a trusted client's request loses: the first-byte marker alone.
    /// Its retry and hedge headers are its own, but the marker is the
    /// filter's, between its two roles: kept, the upstream role held an
    /// unarmed request's headers until its first byte (found by a review).
    pub fn trusted(request: &Request) -> Strip {
        Strip {
            marker: request.client_marker,
            ..Strip::default()
        }
    }

    /// Everything arming may have set: what is left to do when arming
    /// failed half-way (a chosen host stays: it duplicates nothing).
    pub const ARMING: Strip = Strip {
        control: true,
        marker: true,
        endpoint: false,
    };
}

/// The hedges of an armed request, settled when it ends: those Envoy did not
/// send go back to the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Settlement {
    pub cluster: ClusterId,
    pub hedges: u32,
    /// The budget's tick the hedges were armed in.
    pub cohort: u64,
    /// The per-try timeout they were armed with (to tell early hedges).
    pub per_try_timeout_ms: u64,
    /// Not armed (`mode: shadow`): the hedges are would-be hedges.
    pub shadow: bool,
    /// Its per-try timeout's deadline, if kept (see `timeouts`).
    pub deadline_ns: Option<u64>,
    /// Its latency is a sample (`Plan::sample`).
    pub sampled: bool,
}

/// A request header value to set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderValue<'a> {
    Text(&'a str),
    Number(u64),
}

impl HeaderValue<'_> {
    /// The value's bytes; a number is written in decimal into `buf`
    /// (nothing allocated on the request path).
    pub fn bytes<'b>(&'b self, buf: &'b mut [u8; 20]) -> &'b [u8] {
        match self {
            HeaderValue::Text(text) => text.as_bytes(),
            HeaderValue::Number(n) => decimal(*n, buf),
        }
    }
}

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

impl Arming {
    /// The request headers that arm Envoy's hedging, in the order to set
    /// them: the per-try timeout (the trigger) last, so that if a write
    /// fails, no header is left that could turn the timeout into a plain
    /// retry that cancels the first attempt. Once they are all set,
    /// `headers::TIMEOUT_ALT_RESPONSE` follows, best effort. `x-envoy-retry-grpc-on` only
    /// for gRPC calls (a client's was removed, unless clients are trusted:
    /// then Envoy still makes at most the `max-retries` attempts set here,
    /// which the budget has paid for).
    pub fn headers(&self) -> impl Iterator<Item = (&'static str, HeaderValue<'_>)> {
        let marker = self
            .first_byte_marker
            .then_some((FIRST_BYTE_MARKER, HeaderValue::Text("1")));
        let grpc = self
            .retry_grpc_on
            .as_deref()
            .filter(|on| !on.is_empty())
            .map(|on| (RETRY_GRPC_ON, HeaderValue::Text(on)));
        let codes = self
            .retriable_status_codes
            .as_deref()
            .map(|codes| (RETRIABLE_STATUS_CODES, HeaderValue::Text(codes)));
        marker.into_iter().chain(grpc).chain(codes).chain([
            // exactly "true": other spellings silently mean a plain retry
            (HEDGE_ON_PER_TRY_TIMEOUT, HeaderValue::Text("true")),
            (
                MAX_RETRIES,
                HeaderValue::Number(u64::from(self.max_retries)),
            ),
            (RETRY_ON, HeaderValue::Text(&self.retry_on)),
            (
                PER_TRY_TIMEOUT,
                HeaderValue::Number(self.per_try_timeout_ms),
            ),
        ])
    }
}

impl Skip {
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::NoCluster => "no_cluster",
            Skip::Untracked => "untracked",
            Skip::Unconfirmed => "unconfirmed",
            Skip::NoWorker => "no_worker",
            Skip::Disabled => "disabled",
            Skip::Method => "method",
            Skip::GrpcMethod => "grpc_method",
            Skip::Upgrade => "upgrade",
            Skip::WarmingUp => "warming_up",
            Skip::ClientControlled => "client_controlled",
            Skip::BudgetExhausted => "budget_exhausted",
            Skip::RouteMetadata => "route_metadata",
            Skip::Paced => "paced",
            Skip::StaleDelay => "stale_delay",
        }
    }
}

impl Decision {
    /// The `x-adaptive-hedge` debug header value: `armed; delay_ms=7; hedges=1`
    /// or `skipped; reason=warming_up`.
    pub fn describe(&self) -> String {
        match self {
            Decision::Arm(a) => format!(
                "{}; delay_ms={}; hedges={}",
                if a.shadow { "shadow" } else { "armed" },
                a.per_try_timeout_ms,
                a.hedges
            ),
            Decision::Skip(s) => format!("skipped; reason={}", s.as_str()),
        }
    }
}

impl Plan {
    /// What to settle when the request ends, if it was armed.
    pub fn settlement(&self) -> Option<Settlement> {
        match (&self.decision, self.cluster) {
            (Decision::Arm(a), Some(cluster)) => Some(Settlement {
                cluster,
                hedges: a.reserved,
                cohort: self.cohort,
                per_try_timeout_ms: a.per_try_timeout_ms,
                shadow: a.shadow,
                deadline_ns: self.deadline_ns,
                sampled: self.sample,
            }),
            _ => None,
        }
    }
}

/// With no host named (no host choice on the cluster), an armed request
/// is held back while `MAX_PAST_DELAY` of the
/// worker's armed requests to the cluster are past their delay, once the
/// delay reads as stale (a brownout: every armed request will fire, and
/// timeouts can come in a row on a host). Not in steady traffic: there
/// the requests past their delay are the stragglers of the moment, as
/// many as the rate makes them, and each host gets new streams between
/// their timeouts. Until 2026-11-29 the rule held in steady traffic too,
/// so the more traffic a worker had the fewer requests it armed, at
/// random, stragglers included: 87% of eligible requests armed at 1,000
/// a second, 73% at 5,000 (a review; the test below).
///
/// Where the cluster chooses hosts and this request was left to the
/// balancer (the exploration share, the one good host held back), the
/// rule holds in steady traffic too: the balancer may send it to the very
/// host the choice is keeping armed attempts from (a review of the change).
fn paced_without_hosts(view: &ClusterView) -> bool {
    view.pacing
        && view.past_delay >= MAX_PAST_DELAY
        && (view.hosts.is_some() || view.armed.is_some_and(ArmedRequests::stale))
}

/// Decides one request. Pure: the worker books what it returns.
pub fn plan(request: &Request, config: &Config, cluster: Cluster) -> Plan {
    let tracked = match cluster {
        Cluster::Tracked(view) => Some(view),
        Cluster::None | Cluster::Untracked | Cluster::Unconfirmed | Cluster::Misconfigured => None,
    };
    let id = tracked.map(|view| view.id);
    let route = tracked.and_then(|view| view.route);
    let learns_hosts = tracked.is_some_and(|view| view.policy.host_choice);
    if config.trust_client_headers && request.client_controls {
        // The operator trusts clients and this one chose for itself: its
        // headers stay, and its latency (shaped by its own retries) is not
        // a sample of the cluster.
        return Plan {
            decision: Decision::Skip(Skip::ClientControlled),
            strip: Strip::trusted(request),
            cluster: id,
            route,
            cohort: 0,
            sample: false,
            hosts: None,
            endpoint: None,
            deadline_ns: None,
            learns_hosts,
        };
    }
    let mut decision = match cluster {
        Cluster::None => Decision::Skip(Skip::NoCluster),
        Cluster::Untracked => Decision::Skip(Skip::Untracked),
        Cluster::Unconfirmed => Decision::Skip(Skip::Unconfirmed),
        Cluster::Misconfigured => Decision::Skip(Skip::RouteMetadata),
        Cluster::Tracked(view) => decide(request, config, &view),
    };
    // A client's own host header stands where clients are trusted.
    let client_chose = config.trust_client_headers && request.client_endpoint;
    // a shadow changes nothing, the host included
    let chooser = tracked
        .filter(|view| view.policy.mode == Mode::Hedge)
        .and_then(|view| Some((view, view.hosts?)))
        .filter(|_| !client_chose);
    // With local-origin errors split, outlier detection counts each fired
    // per-try timeout as a failure (without, the 204 is none): an
    // armed request's hosts avoid those whose timeouts could add up there
    // (see `timeouts`); with no host clear for both attempts the request
    // is not armed (it still goes to its host, whose answer clears the
    // count).
    // Without pacing (nothing to spare, or turned off), a host with
    // timeouts standing is still avoided where another will do: its
    // attempts outlive the delay, the sign of a slow host before its
    // latency is known.
    let held_back = |id: usize| {
        chooser.is_some_and(|(view, known)| {
            let standing = known.timeouts_unanswered(id);
            if !view.pacing {
                return standing >= super::timeouts::STEADY_TIMEOUTS_PER_HOST;
            }
            view.armed.map_or(
                standing >= super::timeouts::STEADY_TIMEOUTS_PER_HOST,
                |armed| armed.held_back(id, standing),
            )
        })
    };
    // A host whose armed attempts keep firing while host choice sends it
    // nothing gets this request: with local-origin errors split, only a
    // new stream resets outlier detection's count (see `timeouts`).
    let choose = |armed: bool, avoid: &dyn Fn(usize) -> bool| {
        chooser.and_then(|(view, hosts)| {
            let stale = view.armed.is_some_and(ArmedRequests::stale);
            let fresh = hosts.needs_fresh_attempt(stale).filter(|_| view.pacing);
            let pick = match fresh {
                // unarmed: its own timeout would be the next local-origin
                // failure there (a 504 in a row where the 204 is not set)
                Some(id) => hosts.pick_with_primary(id, false, 0, avoid),
                None => {
                    hosts.choose_avoiding(view.policy.host_choices, view.random, armed, avoid)?
                }
            };
            Some((pick, hosts.header_value(pick)?))
        })
    };
    let anywhere = |_: usize| false;
    let mut hosts = None;
    if let (Decision::Arm(a), Some(view)) = (&decision, tracked) {
        let avoiding = if a.shadow {
            &anywhere as &dyn Fn(usize) -> bool
        } else {
            &held_back
        };
        hosts = choose(true, avoiding);
        if !view.pacing && hosts.as_ref().is_some_and(|(pick, _)| pick.hedge.is_none()) {
            // every other host avoided: the hedge goes to the best of them
            hosts = choose(true, &anywhere);
        }
        let paced = !a.shadow
            && view.pacing
            && match &hosts {
                Some((pick, _)) => pick.hedge.is_none() || held_back(pick.primary),
                None => paced_without_hosts(&view),
            };
        if paced {
            decision = Decision::Skip(Skip::Paced);
        }
    }
    if !matches!(decision, Decision::Arm(_)) {
        hosts = choose(false, &anywhere);
    }
    let mut strip = match &decision {
        // The client's control headers go, then the armed ones are written
        // (overwriting was not enough: a plain request is armed without
        // `x-envoy-retry-grpc-on`, and the retriable codes are not armed at
        // all); a client's marker goes unless this request is marked anyway.
        Decision::Arm(a) if a.shadow => Strip::client_sent(request),
        Decision::Arm(a) => Strip {
            control: request.client_controls,
            marker: request.client_marker && !a.first_byte_marker,
            endpoint: request.client_endpoint,
        },
        Decision::Skip(_) => Strip::client_sent(request),
    };
    // a chosen host overwrites the client's; a trusted client's stays
    strip.endpoint &= hosts.is_none() && !client_chose;
    let (pick, endpoint) = hosts.unzip();
    let deadline_ns = match (&decision, tracked.and_then(|view| view.now_ns)) {
        (Decision::Arm(a), Some(now)) if !a.shadow && request.timed_from_headers() => {
            Some(now.saturating_add(a.per_try_timeout_ms.saturating_mul(1_000_000)))
        }
        _ => None,
    };
    Plan {
        decision,
        strip,
        cluster: id,
        route,
        cohort: tracked.map_or(0, |view| view.budget.cohort()),
        // A sample costs three host calls (two clocks, the response's
        // origin); past a few hundred per tick the quantile gains nothing.
        sample: tracked
            .is_some_and(|view| view.sample_turn && in_sample_population(request, view.policy)),
        hosts: pick,
        endpoint,
        deadline_ns,
        learns_hosts,
    }
}

/// Whether a request's latency speaks for the requests the delay applies
/// to: only those that could be hedged (an idempotent method, no protocol
/// upgrade). A WebSocket's lifetime, or a slow POST, is not a sample of the
/// latency a GET should be hedged at.
pub fn in_sample_population(request: &Request, policy: &ClusterPolicy) -> bool {
    may_repeat(request, policy) && !request.upgrade
}

/// Whether the request is of a kind the policy lets be sent twice: an
/// idempotent HTTP method, or a listed gRPC method (a gRPC call is a POST
/// whatever it does: its method's name says whether it may be repeated,
/// and only the operator can say that).
fn may_repeat(request: &Request, policy: &ClusterPolicy) -> bool {
    if request.grpc {
        request.method == b"POST" && policy.allows_grpc_method(request.path)
    } else {
        policy.allows_method(request.method)
    }
}

/// The plan for a request no worker can plan (the filter has no worker, or
/// it is busy): not armed, and the client's control headers removed unless
/// clients are trusted.
pub fn unplanned(request: &Request, trust_client_headers: bool) -> Plan {
    let trusted = trust_client_headers && request.client_controls;
    Plan {
        decision: Decision::Skip(if trusted {
            Skip::ClientControlled
        } else {
            Skip::NoWorker
        }),
        strip: if trusted {
            Strip::trusted(request)
        } else {
            Strip::client_sent(request)
        },
        cluster: None,
        route: None,
        cohort: 0,
        sample: false,
        hosts: None,
        endpoint: None,
        deadline_ns: None,
        learns_hosts: false,
    }
}

fn decide(request: &Request, config: &Config, cluster: &ClusterView) -> Decision {
    let policy = cluster.policy;
    if policy.disabled {
        return Decision::Skip(Skip::Disabled);
    }
    if !may_repeat(request, policy) {
        return Decision::Skip(if request.grpc {
            Skip::GrpcMethod
        } else {
            Skip::Method
        });
    }
    // A GET that becomes a WebSocket is a connection, not a request: a
    // second attempt would open a second session with its own state.
    if request.upgrade {
        return Decision::Skip(Skip::Upgrade);
    }
    let Some(delay) = cluster.delay else {
        return Decision::Skip(Skip::WarmingUp);
    };
    // every request armed with it would hedge, on requests all slow alike:
    // the budget is kept for when the delay has caught up
    if cluster.stale_delay {
        return Decision::Skip(Skip::StaleDelay);
    }
    // Envoy has one count for hedges and retries: with the route's own
    // retries kept (`route_retries` above the hedges), an attempt's per-try
    // timeout sends another hedge (at twice the delay, three times...)
    // while the count lasts, so the whole count is paid for, or nothing is
    // armed: before, only the hedges were reserved, and in a stall Istio's
    // default (2) sent twice the budget while the requests ran.
    let shadow = policy.mode == Mode::Shadow;
    let wanted = match shadow {
        true => policy.max_hedges,
        false => policy.max_hedges.max(policy.route_retries),
    };
    let affordable = cluster.budget.affordable(wanted);
    if affordable == 0 || (!shadow && affordable < policy.route_retries) {
        return Decision::Skip(Skip::BudgetExhausted);
    }
    // what it affords is the count (at least `route_retries`), or, in a
    // shadow, the hedges alone
    let hedges = affordable.min(policy.max_hedges);
    Decision::Arm(Arming {
        per_try_timeout_ms: delay.per_try_timeout_ms,
        hedges,
        max_retries: hedges.max(policy.route_retries),
        reserved: affordable,
        retry_on: Arc::clone(&policy.retry_on),
        retriable_status_codes: policy.retriable_codes_header().cloned(),
        retry_grpc_on: request.grpc.then(|| Arc::clone(&policy.grpc_retry_on)),
        first_byte_marker: config.latency_signal == LatencySignal::FirstByte,
        shadow,
        timeouts_as_204: cluster.timeouts_as_204,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::hedge_delay::budget_terms;

    fn funded(policy: &ClusterPolicy) -> LocalBudget {
        let mut b = LocalBudget::new(budget_terms(policy));
        for _ in 0..100 {
            b.earn();
        }
        b
    }

    const DELAY: Option<HedgeDelay> = Some(HedgeDelay {
        delay_us: 7200,
        per_try_timeout_ms: 8,
    });

    const GET: Request = Request {
        method: b"GET",
        path: b"/",
        grpc: false,
        upgrade: false,
        client_controls: false,
        client_marker: false,
        client_endpoint: false,
        body_follows: false,
    };

    /// Plans `request` for a tracked cluster with `policy`, `delay` and
    /// `budget` under `config`.
    fn plan_for(
        request: &Request,
        config: &Config,
        policy: &ClusterPolicy,
        delay: Option<HedgeDelay>,
        budget: &LocalBudget,
    ) -> Plan {
        let view = ClusterView {
            route: None,
            id: 3,
            policy,
            delay,
            budget,
            sample_turn: true,
            hosts: None,
            random: 0,
            now_ns: None,
            past_delay: 0,
            armed: None,
            stale_delay: false,
            pacing: policy.outlier_pacing,
            timeouts_as_204: true,
        };
        plan(request, config, Cluster::Tracked(view))
    }

    fn with_defaults(request: &Request) -> Plan {
        with_policy(request, &ClusterPolicy::default())
    }

    /// The plan under `policy`, the default config, a learned delay and a
    /// funded budget.
    fn with_policy(request: &Request, policy: &ClusterPolicy) -> Plan {
        plan_for(request, &Config::default(), policy, DELAY, &funded(policy))
    }

    /// The headers a plan sets, as text.
    fn set(plan: &Plan) -> Vec<(String, String)> {
        let Decision::Arm(a) = &plan.decision else {
            return Vec::new();
        };
        a.headers()
            .map(|(name, value)| {
                let mut buf = [0u8; 20];
                let bytes = value.bytes(&mut buf).to_vec();
                (name.to_string(), String::from_utf8(bytes).unwrap())
            })
            .collect()
    }

    #[test]
    fn an_armed_get_sets_the_five_router_headers_trigger_last() {
        let p = with_defaults(&GET);
        assert_eq!(
            set(&p),
            [
                ("x-envoy-retriable-status-codes", "429"),
                ("x-envoy-hedge-on-per-try-timeout", "true"),
                ("x-envoy-max-retries", "1"),
                ("x-envoy-retry-on", "5xx,retriable-status-codes"),
                ("x-envoy-upstream-rq-per-try-timeout-ms", "8"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
        assert_eq!(p.strip, Strip::default());
        assert_eq!(p.cluster, Some(3));
        assert!(p.sample);
        assert_eq!(
            p.settlement(),
            Some(Settlement {
                cluster: 3,
                hedges: 1,
                cohort: 0,
                per_try_timeout_ms: 8,
                shadow: false,
                deadline_ns: None,
                sampled: true,
            })
        );
        assert_eq!(p.decision.describe(), "armed; delay_ms=8; hedges=1");
    }

    /// `retriable_status_codes: ""`, or a `retry_on` without
    /// `retriable-status-codes` (Envoy would ignore the codes): no header.
    #[test]
    fn without_retriable_codes_no_codes_header_is_written() {
        for (codes, retry_on) in [("", "5xx,retriable-status-codes"), ("429", "5xx")] {
            let policy = ClusterPolicy {
                retriable_status_codes: codes.into(),
                retry_on: retry_on.into(),
                ..Default::default()
            };
            let p = with_policy(&GET, &policy);
            let names: Vec<String> = set(&p).into_iter().map(|(n, _)| n).collect();
            assert_eq!(
                names,
                [
                    HEDGE_ON_PER_TRY_TIMEOUT,
                    MAX_RETRIES,
                    RETRY_ON,
                    PER_TRY_TIMEOUT
                ],
                "{codes:?} {retry_on:?}"
            );
        }
    }

    #[test]
    fn first_byte_mode_marks_armed_requests_first() {
        let config = Config::parse(br#"{"latency_signal": "first_byte"}"#).unwrap();
        let policy = ClusterPolicy::default();
        let marked_by_client = Request {
            client_marker: true,
            ..GET
        };
        let p = plan_for(&marked_by_client, &config, &policy, DELAY, &funded(&policy));
        let headers = set(&p);
        assert_eq!(headers[0], (FIRST_BYTE_MARKER.to_string(), "1".to_string()));
        assert_eq!(headers.len(), 6);
        assert!(!p.strip.marker, "overwritten, not removed");
        // in headers mode an armed request carries no marker, the client's included
        let p = with_defaults(&marked_by_client);
        assert!(set(&p).iter().all(|(n, _)| n != FIRST_BYTE_MARKER));
        assert!(p.strip.marker);
    }

    #[test]
    fn grpc_calls_are_armed_only_for_listed_methods() {
        let call = |path| Request {
            method: b"POST",
            path,
            grpc: true,
            ..GET
        };
        let policy = ClusterPolicy {
            idempotent_grpc_methods: vec!["/demo.Echo/Get".into(), "/demo.Catalog/".into()],
            ..Default::default()
        };
        let plan = |request: &Request| with_policy(request, &policy);
        for listed in [&b"/demo.Echo/Get"[..], b"/demo.Catalog/List"] {
            let p = plan(&call(listed));
            assert!(matches!(p.decision, Decision::Arm(_)), "{p:?}");
            assert!(p.sample);
            let headers = set(&p);
            assert_eq!(
                headers.first(),
                Some(&(
                    RETRY_GRPC_ON.to_string(),
                    "cancelled,unavailable,resource-exhausted".to_string()
                ))
            );
            assert_eq!(headers.last().map(|h| h.0.as_str()), Some(PER_TRY_TIMEOUT));
        }
        for unlisted in [
            &b"/demo.Echo/Put"[..],
            b"/demo.Echo/GetMore",
            b"/demo.Catalog/",
            b"",
        ] {
            let p = plan(&call(unlisted));
            assert_eq!(p.decision, Decision::Skip(Skip::GrpcMethod));
            assert!(!p.sample, "a call that is never hedged is no sample");
        }
        // a listed method's name on a GET that says it is gRPC: not a call
        let get = Request {
            method: b"GET",
            ..call(b"/demo.Echo/Get")
        };
        assert_eq!(plan(&get).decision, Decision::Skip(Skip::GrpcMethod));
        // with nothing listed (the default) no gRPC call is hedged, and a
        // POST that is not gRPC is still a POST
        let p = with_defaults(&call(b"/demo.Echo/Get"));
        assert_eq!(p.decision, Decision::Skip(Skip::GrpcMethod));
        let post = Request {
            grpc: false,
            ..call(b"/demo.Echo/Get")
        };
        assert_eq!(plan(&post).decision, Decision::Skip(Skip::Method));
        // a plain GET carries no gRPC retry-on
        assert!(set(&with_defaults(&GET))
            .iter()
            .all(|(n, _)| n != RETRY_GRPC_ON));
        // `grpc_retry_on: ""`: armed, with no gRPC retry-on
        let none = ClusterPolicy {
            grpc_retry_on: "".into(),
            ..policy.clone()
        };
        let p = with_policy(&call(b"/demo.Echo/Get"), &none);
        assert!(matches!(p.decision, Decision::Arm(_)), "{p:?}");
        assert!(set(&p).iter().all(|(n, _)| n != RETRY_GRPC_ON), "{p:?}");
    }

    #[test]
    fn only_idempotent_requests_are_armed() {
        for method in [&b"POST"[..], b"PUT", b"PATCH", b"DELETE", b"CONNECT", b""] {
            let p = with_defaults(&Request { method, ..GET });
            assert_eq!(p.decision, Decision::Skip(Skip::Method));
            assert!(set(&p).is_empty());
            assert!(
                !p.sample,
                "its latency is not a sample of hedgeable requests"
            );
            assert_eq!(p.settlement(), None);
        }
        let websocket = Request {
            upgrade: true,
            ..GET
        };
        let p = with_defaults(&websocket);
        assert_eq!(
            p.decision,
            Decision::Skip(Skip::Upgrade),
            "a WebSocket upgrade is a connection: never duplicated"
        );
        assert!(!p.sample, "nor a latency sample");
        let off = ClusterPolicy {
            disabled: true,
            ..Default::default()
        };
        let p = plan_for(&GET, &Config::default(), &off, DELAY, &funded(&off));
        assert_eq!(p.decision, Decision::Skip(Skip::Disabled));
    }

    #[test]
    fn skipped_requests_lose_whatever_control_headers_the_client_sent() {
        let hostile = Request {
            method: b"POST",
            client_controls: true,
            client_marker: true,
            ..GET
        };
        assert_eq!(with_defaults(&hostile).strip, Strip::ARMING);
        // nothing sent, nothing to remove (saves the host calls)
        let plain = Request {
            method: b"POST",
            ..GET
        };
        assert_eq!(with_defaults(&plain).strip, Strip::default());
        // armed: the client's are removed too (arming does not write every
        // one of them), then the armed ones written
        let armed = with_defaults(&Request {
            client_controls: true,
            ..GET
        });
        assert!(matches!(armed.decision, Decision::Arm(_)));
        assert!(armed.strip.control);
        let clean = with_defaults(&GET);
        assert!(matches!(clean.decision, Decision::Arm(_)));
        assert!(!clean.strip.control, "nothing sent, nothing removed");
        // unreadable headers: not armed, everything removed
        let p = with_defaults(&Request::UNREADABLE);
        assert_eq!(p.decision, Decision::Skip(Skip::Method));
        assert_eq!(
            p.strip,
            Strip {
                endpoint: true,
                ..Strip::ARMING
            }
        );
    }

    #[test]
    fn no_cluster_or_untracked_is_never_armed_and_never_sampled() {
        let hostile = Request {
            client_controls: true,
            ..GET
        };
        for (cluster, reason) in [
            (Cluster::None, Skip::NoCluster),
            (Cluster::Untracked, Skip::Untracked),
            (Cluster::Unconfirmed, Skip::Unconfirmed),
        ] {
            let p = plan(&hostile, &Config::default(), cluster);
            assert_eq!(p.decision, Decision::Skip(reason));
            assert_eq!(p.cluster, None);
            assert!(!p.sample);
            assert!(p.strip.control);
        }
    }

    #[test]
    fn a_trusted_client_keeps_its_headers_and_is_not_armed() {
        let config = Config::parse(br#"{"trust_client_headers": true}"#).unwrap();
        let policy = ClusterPolicy::default();
        let own = Request {
            client_controls: true,
            client_marker: true,
            ..GET
        };
        let p = plan_for(&own, &config, &policy, DELAY, &funded(&policy));
        assert_eq!(p.decision, Decision::Skip(Skip::ClientControlled));
        // but for the first-byte marker: the filter's own
        let marker_only = Strip {
            marker: true,
            ..Strip::default()
        };
        assert_eq!(p.strip, marker_only);
        assert!(!p.sample);
        assert_eq!(p.cluster, Some(3), "still counted for its cluster");
        // a trusted client that sent nothing is armed as usual
        let p = plan_for(&GET, &config, &policy, DELAY, &funded(&policy));
        assert!(matches!(p.decision, Decision::Arm(_)));
    }

    #[test]
    fn warming_up_and_sample_turns() {
        let policy = ClusterPolicy::default();
        let budget = funded(&policy);
        let p = plan_for(&GET, &Config::default(), &policy, None, &budget);
        assert_eq!(p.decision, Decision::Skip(Skip::WarmingUp));
        assert_eq!(p.decision.describe(), "skipped; reason=warming_up");
        assert!(p.sample);
        let view = ClusterView {
            route: None,
            id: 0,
            policy: &policy,
            delay: DELAY,
            budget: &budget,
            sample_turn: false,
            hosts: None,
            random: 0,
            now_ns: None,
            past_delay: 0,
            armed: None,
            stale_delay: false,
            pacing: true,
            timeouts_as_204: true,
        };
        let p = plan(&GET, &Config::default(), Cluster::Tracked(view));
        assert!(!p.sample, "no slot left this tick");
        assert!(matches!(p.decision, Decision::Arm(_)));
    }

    #[test]
    fn no_token_no_hedge() {
        let policy = ClusterPolicy {
            max_hedges: 3,
            ..Default::default()
        };
        let mut b = LocalBudget::new(budget_terms(&policy));
        let delay = Some(HedgeDelay {
            delay_us: 1000,
            per_try_timeout_ms: 1,
        });
        let p = plan_for(&GET, &Config::default(), &policy, delay, &b);
        assert_eq!(p.decision, Decision::Skip(Skip::BudgetExhausted));
        assert_eq!(p.settlement(), None);
        for _ in 0..25 {
            b.earn();
        }
        // 2.5 tokens: two of the three hedges are paid for
        let p = plan_for(&GET, &Config::default(), &policy, delay, &b);
        assert_eq!(set(&p)[2], ("x-envoy-max-retries".into(), "2".into()));
        assert_eq!(p.settlement().map(|s| s.hedges), Some(2));
    }

    #[test]
    fn numbers_are_written_in_decimal() {
        let mut buf = [0u8; 20];
        for n in [0, 7, 10, 12_345, u64::MAX] {
            assert_eq!(
                HeaderValue::Number(n).bytes(&mut buf),
                n.to_string().as_bytes()
            );
        }
    }

    /// Three hosts measured, the third far slower (on probation).
    fn three_hosts() -> Hosts {
        let mut hosts = Hosts::default();
        for (address, us) in [("a:1", 1000.0), ("b:1", 1200.0), ("c:1", 30_000.0)] {
            let id = hosts.find_or_add(address.as_bytes()).unwrap();
            for _ in 0..20 {
                hosts.observe(id, us);
            }
        }
        let mut shared = Vec::new();
        hosts.merge_into(&mut shared, 1_000, None);
        hosts.refresh(&shared, None);
        hosts
    }

    /// A tracked cluster's view with a learned delay and a funded budget,
    /// no hosts, no clock.
    fn view_of<'a>(policy: &'a ClusterPolicy, budget: &'a LocalBudget) -> ClusterView<'a> {
        ClusterView {
            route: None,
            id: 3,
            policy,
            delay: DELAY,
            budget,
            sample_turn: true,
            hosts: None,
            random: 0,
            now_ns: None,
            past_delay: 0,
            armed: None,
            stale_delay: false,
            pacing: policy.outlier_pacing,
            timeouts_as_204: true,
        }
    }

    fn with_hosts(request: &Request, config: &Config, hosts: &Hosts, random: u64) -> Plan {
        with_hosts_armed(request, config, hosts, random, None)
    }

    /// `with_hosts`, with the worker's armed requests to the cluster.
    fn with_hosts_armed(
        request: &Request,
        config: &Config,
        hosts: &Hosts,
        random: u64,
        armed: Option<&ArmedRequests>,
    ) -> Plan {
        let policy = (*config.defaults).clone();
        let budget = funded(&policy);
        let view = ClusterView {
            hosts: Some(hosts),
            random,
            armed,
            ..view_of(&policy, &budget)
        };
        plan(request, config, Cluster::Tracked(view))
    }

    /// A host with a per-try timeout standing (fired, no success since) is
    /// not sent an armed request: outlier detection (with local-origin
    /// errors split) would count the next as a second failure in a row.
    /// Its requests still go to a host.
    #[test]
    fn no_armed_request_goes_to_a_host_with_two_timeouts_standing() {
        // a and b are eligible (c is on probation)
        let mut hosts = three_hosts();
        let random = u64::MAX / 3;
        let p = with_hosts(&GET, &Config::default(), &hosts, random);
        let (Decision::Arm(_), Some(pick)) = (&p.decision, p.hosts) else {
            panic!("{p:?}");
        };
        let hedge = pick.hedge.unwrap();
        // one timeout standing: a straggler's, cleared by the next answer;
        // once this worker started another attempt there (the fresh one
        // below), armed requests may go there again
        hosts.timed_out(hedge, 10);
        hosts.attempt_started(hedge, 15);
        let p = with_hosts(&GET, &Config::default(), &hosts, random);
        assert!(matches!(p.decision, Decision::Arm(_)), "{p:?}");
        // a second: this worker's next attempt there started since (the
        // count outlier detection keeps with the split is reset), the one
        // kept without it is not
        hosts.timed_out(hedge, 20);
        hosts.attempt_started(hedge, 30);
        let p = with_hosts(&GET, &Config::default(), &hosts, random);
        assert_eq!(p.decision, Decision::Skip(Skip::Paced));
        assert_eq!(
            p.hosts.map(|h| (h.primary, h.hedge)),
            Some((pick.primary, None))
        );
        assert_eq!(p.settlement(), None);
        // the primary's host held back: no pair clear, not armed (it goes
        // to a host as any unarmed request, its answer clears the count)
        hosts.answered_upstream(hedge);
        hosts.timed_out(pick.primary, 40);
        hosts.attempt_started(pick.primary, 45);
        hosts.timed_out(pick.primary, 50);
        let p = with_hosts(&GET, &Config::default(), &hosts, random);
        assert_eq!(p.decision, Decision::Skip(Skip::Paced));
        assert_eq!(p.hosts.and_then(|h| h.hedge), None);
        hosts.answered_upstream(pick.primary);
        let p = with_hosts(&GET, &Config::default(), &hosts, random);
        assert!(matches!(p.decision, Decision::Arm(_)));
    }

    /// Once the delay is stale (a brownout), a host whose armed attempt of
    /// this worker fired since the worker last started one there gets the
    /// next request: with local-origin errors split only a new stream
    /// resets outlier detection's count. Unarmed (its own timeout would be
    /// the next failure in a row there); once: the attempt
    /// named there resets what this worker counts. Not in steady traffic.
    #[test]
    fn in_a_brownout_a_host_whose_attempts_fired_gets_a_fresh_attempt() {
        const MS: u64 = 1_000_000;
        let mut hosts = three_hosts();
        let random = u64::MAX / 3;
        let steady = ArmedRequests::default();
        let pick = with_hosts(&GET, &Config::default(), &hosts, random)
            .hosts
            .unwrap();
        let other = (0..2).find(|&id| id != pick.primary).unwrap();
        // steady: a timeout on a host leaves the choice to host choice
        hosts.timed_out(other, 10);
        let p = with_hosts_armed(&GET, &Config::default(), &hosts, random, Some(&steady));
        assert!(matches!(p.decision, Decision::Arm(_)), "{p:?}");
        assert_eq!(p.hosts, Some(pick));
        // a brownout: primaries fire one after another (their hedges
        // start on `other`)
        let mut stale = ArmedRequests::default();
        for i in 0..3 {
            stale.armed((20 + i) * MS, 10 * MS, Some(pick));
        }
        stale.fire(23 * MS, &mut hosts);
        assert!(stale.stale());
        let p = with_hosts_armed(&GET, &Config::default(), &hosts, random, Some(&stale));
        assert_eq!(p.decision, Decision::Skip(Skip::Paced));
        assert_eq!(
            p.hosts.map(|h| (h.primary, h.hedge)),
            Some((pick.primary, None)),
            "three fired there"
        );
        hosts.attempt_started(pick.primary, 24 * MS);
        hosts.timed_out(other, 24 * MS);
        let p = with_hosts_armed(&GET, &Config::default(), &hosts, random, Some(&stale));
        assert_eq!(p.hosts.map(|h| (h.primary, h.hedge)), Some((other, None)));
        // once: the attempt named there resets this worker's count
        hosts.attempt_started(other, 25 * MS);
        let p = with_hosts_armed(&GET, &Config::default(), &hosts, random, Some(&stale));
        assert_eq!(p.hosts.map(|h| h.primary), Some(pick.primary));
        // a timeout that fired before that attempt started was reset by it
        hosts.timed_out(other, 24 * MS + 500_000);
        let p = with_hosts_armed(&GET, &Config::default(), &hosts, random, Some(&stale));
        assert_eq!(p.hosts.map(|h| h.primary), Some(pick.primary));
        // without the pacing rule, nothing of the kind
        hosts.timed_out(other, 30 * MS);
        let config = Config::parse(br#"{"outlier_pacing": false}"#).unwrap();
        let p = with_hosts_armed(&GET, &config, &hosts, random, Some(&stale));
        assert_ne!(p.hosts.map(|h| h.primary), Some(other));
        let p = with_hosts_armed(&GET, &Config::default(), &hosts, random, Some(&stale));
        assert_eq!(p.hosts.map(|h| h.primary), Some(other));
    }

    #[test]
    fn without_outlier_pacing_timeouts_standing_hold_nothing_back() {
        let mut hosts = three_hosts();
        let random = u64::MAX / 3;
        let config = Config::parse(br#"{"outlier_pacing": false}"#).unwrap();
        let pick = with_hosts(&GET, &config, &hosts, random).hosts.unwrap();
        for t in 0..5 {
            hosts.timed_out(pick.primary, t);
            hosts.timed_out(pick.hedge.unwrap(), t);
        }
        let p = with_hosts(&GET, &config, &hosts, random);
        assert!(matches!(p.decision, Decision::Arm(_)), "{p:?}");
        assert_eq!(p.hosts, Some(pick));
    }

    /// The timeouts' 204 is asked for as the cluster's view says (not where
    /// Envoy's admin interface says no outlier detector reads the code).
    #[test]
    fn the_timeouts_204_is_asked_for_as_the_view_says() {
        let policy = ClusterPolicy::default();
        let budget = funded(&policy);
        for asks in [true, false] {
            let view = ClusterView {
                timeouts_as_204: asks,
                ..view_of(&policy, &budget)
            };
            let p = plan(&GET, &Config::default(), Cluster::Tracked(view));
            let Decision::Arm(arming) = p.decision else {
                panic!("not armed: {p:?}")
            };
            assert_eq!(arming.timeouts_as_204, asks);
        }
    }

    /// A delay known stale arms nothing (the budget waits for the window).
    #[test]
    fn a_stale_delay_arms_nothing() {
        let policy = ClusterPolicy::default();
        let budget = funded(&policy);
        let view = ClusterView {
            stale_delay: true,
            ..view_of(&policy, &budget)
        };
        let p = plan(&GET, &Config::default(), Cluster::Tracked(view));
        assert_eq!(p.decision, Decision::Skip(Skip::StaleDelay));
        assert!(p.sample, "still a latency sample");
    }

    /// Without hosts named, once the delay is stale a worker arms only
    /// while fewer than two of its armed requests to the cluster have a
    /// timeout fired; in steady traffic any number may be past it.
    #[test]
    fn without_host_choice_two_timeouts_fired_pace_a_stale_cluster() {
        let policy = ClusterPolicy::default();
        let budget = funded(&policy);
        const MS: u64 = 1_000_000;
        let mut stale = ArmedRequests::default();
        for i in 0..3 {
            stale.armed((20 + i) * MS, 10 * MS, None);
        }
        stale.fire(23 * MS, &mut Hosts::default());
        assert!(stale.stale());
        let steady = ArmedRequests::default();
        let view = |past_delay, armed| ClusterView {
            now_ns: Some(1_000_000),
            past_delay,
            armed: Some(armed),
            ..view_of(&policy, &budget)
        };
        let one = plan(&GET, &Config::default(), Cluster::Tracked(view(1, &stale)));
        assert!(matches!(one.decision, Decision::Arm(_)));
        assert_eq!(one.deadline_ns, Some(1_000_000 + 8_000_000));
        let two = plan(&GET, &Config::default(), Cluster::Tracked(view(2, &stale)));
        assert_eq!(two.decision, Decision::Skip(Skip::Paced));
        assert_eq!(two.deadline_ns, None);
        let many = plan(
            &GET,
            &Config::default(),
            Cluster::Tracked(view(40, &steady)),
        );
        assert!(matches!(many.decision, Decision::Arm(_)), "{many:?}");
        // a cluster that chooses hosts, this request left to its balancer
        // (no host known yet here): paced in steady traffic too
        let unknown = Hosts::default();
        let left = ClusterView {
            hosts: Some(&unknown),
            ..view(2, &steady)
        };
        let p = plan(&GET, &Config::default(), Cluster::Tracked(left));
        assert_eq!((p.decision, p.hosts), (Decision::Skip(Skip::Paced), None));
    }

    /// Steady traffic to a cluster without host choice, paced for outlier
    /// detection: 6% stragglers (40 ms, hedged at a 20 ms delay and done
    /// 10 ms after it), the rest 10 ms. However busy the worker, nearly
    /// every eligible request is armed (before: 87% at 1,000 a second, 73%
    /// at 5,000, the refused ones at random, stragglers included); and in
    /// a brownout (every request 100 ms) the pacing still holds most back.
    #[test]
    fn without_host_choice_a_busy_worker_arms_its_steady_traffic() {
        use super::super::timeouts::Ended;
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let policy = ClusterPolicy::default();
        let budget = funded(&policy);
        let armed_share = |per_second: u64, brownout: bool| {
            let mut hosts = Hosts::default();
            let mut armed = ArmedRequests::new(0.06);
            let gap = 1_000_000_000 / per_second;
            let delay = 20_000_000u64;
            let mut ends: BinaryHeap<Reverse<(u64, u64, u64)>> = BinaryHeap::new();
            let (mut eligible, mut armed_count) = (0u64, 0u64);
            for i in 0..(per_second * 4) {
                let now = 1_000_000_000 + i * gap;
                while let Some(&Reverse((end, deadline, attempts))) = ends.peek() {
                    if end > now {
                        break;
                    }
                    ends.pop();
                    armed.ended(deadline, Some(attempts), Ended::At(end), &mut hosts);
                }
                let past_delay = armed.fire(now, &mut hosts);
                let view = ClusterView {
                    now_ns: Some(now),
                    past_delay,
                    armed: Some(&armed),
                    ..view_of(&policy, &budget)
                };
                let p = plan(&GET, &Config::default(), Cluster::Tracked(view));
                let counted = i >= per_second;
                eligible += u64::from(counted);
                if !matches!(p.decision, Decision::Arm(_)) {
                    continue;
                }
                armed_count += u64::from(counted);
                let latency = match (brownout, i % 100 < 6) {
                    (true, _) => 100_000_000,
                    (false, true) => 40_000_000,
                    (false, false) => 10_000_000,
                };
                let deadline = armed.armed(now + delay, delay, None);
                let (end, attempts) = match latency > delay {
                    true => (now + latency.min(delay + 10_000_000), 2),
                    false => (now + latency, 1),
                };
                ends.push(Reverse((end, deadline, attempts)));
            }
            armed_count as f64 / eligible as f64
        };
        for per_second in [50, 1_000, 5_000] {
            let share = armed_share(per_second, false);
            assert!(share > 0.99, "{per_second} a second: {share:.3} armed");
        }
        let share = armed_share(1_000, true);
        assert!(share < 0.5, "a brownout: {share:.3} armed");
    }

    /// A GET whose body follows its headers is armed (Envoy buffers the
    /// body for the hedge), but Envoy's per-try timer starts only once the
    /// body is in: no deadline counted from the headers. Still a latency
    /// sample. A unary gRPC call's message comes at once.
    #[test]
    fn a_request_with_a_body_keeps_no_deadline() {
        let policy = ClusterPolicy {
            idempotent_grpc_methods: vec!["/demo.Echo/Get".into()],
            ..Default::default()
        };
        let budget = funded(&policy);
        let view = || ClusterView {
            now_ns: Some(1_000_000),
            ..view_of(&policy, &budget)
        };
        let search = Request {
            body_follows: true,
            ..GET
        };
        let p = plan(&search, &Config::default(), Cluster::Tracked(view()));
        assert!(matches!(p.decision, Decision::Arm(_)), "{p:?}");
        assert_eq!(p.deadline_ns, None);
        assert!(p.sample, "a cluster of such requests must still learn");
        let call = Request {
            method: b"POST",
            path: b"/demo.Echo/Get",
            grpc: true,
            body_follows: true,
            ..GET
        };
        let p = plan(&call, &Config::default(), Cluster::Tracked(view()));
        assert!(matches!(p.decision, Decision::Arm(_)), "{p:?}");
        assert_eq!(p.deadline_ns, Some(1_000_000 + 8_000_000));
        assert!(p.sample);
    }

    #[test]
    fn an_armed_request_names_its_host_then_the_hedge_s() {
        let hosts = three_hosts();
        // a random number past the exploration share
        let p = with_hosts(&GET, &Config::default(), &hosts, u64::MAX / 3);
        assert!(matches!(p.decision, Decision::Arm(_)));
        let endpoint = p.endpoint.unwrap();
        let names: Vec<&str> = endpoint.split(',').collect();
        assert_eq!(names.len(), 2, "{endpoint}");
        assert_ne!(names[0], names[1]);
        assert!(!endpoint.contains("c:1"), "the slow host is on probation");
        // not armed (a POST): its host only, no hedge
        let post = Request {
            method: b"POST",
            ..GET
        };
        let p = with_hosts(&post, &Config::default(), &hosts, u64::MAX / 3);
        assert_eq!(p.hosts.unwrap().hedge, None);
        assert!(!p.endpoint.unwrap().contains(','));
        // the exploration share: the cluster's balancer chooses
        let p = with_hosts(&GET, &Config::default(), &hosts, 0);
        assert_eq!((p.hosts, p.endpoint), (None, None));
    }

    #[test]
    fn a_client_s_host_header_never_chooses_unless_clients_are_trusted() {
        let hosts = three_hosts();
        let sent = Request {
            client_endpoint: true,
            body_follows: false,
            ..GET
        };
        // overwritten by the choice; removed when there is none
        let p = with_hosts(&sent, &Config::default(), &hosts, u64::MAX / 3);
        assert!(p.endpoint.is_some() && !p.strip.endpoint);
        let p = with_hosts(&sent, &Config::default(), &hosts, 0);
        assert!(p.endpoint.is_none() && p.strip.endpoint);
        assert!(with_defaults(&sent).strip.endpoint);
        // trusted: the client's stands, no choice of the filter's
        let trusting = Config::parse(br#"{"trust_client_headers": true}"#).unwrap();
        let p = with_hosts(&sent, &trusting, &hosts, u64::MAX / 3);
        assert!(p.endpoint.is_none() && !p.strip.endpoint);
        assert!(matches!(p.decision, Decision::Arm(_)));
    }
}

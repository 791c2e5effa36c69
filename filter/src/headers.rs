//! The HTTP header names the filter reads, writes and removes. Depends on
//! nothing else in the crate.

/// Envoy's router: the per-try timeout, which is the hedge trigger.
pub const PER_TRY_TIMEOUT: &str = "x-envoy-upstream-rq-per-try-timeout-ms";
/// Envoy's router: a per-try timeout starts a hedge instead of cancelling
/// the attempt. Exactly `true`: other spellings silently mean a plain retry.
pub const HEDGE_ON_PER_TRY_TIMEOUT: &str = "x-envoy-hedge-on-per-try-timeout";
/// Envoy's router: extra attempts allowed (the hedges paid for).
pub const MAX_RETRIES: &str = "x-envoy-max-retries";
/// Envoy's router: without a retry-on value the per-try timeout does nothing.
pub const RETRY_ON: &str = "x-envoy-retry-on";
pub const RETRY_GRPC_ON: &str = "x-envoy-retry-grpc-on";
/// Envoy's router: a timeout counts as a 204, not a 504. Set (to `true`) on
/// armed requests once their arming headers are, best effort, so that a
/// hedge's per-try timeout is no failure to outlier detection
/// (docs/design.md, "Outlier detection"); the route timeout's reply, a 204
/// then, is turned back into a 504 by the filter.
pub const TIMEOUT_ALT_RESPONSE: &str = "x-envoy-upstream-rq-timeout-alt-response";

/// Envoy's router: status codes and response headers that count as
/// retriable where the route's `retry_on` has `retriable-status-codes` or
/// `retriable-headers` (Istio's default has the first): a client's
/// `x-envoy-retriable-status-codes: 200` on an armed request would have
/// every success retried, on the cluster's budget.
pub const RETRIABLE_STATUS_CODES: &str = "x-envoy-retriable-status-codes";
pub const RETRIABLE_HEADER_NAMES: &str = "x-envoy-retriable-header-names";

/// Every request header that can make Envoy send more than one attempt,
/// and the timeouts' 204 (a client's would turn its timeouts into
/// successes to outlier detection, which the operator's ejections then
/// miss). A client never sets them: the filter removes each one it sent
/// (then writes its own on an armed request).
pub const CONTROL_HEADERS: [&str; 8] = [
    PER_TRY_TIMEOUT,
    HEDGE_ON_PER_TRY_TIMEOUT,
    MAX_RETRIES,
    RETRY_ON,
    RETRY_GRPC_ON,
    RETRIABLE_STATUS_CODES,
    RETRIABLE_HEADER_NAMES,
    TIMEOUT_ALT_RESPONSE,
];

/// Set by the downstream role on the requests it arms when `latency_signal`
/// is `first_byte`; the upstream role holds only marked attempts' headers.
/// Removed from anything a client sends.
pub const FIRST_BYTE_MARKER: &str = "x-adaptive-hedge-first-byte";

/// Response header with the filter's decision, when `debug_header` is on.
pub const DEBUG_HEADER: &str = "x-adaptive-hedge";

/// The request header Envoy's `override_host` load-balancing policy reads
/// (Gateway API Inference Extension's name): `primary[,hedge]` host
/// addresses, one per attempt. Not `x-envoy-*`, so Envoy does not remove a
/// client's copy: the filter does (or overwrites it).
pub const ENDPOINT_HEADER: &str = "x-gateway-destination-endpoint";

/// Envoy's router adds it to every response it relays from an upstream
/// (unless `suppress_envoy_headers`), never to a local reply: its presence
/// says the response came from an upstream without a second host call.
pub const UPSTREAM_SERVICE_TIME: &str = "x-envoy-upstream-service-time";

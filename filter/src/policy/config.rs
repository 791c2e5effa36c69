//! Plugin configuration: parsed with serde, validated once into an immutable
//! [`Config`] that every request shares. Every error names the field, the
//! value and the rule, so an operator can fix a rejected config from the log.
//!
//! Each setting is declared once, in the `settings!` list below: its type,
//! default and rule. The raw (all-optional) forms serde reads, the merge of a
//! cluster override over the defaults, and the effective config logged at
//! start-up all come from that list; the README's table is checked against
//! it (`tests::readme_lists_every_setting_with_its_default`).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use serde::de::{Error as _, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::duration::{format_duration, parse_duration};
use super::shared_state::{MAX_CLUSTER_NAME, MAX_ROUTES, MAX_TRACKED_CLUSTERS};
use super::window::{SAMPLES_PER_TICK, SLICES};
use crate::headers::{DEBUG_HEADER, ENDPOINT_HEADER, FIRST_BYTE_MARKER};
use crate::route_metadata::Kind;

/// Which moment of the response is the latency sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LatencySignal {
    /// Response headers: right for ordinary request/response APIs.
    Headers,
    /// First body chunk: time to first token for streaming upstreams.
    FirstByte,
}

/// What the filter does with the requests it would arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Arm Envoy's hedging.
    Hedge,
    /// Learn and decide, never arm (nor choose a host): the metrics say
    /// what hedging would have done. The safe way to try the filter.
    Shadow,
}

/// Which filter chain this instance of the module sits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The HTTP connection manager's chain, before the router: learns the
    /// delay and arms Envoy's hedging (everything but the first-byte hold).
    Downstream,
    /// A cluster's upstream chain (`HttpProtocolOptions.http_filters`): one
    /// context per attempt; holds a marked attempt's 2xx response headers
    /// until its first body byte, so the router races attempts on it.
    Upstream,
}

/// A duration written as text in the config ("5ms", "2s").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TextDuration(pub Duration);

impl Deref for TextDuration {
    type Target = Duration;
    fn deref(&self) -> &Duration {
        &self.0
    }
}

impl<'de> Deserialize<'de> for TextDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text)
            .map(TextDuration)
            .map_err(serde::de::Error::custom)
    }
}

impl Serialize for TextDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(self.0))
    }
}

const fn millis(ms: u64) -> TextDuration {
    TextDuration(Duration::from_millis(ms))
}

/// Envoy `x-envoy-retry-on` values; anything else would be ignored by Envoy,
/// and with no valid retry-on the per-try timeout (the hedge trigger) does nothing.
const RETRY_ON_VALUES: &[&str] = &[
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "envoy-ratelimited",
    "retriable-4xx",
    "refused-stream",
    "retriable-status-codes",
    "retriable-headers",
    "http3-post-connect-failure",
];

/// Methods that RFC 9110 does not promise are safe to repeat.
const NON_IDEMPOTENT_METHODS: &[&str] = &["POST", "PATCH"];

/// A rule: the value as accepted (possibly normalised), or why it is not.
type Rule<T> = fn(T) -> Result<T, String>;

fn within<T: PartialOrd + fmt::Display + Copy>(
    value: T,
    low: T,
    high: T,
    what: &str,
) -> Result<T, String> {
    if value >= low && value <= high {
        Ok(value)
    } else {
        Err(format!("must be between {low} and {high}{what}"))
    }
}

fn duration_within(
    value: TextDuration,
    low: Duration,
    high: Duration,
) -> Result<TextDuration, String> {
    if *value >= low && *value <= high {
        Ok(value)
    } else {
        Err(format!(
            "must be between {} and {}",
            format_duration(low),
            format_duration(high)
        ))
    }
}

fn percentile_rule(q: f64) -> Result<f64, String> {
    if q > 0.0 && q < 1.0 {
        Ok(q)
    } else {
        Err("must be strictly between 0 and 1 (0.9 = p90)".into())
    }
}

/// The least `budget_percent`: a request earns a millionth of a token
/// (the budget's unit) at it; below, nothing would be earned or armed.
const MIN_BUDGET_PERCENT: f64 = 0.0001;

fn budget_percent_rule(pct: f64) -> Result<f64, String> {
    if (MIN_BUDGET_PERCENT..=100.0).contains(&pct) {
        Ok(pct)
    } else {
        Err(format!(
            "must be between {MIN_BUDGET_PERCENT} and 100 (a request earns at least a millionth of a token)"
        ))
    }
}

fn min_delay_rule(d: TextDuration) -> Result<TextDuration, String> {
    if *d >= Duration::from_millis(1) {
        Ok(d)
    } else {
        Err("must be at least 1ms (Envoy's per-try timeout has millisecond resolution)".into())
    }
}

/// The longest `max_delay`, and its default.
const MAX_DELAY_BOUND: Duration = Duration::from_secs(300);

fn max_delay_rule(d: TextDuration) -> Result<TextDuration, String> {
    if *d <= MAX_DELAY_BOUND {
        Ok(d)
    } else {
        Err("must be at most 5m".into())
    }
}

fn methods_rule(methods: Vec<String>) -> Result<Vec<String>, String> {
    if methods.is_empty() {
        return Err(
            "must list at least one method (use \"disabled\": true to turn hedging off)".into(),
        );
    }
    // An HTTP token (RFC 9110, 5.6.2) without lower-case letters: methods
    // are case-sensitive, so "get" would match nothing a client sends, and
    // tokens such as M-SEARCH or VERSION-CONTROL hold '-'.
    let method_byte =
        |b: u8| b.is_ascii_uppercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b);
    for m in &methods {
        if !m.bytes().any(|b| b.is_ascii_uppercase()) || !m.bytes().all(method_byte) {
            return Err(format!(
                "\"{m}\": methods are upper-case tokens such as \"GET\" or \"M-SEARCH\""
            ));
        }
        if m == "CONNECT" {
            return Err("a CONNECT tunnel cannot be duplicated".into());
        }
    }
    Ok(methods)
}

/// A comma-separated list of values from `allowed` (`what`: whose), with
/// the spaces around them taken out.
fn comma_list(list: &str, allowed: &[&str], what: &str) -> Result<Arc<str>, String> {
    let values: Vec<&str> = list.split(',').map(str::trim).collect();
    if values.iter().any(|v| !allowed.contains(v)) {
        return Err(format!(
            "must be a comma-separated list of {what} values ({})",
            allowed.join(", ")
        ));
    }
    Ok(values.join(",").into())
}

fn retry_on_rule(retry_on: Arc<str>) -> Result<Arc<str>, String> {
    comma_list(&retry_on, RETRY_ON_VALUES, "Envoy retry-on")
}

/// HTTP statuses, comma-separated (`x-envoy-retriable-status-codes`); may
/// be empty.
fn status_codes_rule(codes: Arc<str>) -> Result<Arc<str>, String> {
    if codes.trim().is_empty() {
        return Ok("".into());
    }
    let mut out = Vec::new();
    for code in codes.split(',').map(str::trim) {
        match code.parse::<u16>() {
            Ok(n) if (100..=599).contains(&n) => out.push(n.to_string()),
            _ => {
                return Err(
                    "must be a comma-separated list of HTTP status codes (100 to 599), or \"\""
                        .into(),
                )
            }
        }
    }
    Ok(out.join(",").into())
}

/// The gRPC statuses Envoy can retry on (`x-envoy-retry-grpc-on`).
const GRPC_RETRY_ON_VALUES: &[&str] = &[
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
];

/// May be empty: armed gRPC calls then get no `x-envoy-retry-grpc-on`, and
/// any gRPC status ends the race (the route's own `retry_on` still applies).
fn grpc_retry_on_rule(retry_on: Arc<str>) -> Result<Arc<str>, String> {
    if retry_on.trim().is_empty() {
        return Ok("".into());
    }
    comma_list(&retry_on, GRPC_RETRY_ON_VALUES, "Envoy gRPC retry-on")
        .map_err(|e| format!("{e}, or \"\""))
}

/// `/package.Service/Method` or `/package.Service/`: the `:path` of a gRPC
/// call, or the prefix of a whole service's.
fn grpc_methods_rule(methods: Vec<String>) -> Result<Vec<String>, String> {
    let part = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
    for m in &methods {
        let ok = m
            .strip_prefix('/')
            .and_then(|rest| rest.split_once('/'))
            .is_some_and(|(service, method)| part(service) && (method.is_empty() || part(method)));
        if !ok {
            return Err(format!(
                "\"{m}\": gRPC methods are written \"/package.Service/Method\", or \"/package.Service/\" for all of a service's"
            ));
        }
    }
    Ok(methods)
}

fn host_header_rule(name: Arc<str>) -> Result<Arc<str>, String> {
    let token = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_';
    if name.is_empty() || !name.bytes().all(token) {
        return Err("must be a lower-case header name (letters, digits, '-', '_')".into());
    }
    if *name == *FIRST_BYTE_MARKER || *name == *DEBUG_HEADER {
        return Err("is one of the filter's own headers".into());
    }
    if name.starts_with("x-envoy-") {
        return Err("x-envoy-* headers are Envoy's own; the override_host policy reads another (x-gateway-destination-endpoint)".into());
    }
    // The filter removes a client's value of this header and writes the
    // chosen host into it: a header clients send for other reasons would
    // lose its value on every request (`authorization`, say).
    const STANDARD: &[&str] = &[
        "host",
        "authorization",
        "cookie",
        "connection",
        "upgrade",
        "te",
        "trailer",
        "transfer-encoding",
        "keep-alive",
        "expect",
        "range",
        "referer",
        "origin",
        "user-agent",
        "forwarded",
        "via",
        "x-request-id",
        "traceparent",
        "tracestate",
        "baggage",
        "b3",
        "x-real-ip",
    ];
    const STANDARD_PREFIXES: &[&str] = &[
        "content-",
        "accept",
        "proxy-",
        "x-forwarded-",
        "grpc-",
        "if-",
        "sec-",
        "cache-",
        "x-b3-",
        "x-amzn-",
        "x-cloud-trace-",
    ];
    if STANDARD.contains(&&*name) || STANDARD_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return Err("is a header clients send for other reasons, whose value the filter would remove or overwrite on every request; name one of its own (the override_host policy's, x-gateway-destination-endpoint by default)".into());
    }
    Ok(name)
}

/// `admin_cluster`'s default: the cluster to Envoy's admin interface that
/// the bootstraps of Istio's proxies (pilot-agent's template: sidecars,
/// gateways, waypoints) and of Envoy Gateway's declare. So the filter reads
/// the hosts' health and the outlier settings there with no configuration;
/// a plain Envoy without it is simply not read.
pub const DEFAULT_ADMIN_CLUSTER: &str = "prometheus_stats";

fn admin_cluster_rule(name: Arc<str>) -> Result<Arc<str>, String> {
    if name.len() > MAX_CLUSTER_NAME || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "must be a cluster's name (at most {MAX_CLUSTER_NAME} bytes, no spaces), or \"\" not to read the admin interface"
        ));
    }
    Ok(name)
}

/// The type a setting's value takes, for reading it from route metadata
/// (where Envoy leaves the types out; see `route_metadata`).
trait SettingKind {
    const KIND: Kind;
}

macro_rules! setting_kind {
    ($kind:ident: $($t:ty),*) => {
        $(impl SettingKind for $t {
            const KIND: Kind = Kind::$kind;
        })*
    };
}

setting_kind!(Bool: bool);
setting_kind!(Number: f64, u32, u64, usize);
setting_kind!(Text: Arc<str>, TextDuration, Mode);
setting_kind!(TextList: Vec<String>);

/// Declares the settings: per-cluster ones (`policy`, also allowed in a
/// `clusters.<name>` override) and plugin-wide ones (`global`), each as
/// `name: type = default, rule;`.
macro_rules! settings {
    (
        policy { $($(#[$pdoc:meta])* $pf:ident: $pt:ty = $pdefault:expr, $prule:expr;)* }
        global { $($(#[$gdoc:meta])* $gf:ident: $gt:ty = $gdefault:expr, $grule:expr;)* }
    ) => {
        /// How the hedging of one upstream cluster behaves (the defaults, or
        /// a cluster's override merged over them).
        #[derive(Clone, Debug, PartialEq, Serialize)]
        pub struct ClusterPolicy {
            $($(#[$pdoc])* pub $pf: $pt,)*
        }

        impl Default for ClusterPolicy {
            fn default() -> Self {
                ClusterPolicy { $($pf: $pdefault,)* }
            }
        }

        /// The validated configuration of one plugin instance.
        #[derive(Clone, Debug)]
        pub struct Config {
            pub role: Role,
            pub defaults: Arc<ClusterPolicy>,
            pub clusters: HashMap<String, Arc<ClusterPolicy>>,
            $($(#[$gdoc])* pub $gf: $gt,)*
            /// Things that are allowed but worth a line in the log.
            pub warnings: Vec<String>,
            /// Whether `admin_cluster` was written in the configuration (its
            /// default may name no cluster of this Envoy: then nothing is
            /// wrong, and nothing is said but once).
            pub admin_cluster_given: bool,
        }

        impl Default for Config {
            fn default() -> Self {
                Config {
                    role: Role::Downstream,
                    defaults: Arc::default(),
                    clusters: HashMap::new(),
                    $($gf: $gdefault,)*
                    warnings: Vec::new(),
                    admin_cluster_given: false,
                }
            }
        }

        /// A cluster override as written: every field optional.
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct RawPolicy {
            $(#[serde(default, deserialize_with = "present")] $pf: Option<$pt>,)*
        }

        /// The top level as written: the per-cluster fields are repeated
        /// here, not flattened (serde's `flatten` would lose
        /// `deny_unknown_fields` and the field paths in errors).
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct RawConfig {
            #[serde(default, deserialize_with = "present")]
            role: Option<Role>,
            $(#[serde(default, deserialize_with = "present")] $pf: Option<$pt>,)*
            $(#[serde(default, deserialize_with = "present")] $gf: Option<$gt>,)*
            #[serde(default, deserialize_with = "unique_clusters")]
            clusters: Option<BTreeMap<String, RawPolicy>>,
        }

        impl RawConfig {
            /// The fields given besides `role`, in the order they are declared.
            fn set_fields(&self) -> Vec<&'static str> {
                [
                    $((stringify!($pf), self.$pf.is_some()),)*
                    $((stringify!($gf), self.$gf.is_some()),)*
                    ("clusters", self.clusters.is_some()),
                ]
                .into_iter()
                .filter_map(|(name, set)| set.then_some(name))
                .collect()
            }

            fn take_policy(&mut self) -> RawPolicy {
                RawPolicy { $($pf: self.$pf.take(),)* }
            }

            fn apply_globals(&mut self, config: &mut Config) -> Result<(), ConfigError> {
                $(if let Some(value) = self.$gf.take() {
                    let rule: Rule<$gt> = $grule;
                    config.$gf = checked(stringify!($gf), value, rule)?;
                })*
                Ok(())
            }
        }

        impl RawPolicy {
            /// Applies this over `base`; field names in errors carry `prefix`
            /// ("clusters.<name>.") so an override's mistake points at it.
            fn merge_over(&self, base: &ClusterPolicy, prefix: &str) -> Result<ClusterPolicy, ConfigError> {
                let mut policy = base.clone();
                $(if let Some(value) = self.$pf.clone() {
                    let rule: Rule<$pt> = $prule;
                    policy.$pf = checked(&format!("{prefix}{}", stringify!($pf)), value, rule)?;
                })*
                Ok(policy)
            }
        }

        /// The type of a setting a route's metadata may override (every
        /// per-cluster one); `None` for any other name.
        pub fn policy_field_kind(name: &str) -> Option<Kind> {
            match name {
                $(stringify!($pf) => Some(<$pt as SettingKind>::KIND),)*
                _ => None,
            }
        }

        /// The effective configuration in the shape the user writes it.
        #[derive(Serialize)]
        struct Effective<'a> {
            role: Role,
            #[serde(flatten)]
            defaults: &'a ClusterPolicy,
            $($gf: &'a $gt,)*
            clusters: BTreeMap<&'a str, &'a ClusterPolicy>,
        }

        impl Config {
            fn effective(&self) -> Effective<'_> {
                Effective {
                    role: self.role,
                    defaults: &self.defaults,
                    $($gf: &self.$gf,)*
                    clusters: self.clusters.iter().map(|(n, p)| (n.as_str(), &**p)).collect(),
                }
            }
        }
    };
}

settings! {
    policy {
        /// Turns hedging off for the cluster.
        disabled: bool = false, Ok;
        /// `hedge`, or `shadow`: decide, never arm; the metrics tell what hedging would do.
        mode: Mode = Mode::Hedge, Ok;
        /// Hedge after this quantile of the cluster's latency (0.9 = p90).
        percentile: f64 = 0.9, percentile_rule;
        /// Extra attempts allowed, in percent of the requests received.
        budget_percent: f64 = 10.0, budget_percent_rule;
        /// Tokens a worker (and the shared pool) may save up while idle.
        budget_burst: f64 = 10.0, |b| within(b, 1.0, 10_000.0, " tokens");
        /// Earnings a worker (and the shared pool) may save, in time at the current rate: spent when latency rises.
        budget_reserve: TextDuration = millis(10_000),
            |r| duration_within(r, Duration::from_secs(1), Duration::from_secs(300));
        min_delay: TextDuration = millis(1), min_delay_rule;
        /// Upper clamp of the delay: the rule's own bound, so that no latency a
        /// cluster may have is hedged below its learned quantile unasked.
        max_delay: TextDuration = TextDuration(MAX_DELAY_BOUND), max_delay_rule;
        /// Hedges per request (`x-envoy-max-retries`).
        max_hedges: u32 = 1, |n| within(n, 1, 5, " (use \"disabled\": true to turn hedging off)");
        /// Samples the long horizon must hold (all workers together) before hedging.
        min_samples: u64 = 100, |n| within(n, 1, 1_000_000, "");
        idempotent_methods: Vec<String> =
            vec!["GET".into(), "HEAD".into(), "OPTIONS".into()], methods_rule;
        /// gRPC methods that may be hedged: `/package.Service/Method`, or `/package.Service/` for all of a service's; unary methods only (the filter cannot tell a streaming one from its headers).
        idempotent_grpc_methods: Vec<String> = Vec::new(), grpc_methods_rule;
        /// `x-envoy-retry-on` of armed requests.
        retry_on: Arc<str> = "5xx,retriable-status-codes".into(), retry_on_rule;
        /// `x-envoy-retriable-status-codes` of armed requests: with `retriable-status-codes` in `retry_on`, statuses after which the race goes on (a hedge's 429 does not end it while the other attempt runs); "" for none.
        retriable_status_codes: Arc<str> = "429".into(), status_codes_rule;
        /// `x-envoy-retry-grpc-on` of armed gRPC requests: the statuses (in a trailers-only answer) after which the race goes on.
        grpc_retry_on: Arc<str> = "cancelled,unavailable,resource-exhausted".into(), grpc_retry_on_rule;
        /// The routes' own `num_retries` (Istio's default: 2): `x-envoy-max-retries` replaces it, so armed requests get at least this many.
        route_retries: u32 = 0, |n| within(n, 0, 10, " retries (the routes' num_retries)");
        /// Named routes of the cluster that learn a delay of their own (0: one delay for the whole cluster).
        max_routes: usize = 8,
            |n| within(n, 0, MAX_ROUTES, " routes per cluster");
        /// Choose each request's host (p2c over latency) and send the hedge to the best other host; needs the cluster's `override_host` policy.
        host_choice: bool = true, Ok;
        /// Hosts drawn per request for the choice of its host (power of d choices).
        host_choices: usize = 2, |n| within(n, 2, 4, " hosts drawn per request");
        /// Hold arming back on hosts with per-try timeouts standing, so hedging alone cannot eject hosts where outlier detection splits local-origin errors (`consecutive_local_origin_failure`; without the split armed requests' timeouts are 204s, no failure); `false` where the cluster has no outlier detection or no split.
        outlier_pacing: bool = true, Ok;
    }
    global {
        /// Length of the rolling latency window.
        window: TextDuration = millis(30_000),
            |w| duration_within(w, Duration::from_secs(1), Duration::from_secs(600));
        /// How often each worker merges into shared memory and refreshes its delays.
        sync_interval: TextDuration = millis(200),
            |i| duration_within(i, Duration::from_millis(10), Duration::from_secs(10));
        latency_signal: LatencySignal = LatencySignal::Headers, Ok;
        /// Keep client-sent `x-envoy-*` retry/hedge headers instead of removing them.
        trust_client_headers: bool = false, Ok;
        /// Clusters tracked at most; past it new clusters pass through unhedged.
        max_clusters: usize = 1000, |n| within(n, 1, MAX_TRACKED_CLUSTERS, " (each takes up to 64 KiB of shared memory, 64 MiB in all)");
        /// Add `x-adaptive-hedge` to responses (the decision, for debugging).
        debug_header: bool = false, Ok;
        /// Write the decision and hosts to filter state `wasm.adaptive_hedge`, for access logs.
        log_attribution: bool = false, Ok;
        /// The request header the cluster's `override_host` policy reads.
        host_header: Arc<str> = ENDPOINT_HEADER.into(), host_header_rule;
        /// A cluster that reaches this Envoy's admin interface: host choice then reads `/clusters` for each host's health and weight, never names a host Envoy would not use, and weighs the rest; outlier pacing reads whether it is needed ("": not read). The default is the one Istio's and Envoy Gateway's bootstraps declare; where Envoy has no such cluster, nothing is read.
        admin_cluster: Arc<str> = DEFAULT_ADMIN_CLUSTER.into(), admin_cluster_rule;
        /// How often the admin interface is read (by one worker; all share what it read).
        admin_refresh: TextDuration = millis(5_000),
            |r| duration_within(r, Duration::from_secs(1), Duration::from_secs(60));
    }
}

impl Config {
    /// Whether any cluster learns per route (else a route's name is used
    /// only for the routes whose metadata overrides the policy).
    pub fn learns_routes(&self) -> bool {
        self.defaults.max_routes > 0 || self.clusters.values().any(|p| p.max_routes > 0)
    }

    /// Whether any cluster chooses its hosts (else no response's host is read).
    pub fn chooses_hosts(&self) -> bool {
        self.defaults.host_choice || self.clusters.values().any(|p| p.host_choice)
    }

    /// The cluster to read Envoy's admin interface through, if any cluster
    /// would use what it says.
    pub fn admin_cluster(&self) -> Option<&str> {
        (!self.admin_cluster.is_empty() && self.reads_admin()).then_some(&*self.admin_cluster)
    }

    /// Whether any cluster would use what the admin interface says.
    fn reads_admin(&self) -> bool {
        self.defaults.reads_admin() || self.clusters.values().any(|p| p.reads_admin())
    }

    /// `admin_refresh` in milliseconds.
    pub fn admin_refresh_ms(&self) -> u64 {
        u64::try_from(self.admin_refresh.as_millis()).unwrap_or(u64::MAX)
    }
}

impl ClusterPolicy {
    /// A latency as the cluster's sketches learn it: at most `max_delay`
    /// (as armed, in whole ms). No delay learned can be higher, so above
    /// it a sample's rank is all that counts. One huge sample collapsed
    /// the lowest buckets of a sketch, which spans 21,600-fold below its
    /// largest (`sketch`): a wall clock stepped an hour forward while
    /// requests were in flight made every sample below 168 ms read 168 ms
    /// in the long horizon for an hour or two (found by a review).
    pub fn sample_us(&self, latency_us: u64) -> f64 {
        latency_us.min(self.max_delay_ms().saturating_mul(1000)) as f64
    }

    /// `max_delay` in the per-try timeout's milliseconds, rounded up as
    /// the delay is (`2900us` rounded down to 2 ms put the timeout below a
    /// `min_delay` of `2500us`).
    pub fn max_delay_ms(&self) -> u64 {
        u64::try_from(self.max_delay.as_micros().div_ceil(1000)).unwrap_or(u64::MAX)
    }

    /// `x-envoy-retriable-status-codes` of armed requests: the codes, if
    /// any and if `retry_on` has `retriable-status-codes` (without it Envoy
    /// ignores them; the config warns).
    pub fn retriable_codes_header(&self) -> Option<&Arc<str>> {
        let on = self
            .retry_on
            .split(',')
            .any(|on| on == "retriable-status-codes");
        (on && !self.retriable_status_codes.is_empty()).then_some(&self.retriable_status_codes)
    }

    pub fn allows_method(&self, method: &[u8]) -> bool {
        self.idempotent_methods
            .iter()
            .any(|m| m.as_bytes() == method)
    }

    /// Whether a gRPC call to `path` may be hedged: its method is listed,
    /// or its service is (a prefix ending in `/`).
    pub fn allows_grpc_method(&self, path: &[u8]) -> bool {
        self.idempotent_grpc_methods.iter().any(|m| {
            let m = m.as_bytes();
            if m.ends_with(b"/") {
                path.len() > m.len() && path.starts_with(m)
            } else {
                path == m
            }
        })
    }

    /// Whether this cluster uses what Envoy's admin interface says: the
    /// hosts' health and weights for host choice, and whether its outlier
    /// detection can count a hedge's timeout for outlier pacing (which
    /// holds back armed requests with or without host choice).
    pub fn reads_admin(&self) -> bool {
        self.host_choice || self.outlier_pacing
    }

    /// `budget_percent` as a fraction (0.10 for 10%).
    pub fn budget_share(&self) -> f64 {
        self.budget_percent / 100.0
    }

    /// The cross-field rule and the warnings of one policy; `raw` says
    /// which fields this level of the config set itself.
    fn check(
        &self,
        prefix: &str,
        raw: &RawPolicy,
        limits: Limits,
        warnings: &mut Vec<String>,
    ) -> Result<(), ConfigError> {
        // the window's samples are what the delay is learned from: more
        // than one worker can put there are reached only with several
        // workers at full rate; short of them the delay is never learned,
        // nor do the recent slices ever count after a shift
        if raw.min_samples.is_some() && self.min_samples > limits.window_samples {
            warnings.push(format!(
                "{prefix}min_samples: {} is more than one worker can sample in a window ({}: {SAMPLES_PER_TICK} responses of a cluster a tick, window / sync_interval ticks); with fewer workers at full rate the delay is never learned",
                self.min_samples, limits.window_samples
            ));
        }
        // an armed request reserves a token for each retry the route may
        // make, and a worker keeps at most `budget_burst` tokens, or its
        // reserve's earnings where more: below, a quiet worker never arms
        if (raw.route_retries.is_some() || raw.budget_burst.is_some())
            && f64::from(self.route_retries) > self.budget_burst
        {
            warnings.push(format!(
                "{prefix}budget_burst: {} is below route_retries ({}): an armed request reserves a token for each of the route's retries, so a quiet worker (a few requests a second) never arms",
                self.budget_burst, self.route_retries
            ));
        }
        if (raw.max_hedges.is_some() || raw.budget_burst.is_some())
            && f64::from(self.max_hedges) > self.budget_burst
        {
            warnings.push(format!(
                "{prefix}max_hedges: {} hedges take as many tokens, and a quiet worker keeps at most budget_burst ({}): its requests get fewer",
                self.max_hedges, self.budget_burst
            ));
        }
        let set_max = raw.max_delay.is_some();
        if self.min_delay > self.max_delay {
            let (name, value) = if set_max {
                ("max_delay", self.max_delay)
            } else {
                ("min_delay", self.min_delay)
            };
            return Err(error(
                &format!("{prefix}{name}"),
                quoted(&format_duration(*value)),
                format!(
                    "min_delay ({}) must not exceed max_delay ({})",
                    format_duration(*self.min_delay),
                    format_duration(*self.max_delay)
                ),
            ));
        }
        let written = raw.retry_on.is_some() || raw.retriable_status_codes.is_some();
        if written
            && !self.retriable_status_codes.is_empty()
            && self.retriable_codes_header().is_none()
        {
            warnings.push(format!(
                "{prefix}retriable_status_codes: not written, retry_on has no retriable-status-codes (a hedge's {} then ends the race)",
                self.retriable_status_codes
            ));
        }
        // warned where the list is written, not again in every override
        // that inherits it
        for m in raw.idempotent_methods.iter().flatten() {
            if NON_IDEMPOTENT_METHODS.contains(&m.as_str()) {
                warnings.push(format!(
                    "{prefix}idempotent_methods: {m} is not idempotent in general; hedging it may apply a request twice"
                ));
            }
        }
        Ok(())
    }
}

/// A rejected configuration: which field, what value, which rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub value: String,
    pub rule: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(
                f,
                "invalid plugin config: field \"{}\": {}",
                self.field, self.rule
            )
        } else {
            write!(
                f,
                "invalid plugin config: field \"{}\" = {}: {}",
                self.field, self.value, self.rule
            )
        }
    }
}

impl std::error::Error for ConfigError {}

fn error(field: &str, value: impl fmt::Display, rule: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.to_string(),
        value: value.to_string(),
        rule: rule.into(),
    }
}

/// Applies a field's rule; the error shows the value as written (JSON).
fn checked<T: Serialize>(field: &str, value: T, rule: Rule<T>) -> Result<T, ConfigError> {
    let shown = serde_json::to_string(&value).unwrap_or_default();
    rule(value).map_err(|why| error(field, shown, why))
}

/// A serde error at a path, as a field error: `prefix` + the path (the
/// whole value where the path is empty).
fn path_error<E: fmt::Display>(e: serde_path_to_error::Error<E>, prefix: &str) -> ConfigError {
    let path = e.path().to_string();
    let field = match (path.as_str(), prefix) {
        (".", "") => "(root)".to_string(),
        (".", _) => prefix.trim_end_matches('.').to_string(),
        _ => format!("{prefix}{path}"),
    };
    error(&field, "", e.inner().to_string())
}

fn quoted(text: &str) -> String {
    format!("\"{text}\"")
}

/// A field that is written has a value: `null` (or an empty YAML value)
/// is refused, not taken for the default the operator did not mean.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d)?
        .map(Some)
        .ok_or_else(|| D::Error::custom("null is no value: leave the field out for its default"))
}

/// `clusters`, refusing a name given twice: a JSON object's later key
/// would silently replace the earlier override.
fn unique_clusters<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, RawPolicy>>, D::Error> {
    struct Unique;
    impl<'de> Visitor<'de> for Unique {
        type Value = BTreeMap<String, RawPolicy>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map of cluster names to overrides")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut clusters = BTreeMap::new();
            while let Some(name) = map.next_key::<String>()? {
                if clusters.contains_key(&name) {
                    return Err(A::Error::custom(format!(
                        "cluster \"{name}\" is given twice (the later would replace the earlier)"
                    )));
                }
                let policy = map.next_value::<RawPolicy>()?;
                clusters.insert(name, policy);
            }
            Ok(clusters)
        }
    }
    d.deserialize_map(Unique).map(Some)
}

/// What the plugin-wide settings allow a cluster's policy (`check`).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The most latency samples one worker puts into a window:
    /// `SAMPLES_PER_TICK` a tick, `window / sync_interval` ticks.
    pub window_samples: u64,
}

impl Config {
    /// Parses and validates the plugin configuration. Empty (or only white
    /// space) means every default.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        if bytes.iter().all(|b| b.is_ascii_whitespace()) {
            return Ok(Config::default());
        }
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let raw: RawConfig =
            serde_path_to_error::deserialize(&mut de).map_err(|e| path_error(e, ""))?;
        // text after the object (a brace closed too early) is an error, not
        // settings silently dropped
        de.end()
            .map_err(|e| error("(root)", "", format!("text after the configuration: {e}")))?;
        Self::validate(raw)
    }

    fn validate(mut raw: RawConfig) -> Result<Config, ConfigError> {
        if raw.role == Some(Role::Upstream) {
            // The upstream role only holds response headers; a hedging
            // setting here is a setting the operator believes in but that
            // does nothing, most likely meant for the downstream filter.
            if let Some(field) = raw.set_fields().first() {
                return Err(error(
                    field,
                    "",
                    "not used by the upstream role (it only holds response headers until the first body byte); set it on the downstream filter",
                ));
            }
            return Ok(Config {
                role: Role::Upstream,
                ..Config::default()
            });
        }
        let mut config = Config::default();
        let mut warnings = Vec::new();
        let top = raw.take_policy();
        let defaults = top.merge_over(&ClusterPolicy::default(), "")?;
        config.admin_cluster_given = raw.admin_cluster.is_some();
        let sync_given = raw.sync_interval.is_some();
        raw.apply_globals(&mut config)?;
        let slice = *config.window / SLICES as u32;
        if !sync_given && *config.sync_interval > slice {
            // the default tick, shortened to fit a window under 1.2 s (the
            // README allows 1 s): the user wrote no sync_interval to blame;
            // whole milliseconds, as Envoy ticks
            let ms = u64::try_from(slice.as_millis()).unwrap_or(u64::MAX);
            config.sync_interval = millis(ms);
        }
        if config.sync_interval.subsec_nanos() % 1_000_000 != 0 {
            return Err(error(
                "sync_interval",
                quoted(&format_duration(*config.sync_interval)),
                "must be a whole number of milliseconds (Envoy's tick has millisecond resolution)",
            ));
        }
        if *config.sync_interval > slice {
            return Err(error(
                "sync_interval",
                quoted(&format_duration(*config.sync_interval)),
                format!(
                    "must not exceed window / {SLICES} = {} (the window ages out in {SLICES} steps)",
                    format_duration(slice),
                ),
            ));
        }
        let limits = config.limits();
        defaults.check("", &top, limits, &mut warnings)?;
        if defaults.disabled {
            warnings.push("\"disabled\": true at the top level turns hedging off for every cluster whose override does not set \"disabled\": false".into());
        }
        if config.latency_signal == LatencySignal::FirstByte {
            warnings.push(format!("latency_signal is first_byte: streamed responses are hedged only on clusters that also run this module with {{\"role\": \"upstream\"}} (it holds armed requests' 2xx headers, marked with {FIRST_BYTE_MARKER}, until the first body byte)"));
        }
        if config.trust_client_headers {
            warnings.push(
                "trust_client_headers is on: clients can switch on retries and hedges themselves, and name the host (the host header is no x-envoy-* header: Envoy strips it from no client, and the override_host policy ignores health)"
                    .into(),
            );
        }
        for (name, raw_override) in raw.clusters.take().into_iter().flatten() {
            if name.is_empty() {
                return Err(error("clusters", "\"\"", "cluster names must not be empty"));
            }
            let prefix = format!("clusters.{name}.");
            let policy = raw_override.merge_over(&defaults, &prefix)?;
            policy.check(&prefix, &raw_override, limits, &mut warnings)?;
            config.clusters.insert(name, Arc::new(policy));
        }
        config.defaults = Arc::new(defaults);
        if config.admin_cluster_given && !config.admin_cluster.is_empty() && !config.reads_admin() {
            warnings.push(format!(
                "admin_cluster \"{}\" is not read: only host choice and outlier pacing use it, and both are off for every cluster",
                config.admin_cluster
            ));
        }
        config.warnings = warnings;
        Ok(config)
    }

    /// A route's overrides (its metadata `filter_metadata.adaptive_hedge`,
    /// as JSON) merged over `base`, its cluster's policy, with the same rules
    /// as a `clusters.<name>` override; errors and warnings name the field
    /// with `prefix`. The route is hedged as its own cluster, so it never
    /// learns per route (`max_routes` is 0).
    pub fn route_policy(
        &self,
        base: &ClusterPolicy,
        overrides: serde_json::Value,
        prefix: &str,
        warnings: &mut Vec<String>,
    ) -> Result<ClusterPolicy, ConfigError> {
        let raw: RawPolicy =
            serde_path_to_error::deserialize(overrides).map_err(|e| path_error(e, prefix))?;
        let mut policy = raw.merge_over(base, prefix)?;
        policy.check(prefix, &raw, self.limits(), warnings)?;
        // The plugin's configuration is where hedging is turned off, for a
        // cluster or for all (in an incident, one edit): a route's metadata,
        // another document often written by other hands, may turn it off
        // or to shadow for its route, never back on.
        if base.disabled && !policy.disabled {
            policy.disabled = true;
            warnings.push(format!(
                "{prefix}disabled: false ignored; the plugin's configuration disables the cluster (a route may turn hedging off, not on)"
            ));
        }
        if base.mode == Mode::Shadow && policy.mode != Mode::Shadow {
            policy.mode = Mode::Shadow;
            warnings.push(format!(
                "{prefix}mode: \"hedge\" ignored; the plugin's configuration puts the cluster in shadow mode (a route may not arm it)"
            ));
        }
        // The same for host choice: it is off where a hash's affinity or a
        // locality's order matters (deployment.md), and a route naming
        // hosts there would undo it.
        if !base.host_choice && policy.host_choice {
            policy.host_choice = false;
            warnings.push(format!(
                "{prefix}host_choice: true ignored; the plugin's configuration turns host choice off for the cluster (a route may turn it off, not on)"
            ));
        }
        if raw.max_routes.is_some_and(|n| n > 0) {
            warnings.push(format!(
                "{prefix}max_routes: ignored; a route with its own overrides learns its own delay already"
            ));
        }
        policy.max_routes = 0;
        Ok(policy)
    }

    /// What the plugin-wide settings allow a cluster's policy.
    pub fn limits(&self) -> Limits {
        let ticks = self.window.as_nanos() / self.sync_interval.as_nanos().max(1);
        let samples = ticks.saturating_mul(u128::from(SAMPLES_PER_TICK));
        Limits {
            window_samples: u64::try_from(samples).unwrap_or(u64::MAX),
        }
    }

    /// The policy for a routed cluster: its override, else the defaults.
    pub fn policy_for(&self, cluster: &str) -> Arc<ClusterPolicy> {
        self.clusters
            .get(cluster)
            .cloned()
            .unwrap_or_else(|| Arc::clone(&self.defaults))
    }

    /// The effective configuration as JSON, in the same shape the user writes,
    /// for the start-up log line.
    pub fn effective_json(&self) -> String {
        if self.role == Role::Upstream {
            return r#"{"role":"upstream"}"#.to_string();
        }
        serde_json::to_string(&self.effective()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(json: &str) -> ConfigError {
        Config::parse(json.as_bytes()).expect_err(json)
    }

    #[test]
    fn upstream_role_takes_no_hedging_settings() {
        let c = Config::parse(br#"{"role": "upstream"}"#).unwrap();
        assert_eq!(c.role, Role::Upstream);
        assert_eq!(c.effective_json(), r#"{"role":"upstream"}"#);
        let again = Config::parse(c.effective_json().as_bytes()).unwrap();
        assert_eq!(again.role, Role::Upstream);
        for (field, value) in [
            ("percentile", "0.9"),
            ("latency_signal", "\"first_byte\""),
            ("clusters", "{}"),
        ] {
            let e = err(&format!(r#"{{"role": "upstream", "{field}": {value}}}"#));
            assert_eq!(e.field, field);
            assert!(e.rule.contains("not used by the upstream role"), "{e}");
        }
        let e = err(r#"{"role": "sidecar"}"#);
        assert_eq!(e.field, "role");
        assert!(
            e.rule.contains("downstream") && e.rule.contains("upstream"),
            "{e}"
        );
    }

    #[test]
    fn downstream_role_is_the_default_and_is_logged() {
        let c = Config::parse(b"{}").unwrap();
        assert_eq!(c.role, Role::Downstream);
        assert!(c.effective_json().contains(r#""role":"downstream""#));
        let explicit = Config::parse(br#"{"role": "downstream", "percentile": 0.95}"#).unwrap();
        assert_eq!(explicit.role, Role::Downstream);
        assert_eq!(explicit.defaults.percentile, 0.95);
    }

    /// The admin interface is looked for through the mesh bootstraps'
    /// cluster unless the configuration says otherwise ("" for none);
    /// only a name written there is warned about when nothing reads it.
    #[test]
    fn the_admin_cluster_defaults_to_the_mesh_bootstraps_one() {
        let zero = Config::parse(b"{}").unwrap();
        assert_eq!(zero.admin_cluster(), Some(DEFAULT_ADMIN_CLUSTER));
        assert!(!zero.admin_cluster_given);
        let none = Config::parse(br#"{"admin_cluster": ""}"#).unwrap();
        assert_eq!(none.admin_cluster(), None);
        assert!(none.admin_cluster_given);
        let named = Config::parse(br#"{"admin_cluster": "envoy_admin"}"#).unwrap();
        assert_eq!(named.admin_cluster(), Some("envoy_admin"));
        let off = br#"{"host_choice": false, "outlier_pacing": false}"#;
        let unread = Config::parse(off).unwrap();
        assert_eq!(unread.admin_cluster(), None);
        assert!(unread.warnings.is_empty(), "{:?}", unread.warnings);
        let written = Config::parse(
            br#"{"host_choice": false, "outlier_pacing": false, "admin_cluster": "a"}"#,
        )
        .unwrap();
        assert!(
            written.warnings.iter().any(|w| w.contains("is not read")),
            "{:?}",
            written.warnings
        );
    }

    #[test]
    fn first_byte_signal_warns_about_the_upstream_role() {
        let c = Config::parse(br#"{"latency_signal": "first_byte"}"#).unwrap();
        assert!(
            c.warnings
                .iter()
                .any(|w| w.contains("\"role\": \"upstream\"")),
            "{:?}",
            c.warnings
        );
    }

    /// The README's shortest window, 1 s, with the default tick (which
    /// would exceed a sixth of it): the tick is shortened to fit.
    #[test]
    fn the_shortest_window_fits_the_default_tick() {
        let c = Config::parse(br#"{"window": "1s"}"#).unwrap();
        assert!(*c.sync_interval <= *c.window / 6, "{:?}", c.sync_interval);
    }

    /// The router's timeout is whole milliseconds, rounded up: `max_delay`
    /// too, so a per-try timeout is never below `min_delay`.
    #[test]
    fn a_sub_millisecond_max_delay_rounds_up_as_the_delay_does() {
        let c = Config::parse(br#"{"min_delay": "2500us", "max_delay": "2900us"}"#).unwrap();
        assert_eq!(c.defaults.max_delay_ms(), 3);
        assert_eq!(ClusterPolicy::default().max_delay_ms(), 300_000);
    }

    #[test]
    fn retriable_codes_without_their_retry_on_value_warn() {
        let c = Config::parse(br#"{"retry_on": "5xx"}"#).unwrap();
        assert!(
            c.warnings
                .iter()
                .any(|w| w.contains("retriable_status_codes: not written")),
            "{:?}",
            c.warnings
        );
        let c = Config::parse(br#"{"retry_on": "5xx", "retriable_status_codes": ""}"#).unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn retriable_status_codes_are_normalised_and_may_be_none() {
        let c = Config::parse(br#"{"retriable_status_codes": " 429, 503 "}"#).unwrap();
        assert_eq!(&*c.defaults.retriable_status_codes, "429,503");
        let c = Config::parse(br#"{"retriable_status_codes": ""}"#).unwrap();
        assert_eq!(&*c.defaults.retriable_status_codes, "");
        let d = ClusterPolicy::default();
        assert_eq!(
            (&*d.retry_on, &*d.retriable_status_codes),
            ("5xx,retriable-status-codes", "429")
        );
    }

    #[test]
    fn empty_means_defaults() {
        for empty in ["", "  \n", "{}"] {
            let c = Config::parse(empty.as_bytes()).unwrap();
            assert_eq!(*c.defaults, ClusterPolicy::default());
            assert_eq!(*c.window, Duration::from_secs(30));
            assert_eq!(c.latency_signal, LatencySignal::Headers);
            assert!(!c.trust_client_headers);
            assert_eq!(c.max_clusters, 1000);
            assert!(c.warnings.is_empty());
        }
    }

    #[test]
    fn full_config_with_override() {
        let c = Config::parse(
            br#"{"percentile": 0.95, "budget_percent": 5, "min_delay": "2ms", "max_delay": "2s",
                "max_hedges": 2, "window": "12s", "min_samples": 50,
                "idempotent_methods": ["GET"], "retry_on": "5xx, reset",
                "latency_signal": "first_byte", "trust_client_headers": true, "max_clusters": 10,
                "clusters": {"slow": {"percentile": 0.99}, "off": {"disabled": true}}}"#,
        )
        .unwrap();
        assert_eq!(c.defaults.percentile, 0.95);
        assert!((c.defaults.budget_share() - 0.05).abs() < 1e-12);
        assert_eq!(c.defaults.max_hedges, 2);
        assert_eq!(&*c.defaults.retry_on, "5xx,reset");
        assert_eq!(c.latency_signal, LatencySignal::FirstByte);
        let slow = c.policy_for("slow");
        assert_eq!(slow.percentile, 0.99);
        // an override inherits everything it does not set
        assert_eq!(*slow.min_delay, Duration::from_millis(2));
        assert!(c.policy_for("off").disabled);
        assert_eq!(c.policy_for("other").percentile, 0.95);
        assert!(c.effective_json().contains("\"percentile\":0.95"));
    }

    #[test]
    fn the_effective_config_parses_back_to_itself() {
        let c = Config::parse(
            br#"{"percentile": 0.93, "budget_percent": 7.5, "min_delay": "1500us",
                "window": "12s", "clusters": {"a": {"max_delay": "40ms"}}}"#,
        )
        .unwrap();
        let again = Config::parse(c.effective_json().as_bytes()).unwrap();
        assert_eq!(again.defaults, c.defaults);
        assert_eq!(again.clusters, c.clusters);
        assert_eq!(again.window, c.window);
        assert_eq!(again.effective_json(), c.effective_json());
    }

    #[test]
    fn each_error_names_its_field() {
        let cases = [
            (r#"{"percentil": 0.9}"#, "percentil"),
            (r#"{"percentile": 1.5}"#, "percentile"),
            (r#"{"percentile": 0}"#, "percentile"),
            (r#"{"percentile": "high"}"#, "percentile"),
            (r#"{"budget_percent": 0}"#, "budget_percent"),
            (r#"{"budget_percent": 150}"#, "budget_percent"),
            (r#"{"budget_burst": 0}"#, "budget_burst"),
            (r#"{"min_delay": "5"}"#, "min_delay"),
            (r#"{"min_delay": "0ms"}"#, "min_delay"),
            (r#"{"max_delay": "fast"}"#, "max_delay"),
            (r#"{"max_delay": "6m"}"#, "max_delay"),
            (r#"{"min_delay": "50ms", "max_delay": "10ms"}"#, "max_delay"),
            (r#"{"min_delay": "6m"}"#, "min_delay"),
            (r#"{"max_hedges": 0}"#, "max_hedges"),
            (r#"{"max_clusters": 1023}"#, "max_clusters"),
            (r#"{"max_hedges": -1}"#, "max_hedges"),
            (r#"{"min_samples": 0}"#, "min_samples"),
            (r#"{"window": "10ms"}"#, "window"),
            (r#"{"sync_interval": "1ms"}"#, "sync_interval"),
            (r#"{"percentile": 0.95}, "budget_percent": 5}"#, "(root)"),
            (
                r#"{"window": "2s", "sync_interval": "1s"}"#,
                "sync_interval",
            ),
            (r#"{"idempotent_methods": []}"#, "idempotent_methods"),
            (
                r#"{"idempotent_grpc_methods": ["demo.Echo/Get"]}"#,
                "idempotent_grpc_methods",
            ),
            (
                r#"{"idempotent_grpc_methods": ["/demo.Echo"]}"#,
                "idempotent_grpc_methods",
            ),
            (
                r#"{"idempotent_grpc_methods": ["/demo.Echo/Get/x"]}"#,
                "idempotent_grpc_methods",
            ),
            (
                r#"{"idempotent_grpc_methods": ["//Get"]}"#,
                "idempotent_grpc_methods",
            ),
            (r#"{"grpc_retry_on": "unavailable, 5xx"}"#, "grpc_retry_on"),
            (
                r#"{"retriable_status_codes": "429,2xx"}"#,
                "retriable_status_codes",
            ),
            (
                r#"{"retriable_status_codes": "99"}"#,
                "retriable_status_codes",
            ),
            (
                r#"{"retriable_status_codes": 429}"#,
                "retriable_status_codes",
            ),
            (r#"{"idempotent_methods": ["get"]}"#, "idempotent_methods"),
            (
                r#"{"idempotent_methods": ["CONNECT"]}"#,
                "idempotent_methods",
            ),
            (r#"{"retry_on": "sometimes"}"#, "retry_on"),
            (r#"{"route_retries": 11}"#, "route_retries"),
            (r#"{"mode": "dark"}"#, "mode"),
            (r#"{"latency_signal": "trailers"}"#, "latency_signal"),
            (r#"{"trust_client_headers": "yes"}"#, "trust_client_headers"),
            (r#"{"max_clusters": 0}"#, "max_clusters"),
            (r#"{"debug_header": 1}"#, "debug_header"),
            (
                r#"{"clusters": {"a": {"percentile": 2}}}"#,
                "clusters.a.percentile",
            ),
            (r#"{"clusters": {"a": {"window": "5s"}}}"#, "clusters.a"),
            (
                r#"{"clusters": {"a": {"min_delay": "6m"}}}"#,
                "clusters.a.min_delay",
            ),
            (r#"{"clusters": {"": {}}}"#, "clusters"),
        ];
        for (json, field) in cases {
            let e = err(json);
            assert!(
                e.field.starts_with(field),
                "{json}: field {:?} should name {field}",
                e.field
            );
            let line = e.to_string();
            assert!(line.contains(field), "{json}: {line}");
            assert!(!e.rule.is_empty());
        }
    }

    /// Values that used to be taken silently: each refused, naming the
    /// field; settings that work only under load: warned.
    #[test]
    fn silent_values_are_refused_and_settings_for_load_only_warned() {
        let cases = [
            // null is no value (an empty YAML value is null)
            (r#"{"percentile": null}"#, "percentile", "null is no value"),
            (r#"{"role": null}"#, "role", "null is no value"),
            (
                r#"{"clusters": {"a": {"min_delay": null}}}"#,
                "clusters.a.min_delay",
                "null is no value",
            ),
            // a cluster given twice
            (
                r#"{"clusters": {"a": {"disabled": true}, "a": {"percentile": 0.99}}}"#,
                "clusters",
                "\"a\" is given twice",
            ),
            // rounds to no token at all
            (
                r#"{"budget_percent": 0.00004}"#,
                "budget_percent",
                "between 0.0001 and 100",
            ),
            // Envoy ticks in whole milliseconds
            (
                r#"{"sync_interval": "10500us"}"#,
                "sync_interval",
                "whole number of milliseconds",
            ),
        ];
        for (json, field, why) in cases {
            let e = err(json);
            assert_eq!(e.field, field, "{json}: {e}");
            assert!(e.to_string().contains(why), "{json}: {e}");
        }
        for fine in [
            r#"{"min_samples": 38400}"#,
            r#"{"window": "60s", "sync_interval": "10s", "min_samples": 1536}"#,
            r#"{"budget_burst": 2, "route_retries": 2}"#,
            r#"{"budget_percent": 0.0001}"#,
            r#"{"sync_interval": "10ms"}"#,
        ] {
            let c = Config::parse(fine.as_bytes()).expect(fine);
            assert!(c.warnings.is_empty(), "{fine}: {:?}", c.warnings);
        }
        // settings that work only under load: allowed, said
        for (json, said) in [
            // 256 samples a tick, 150 ticks a window: 38,400 from one worker
            (
                r#"{"min_samples": 38401}"#,
                "min_samples: 38401 is more than one worker",
            ),
            (
                r#"{"window": "60s", "sync_interval": "10s", "min_samples": 1537}"#,
                "(1536:",
            ),
            (
                r#"{"clusters": {"a": {"min_samples": 100000}}}"#,
                "clusters.a.min_samples",
            ),
            // a quiet worker could never reserve the route's retries
            (
                r#"{"budget_burst": 1, "route_retries": 2}"#,
                "budget_burst: 1 is below route_retries (2)",
            ),
            (
                r#"{"budget_burst": 2, "clusters": {"a": {"route_retries": 3}}}"#,
                "clusters.a.budget_burst: 2 is below route_retries (3)",
            ),
        ] {
            let c = Config::parse(json.as_bytes()).expect(json);
            assert!(
                c.warnings.iter().any(|w| w.contains(said)),
                "{json}: {:?}",
                c.warnings
            );
        }
        // the tick derived for a short window is whole milliseconds too
        let c = Config::parse(br#"{"window": "1s"}"#).unwrap();
        assert_eq!(*c.sync_interval, Duration::from_millis(166));
        // more hedges than a quiet worker keeps tokens: allowed, said
        let c = Config::parse(br#"{"budget_burst": 2, "max_hedges": 3}"#).unwrap();
        assert!(
            c.warnings.iter().any(|w| w.starts_with("max_hedges")),
            "{:?}",
            c.warnings
        );
        // a route's overrides answer to the same limits
        let config = Config::parse(b"{}").unwrap();
        let base = config.policy_for("backend");
        let json = serde_json::json!({"min_samples": 50000});
        let mut warnings = Vec::new();
        config
            .route_policy(
                &base,
                json,
                "filter_metadata.adaptive_hedge.",
                &mut warnings,
            )
            .unwrap();
        assert!(
            warnings
                .iter()
                .any(|w| w.starts_with("filter_metadata.adaptive_hedge.min_samples")),
            "{warnings:?}"
        );
    }

    /// A route's metadata may turn hedging off or to shadow for its route,
    /// never back on where the plugin's configuration turned it off: that
    /// is the switch an operator reaches for in an incident.
    #[test]
    fn a_route_cannot_switch_on_what_the_plugin_turned_off() {
        let prefix = "filter_metadata.adaptive_hedge.";
        for (plugin, route, said) in [
            (
                r#"{"disabled": true}"#,
                serde_json::json!({"disabled": false}),
                "disabled",
            ),
            (
                r#"{"clusters": {"backend": {"disabled": true}}}"#,
                serde_json::json!({"disabled": false, "budget_percent": 50}),
                "disabled",
            ),
            (
                r#"{"mode": "shadow"}"#,
                serde_json::json!({"mode": "hedge"}),
                "mode",
            ),
            (
                r#"{"clusters": {"backend": {"disabled": true, "host_choice": false}}}"#,
                serde_json::json!({"host_choice": true}),
                "host_choice",
            ),
        ] {
            let config = Config::parse(plugin.as_bytes()).unwrap();
            let base = config.policy_for("backend");
            let mut warnings = Vec::new();
            let policy = config
                .route_policy(&base, route, prefix, &mut warnings)
                .unwrap();
            assert_eq!(policy.disabled, base.disabled, "{plugin}");
            assert_eq!(policy.mode, base.mode, "{plugin}");
            assert_eq!(policy.host_choice, base.host_choice, "{plugin}");
            assert!(
                warnings
                    .iter()
                    .any(|w| w.starts_with(&format!("{prefix}{said}"))),
                "{plugin}: {warnings:?}"
            );
        }
        // and off, or to shadow, for its route alone
        let config = Config::parse(b"{}").unwrap();
        let base = config.policy_for("backend");
        let route = serde_json::json!({"disabled": true, "mode": "shadow", "host_choice": false});
        let policy = config
            .route_policy(&base, route, prefix, &mut Vec::new())
            .unwrap();
        assert!(policy.disabled && policy.mode == Mode::Shadow && !policy.host_choice);
    }

    #[test]
    fn the_host_header_is_no_header_clients_send_for_other_reasons() {
        for name in [
            "authorization",
            "host",
            "cookie",
            "content-type",
            "x-forwarded-for",
            "traceparent",
        ] {
            let json = format!(r#"{{"host_header": "{name}"}}"#);
            let line = err(&json).to_string();
            assert!(
                line.contains("\"host_header\"") && line.contains("other reasons"),
                "{line}"
            );
        }
        assert!(Config::parse(br#"{"host_header": "x-my-endpoint"}"#).is_ok());
    }

    #[test]
    fn error_line_has_value_and_rule() {
        let line = err(r#"{"percentile": 1.5}"#).to_string();
        assert_eq!(
            line,
            "invalid plugin config: field \"percentile\" = 1.5: must be strictly between 0 and 1 (0.9 = p90)"
        );
        let line = err(r#"{"min_delay": "50ms", "max_delay": "10ms"}"#).to_string();
        assert!(
            line.contains("min_delay (50ms) must not exceed max_delay (10ms)"),
            "{line}"
        );
        let line = err(r#"{"idempotent_methods": ["GET", "get"]}"#).to_string();
        assert!(line.contains("\"get\": methods are upper-case"), "{line}");
        let line = err(r#"{"min_delay": "5"}"#).to_string();
        assert!(line.contains("has no unit"), "{line}");
    }

    #[test]
    fn not_json_is_an_error() {
        let e = err("percentile: 0.9");
        assert!(e.to_string().contains("invalid plugin config"));
        let e = err("[1,2]");
        assert!(e.to_string().contains("invalid plugin config"));
    }

    #[test]
    fn risky_but_legal_settings_warn() {
        let c = Config::parse(
            br#"{"idempotent_methods": ["GET", "POST"], "trust_client_headers": true}"#,
        )
        .unwrap();
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        let c =
            Config::parse(br#"{"clusters": {"w": {"idempotent_methods": ["PATCH"]}}}"#).unwrap();
        assert!(c.warnings[0].starts_with("clusters.w.idempotent_methods"));
        // said once, where it is written, not again for each override
        let c = Config::parse(
            br#"{"idempotent_methods": ["GET", "POST"], "clusters": {"a": {"disabled": true}}}"#,
        )
        .unwrap();
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        let c = Config::parse(br#"{"disabled": true}"#).unwrap();
        assert_eq!(c.warnings.len(), 1);
    }

    /// Any HTTP method token without lower case: M-SEARCH (UPnP) and
    /// VERSION-CONTROL (WebDAV) hold a '-'.
    #[test]
    fn methods_are_upper_case_tokens() {
        let c = Config::parse(br#"{"idempotent_methods": ["GET", "M-SEARCH", "VERSION-CONTROL"]}"#)
            .unwrap();
        assert!(c.defaults.allows_method(b"M-SEARCH"));
        for bad in ["Get", "G ET", "GET/", "123", "-", "GET\u{e9}", ""] {
            let json = format!(r#"{{"idempotent_methods": ["{bad}"]}}"#);
            let e = Config::parse(json.as_bytes()).unwrap_err().to_string();
            assert!(e.contains("idempotent_methods"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn grpc_retry_on_may_be_none() {
        let c = Config::parse(br#"{"grpc_retry_on": " "}"#).unwrap();
        assert_eq!(&*c.defaults.grpc_retry_on, "");
        let c = Config::parse(br#"{"grpc_retry_on": "unavailable , internal"}"#).unwrap();
        assert_eq!(&*c.defaults.grpc_retry_on, "unavailable,internal");
    }

    #[test]
    fn methods_match_exactly() {
        let p = ClusterPolicy::default();
        assert!(p.allows_method(b"GET"));
        assert!(p.allows_method(b"HEAD"));
        assert!(!p.allows_method(b"get"));
        assert!(!p.allows_method(b"POST"));
        assert!(!p.allows_method(b"DELETE"));
    }

    /// A route's own `max_routes` does nothing (a route with overrides is
    /// hedged as its own cluster): said, not silently dropped.
    #[test]
    fn a_route_s_max_routes_is_ignored_with_a_warning() {
        let base = Config::parse(b"{}").unwrap().policy_for("backend");
        let prefix = "filter_metadata.adaptive_hedge.";
        let mut warnings = Vec::new();
        let json = serde_json::json!({"max_routes": 4, "percentile": 0.95});
        let config = Config::parse(b"{}").unwrap();
        let policy = config
            .route_policy(&base, json, prefix, &mut warnings)
            .unwrap();
        assert_eq!(policy.max_routes, 0);
        assert!(
            warnings
                .iter()
                .any(|w| w.starts_with(prefix) && w.contains("max_routes")),
            "{warnings:?}"
        );
        let mut quiet = Vec::new();
        let json = serde_json::json!({"percentile": 0.95});
        config
            .route_policy(&base, json, prefix, &mut quiet)
            .unwrap();
        assert!(quiet.is_empty(), "{quiet:?}");
    }

    /// The README's configuration table has one row per setting, each with
    /// the default the code uses.
    #[test]
    fn readme_lists_every_setting_with_its_default() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"),
        )
        .unwrap();
        let rows: Vec<(String, String)> = readme
            .lines()
            .skip_while(|l| !l.starts_with("| field | default |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (
                    cells[1].trim_matches('`').to_string(),
                    cells[2].trim_matches('`').to_string(),
                )
            })
            .collect();
        let effective: serde_json::Value =
            serde_json::from_str(&Config::default().effective_json()).unwrap();
        let fields = effective.as_object().unwrap();
        let mut got: Vec<&str> = rows.iter().map(|(n, _)| n.as_str()).collect();
        got.sort();
        let mut want: Vec<&str> = fields.keys().map(String::as_str).collect();
        want.sort();
        assert_eq!(got, want, "README configuration table vs the code");
        for (name, default) in &rows {
            let written: serde_json::Value = serde_json::from_str(default)
                .unwrap_or_else(|e| panic!("README default of {name}: {default}: {e}"));
            let code = &fields[name.as_str()];
            let same = match (written.as_f64(), code.as_f64()) {
                (Some(a), Some(b)) => a == b,
                _ => &written == code,
            };
            assert!(same, "README says {name} = {written}, the code {code}");
        }
    }
}

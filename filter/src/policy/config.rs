//! Plugin configuration: parsed with serde, validated once into an immutable
//! [`Config`] that every request shares. Every error names the field, the
//! value and the rule, so an operator can fix a rejected config from the log.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration::{format_duration, parse_duration};

/// Which moment of the response is the latency sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LatencySignal {
    /// Response headers: right for ordinary request/response APIs.
    Headers,
    /// First body chunk: time to first token for streaming upstreams.
    FirstByte,
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

/// How the hedging of one upstream cluster behaves (the defaults, or a
/// cluster's override merged over them).
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterPolicy {
    pub disabled: bool,
    /// Hedge after this quantile of the cluster's latency (0.9 = p90).
    pub percentile: f64,
    /// Extra attempts allowed per request received (0.10 = 10%).
    pub budget_share: f64,
    /// Tokens a worker (and the shared pool) may save up while idle.
    pub budget_burst: f64,
    pub min_delay: Duration,
    pub max_delay: Duration,
    /// Hedges per request (`x-envoy-max-retries`).
    pub max_hedges: u32,
    /// Samples the window must hold (all workers together) before hedging.
    pub min_samples: u64,
    pub idempotent_methods: Vec<String>,
    pub retry_on: String,
}

impl Default for ClusterPolicy {
    fn default() -> Self {
        ClusterPolicy {
            disabled: false,
            percentile: 0.9,
            budget_share: 0.10,
            budget_burst: 10.0,
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_secs(10),
            max_hedges: 1,
            min_samples: 100,
            idempotent_methods: vec!["GET".into(), "HEAD".into(), "OPTIONS".into()],
            retry_on: "5xx".into(),
        }
    }
}

impl ClusterPolicy {
    pub fn allows_method(&self, method: &[u8]) -> bool {
        self.idempotent_methods
            .iter()
            .any(|m| m.as_bytes() == method)
    }
}

/// The validated configuration of one plugin instance.
#[derive(Clone, Debug)]
pub struct Config {
    pub role: Role,
    pub defaults: Arc<ClusterPolicy>,
    pub clusters: HashMap<String, Arc<ClusterPolicy>>,
    /// Length of the rolling latency window.
    pub window: Duration,
    /// How often each worker merges into shared memory and refreshes its delays.
    pub sync_interval: Duration,
    pub latency_signal: LatencySignal,
    /// Keep client-sent `x-envoy-*` retry/hedge headers instead of removing them.
    pub trust_client_headers: bool,
    /// Clusters tracked at most; past it new clusters pass through unhedged.
    pub max_clusters: usize,
    /// Add `x-adaptive-hedge` to responses (the decision, for debugging).
    pub debug_header: bool,
    /// Things that are allowed but worth a line in the log.
    pub warnings: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            role: Role::Downstream,
            defaults: Arc::new(ClusterPolicy::default()),
            clusters: HashMap::new(),
            window: Duration::from_secs(30),
            sync_interval: Duration::from_millis(200),
            latency_signal: LatencySignal::Headers,
            trust_client_headers: false,
            max_clusters: 1000,
            debug_header: false,
            warnings: Vec::new(),
        }
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

/// Fields that may be set at the top level and per cluster.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    disabled: Option<bool>,
    percentile: Option<f64>,
    budget_percent: Option<f64>,
    budget_burst: Option<f64>,
    min_delay: Option<String>,
    max_delay: Option<String>,
    max_hedges: Option<u32>,
    min_samples: Option<u64>,
    idempotent_methods: Option<Vec<String>>,
    retry_on: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    role: Option<Role>,
    // The per-cluster fields again (serde's `flatten` would lose
    // `deny_unknown_fields` and the field paths in errors).
    disabled: Option<bool>,
    percentile: Option<f64>,
    budget_percent: Option<f64>,
    budget_burst: Option<f64>,
    min_delay: Option<String>,
    max_delay: Option<String>,
    max_hedges: Option<u32>,
    min_samples: Option<u64>,
    idempotent_methods: Option<Vec<String>>,
    retry_on: Option<String>,
    window: Option<String>,
    sync_interval: Option<String>,
    latency_signal: Option<LatencySignal>,
    trust_client_headers: Option<bool>,
    max_clusters: Option<usize>,
    debug_header: Option<bool>,
    clusters: Option<BTreeMap<String, RawPolicy>>,
}

impl RawConfig {
    /// The fields given besides `role`, in the order they are declared.
    fn set_fields(&self) -> Vec<&'static str> {
        [
            ("disabled", self.disabled.is_some()),
            ("percentile", self.percentile.is_some()),
            ("budget_percent", self.budget_percent.is_some()),
            ("budget_burst", self.budget_burst.is_some()),
            ("min_delay", self.min_delay.is_some()),
            ("max_delay", self.max_delay.is_some()),
            ("max_hedges", self.max_hedges.is_some()),
            ("min_samples", self.min_samples.is_some()),
            ("idempotent_methods", self.idempotent_methods.is_some()),
            ("retry_on", self.retry_on.is_some()),
            ("window", self.window.is_some()),
            ("sync_interval", self.sync_interval.is_some()),
            ("latency_signal", self.latency_signal.is_some()),
            ("trust_client_headers", self.trust_client_headers.is_some()),
            ("max_clusters", self.max_clusters.is_some()),
            ("debug_header", self.debug_header.is_some()),
            ("clusters", self.clusters.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect()
    }

    fn policy(&self) -> RawPolicy {
        RawPolicy {
            disabled: self.disabled,
            percentile: self.percentile,
            budget_percent: self.budget_percent,
            budget_burst: self.budget_burst,
            min_delay: self.min_delay.clone(),
            max_delay: self.max_delay.clone(),
            max_hedges: self.max_hedges,
            min_samples: self.min_samples,
            idempotent_methods: self.idempotent_methods.clone(),
            retry_on: self.retry_on.clone(),
        }
    }
}

impl Config {
    /// Parses and validates the plugin configuration. Empty (or only white
    /// space) means every default.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        if bytes.iter().all(|b| b.is_ascii_whitespace()) {
            return Ok(Config::default());
        }
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let raw: RawConfig = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." {
                "(root)".to_string()
            } else {
                path
            };
            error(&field, "", e.inner().to_string())
        })?;
        Self::validate(raw)
    }

    fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
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
        let defaults = merge_policy(&ClusterPolicy::default(), &raw.policy(), "", &mut warnings)?;
        if raw.disabled == Some(true) {
            warnings.push("\"disabled\": true at the top level turns hedging off for every cluster without an override".into());
        }

        if let Some(text) = &raw.window {
            let window = duration_field("window", text)?;
            if window < Duration::from_secs(1) || window > Duration::from_secs(600) {
                return Err(error("window", quoted(text), "must be between 1s and 10m"));
            }
            config.window = window;
        }
        if let Some(text) = &raw.sync_interval {
            let interval = duration_field("sync_interval", text)?;
            if interval < Duration::from_millis(10) || interval > Duration::from_secs(10) {
                return Err(error(
                    "sync_interval",
                    quoted(text),
                    "must be between 10ms and 10s",
                ));
            }
            config.sync_interval = interval;
        }
        let slice = config.window / super::window::SLICES as u32;
        if config.sync_interval > slice {
            return Err(error(
                "sync_interval",
                quoted(&format_duration(config.sync_interval)),
                format!(
                    "must not exceed window / {} = {} (the window ages out in {} steps)",
                    super::window::SLICES,
                    format_duration(slice),
                    super::window::SLICES
                ),
            ));
        }
        if let Some(signal) = raw.latency_signal {
            config.latency_signal = signal;
            if signal == LatencySignal::FirstByte {
                warnings.push(format!("latency_signal is first_byte: streamed responses are hedged only on clusters that also run this module with {{\"role\": \"upstream\"}} (it holds armed requests' 2xx headers, marked with {}, until the first body byte)", super::hold::FIRST_BYTE_MARKER));
            }
        }
        if let Some(trust) = raw.trust_client_headers {
            config.trust_client_headers = trust;
            if trust {
                warnings.push("trust_client_headers is on: clients can switch on retries and hedges themselves".into());
            }
        }
        if let Some(max) = raw.max_clusters {
            if !(1..=100_000).contains(&max) {
                return Err(error("max_clusters", max, "must be between 1 and 100000"));
            }
            config.max_clusters = max;
        }
        if let Some(debug) = raw.debug_header {
            config.debug_header = debug;
        }
        for (name, raw_override) in raw.clusters.iter().flatten() {
            if name.is_empty() {
                return Err(error("clusters", "\"\"", "cluster names must not be empty"));
            }
            let prefix = format!("clusters.{name}.");
            let policy = merge_policy(&defaults, raw_override, &prefix, &mut warnings)?;
            config.clusters.insert(name.clone(), Arc::new(policy));
        }
        config.defaults = Arc::new(defaults);
        config.warnings = warnings;
        Ok(config)
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
            return serde_json::json!({ "role": Role::Upstream }).to_string();
        }
        let clusters: BTreeMap<&str, serde_json::Value> = self
            .clusters
            .iter()
            .map(|(name, policy)| (name.as_str(), policy_json(policy)))
            .collect();
        let mut root = policy_json(&self.defaults);
        if let serde_json::Value::Object(map) = &mut root {
            map.insert(
                "role".into(),
                serde_json::to_value(self.role).unwrap_or_default(),
            );
            map.insert("window".into(), format_duration(self.window).into());
            map.insert(
                "sync_interval".into(),
                format_duration(self.sync_interval).into(),
            );
            map.insert(
                "latency_signal".into(),
                serde_json::to_value(self.latency_signal).unwrap_or_default(),
            );
            map.insert(
                "trust_client_headers".into(),
                self.trust_client_headers.into(),
            );
            map.insert("max_clusters".into(), self.max_clusters.into());
            map.insert("debug_header".into(), self.debug_header.into());
            map.insert(
                "clusters".into(),
                serde_json::to_value(clusters).unwrap_or_default(),
            );
        }
        root.to_string()
    }
}

fn policy_json(p: &ClusterPolicy) -> serde_json::Value {
    serde_json::json!({
        "disabled": p.disabled,
        "percentile": p.percentile,
        "budget_percent": p.budget_share * 100.0,
        "budget_burst": p.budget_burst,
        "min_delay": format_duration(p.min_delay),
        "max_delay": format_duration(p.max_delay),
        "max_hedges": p.max_hedges,
        "min_samples": p.min_samples,
        "idempotent_methods": p.idempotent_methods,
        "retry_on": p.retry_on,
    })
}

fn quoted(text: &str) -> String {
    format!("\"{text}\"")
}

fn duration_field(field: &str, text: &str) -> Result<Duration, ConfigError> {
    parse_duration(text).map_err(|why| error(field, quoted(text), why))
}

/// Applies `raw` over `base`; field names in errors carry `prefix`
/// ("clusters.<name>.") so an override's mistake points at the override.
fn merge_policy(
    base: &ClusterPolicy,
    raw: &RawPolicy,
    prefix: &str,
    warnings: &mut Vec<String>,
) -> Result<ClusterPolicy, ConfigError> {
    let field = |name: &str| format!("{prefix}{name}");
    let mut p = base.clone();
    if let Some(disabled) = raw.disabled {
        p.disabled = disabled;
    }
    if let Some(q) = raw.percentile {
        if !(q > 0.0 && q < 1.0) {
            return Err(error(
                &field("percentile"),
                q,
                "must be strictly between 0 and 1 (0.9 = p90)",
            ));
        }
        p.percentile = q;
    }
    if let Some(pct) = raw.budget_percent {
        if !(pct > 0.0 && pct <= 100.0) {
            return Err(error(
                &field("budget_percent"),
                pct,
                "must be greater than 0 and at most 100",
            ));
        }
        p.budget_share = pct / 100.0;
    }
    if let Some(burst) = raw.budget_burst {
        if !(1.0..=10_000.0).contains(&burst) {
            return Err(error(
                &field("budget_burst"),
                burst,
                "must be between 1 and 10000 tokens",
            ));
        }
        p.budget_burst = burst;
    }
    if let Some(text) = &raw.min_delay {
        p.min_delay = duration_field(&field("min_delay"), text)?;
        if p.min_delay < Duration::from_millis(1) {
            return Err(error(
                &field("min_delay"),
                quoted(text),
                "must be at least 1ms (Envoy's per-try timeout has millisecond resolution)",
            ));
        }
    }
    if let Some(text) = &raw.max_delay {
        p.max_delay = duration_field(&field("max_delay"), text)?;
        if p.max_delay > Duration::from_secs(300) {
            return Err(error(
                &field("max_delay"),
                quoted(text),
                "must be at most 5m",
            ));
        }
    }
    if p.min_delay > p.max_delay {
        let name = if raw.max_delay.is_some() {
            "max_delay"
        } else {
            "min_delay"
        };
        return Err(error(
            &field(name),
            quoted(&format_duration(if name == "max_delay" {
                p.max_delay
            } else {
                p.min_delay
            })),
            format!(
                "min_delay ({}) must not exceed max_delay ({})",
                format_duration(p.min_delay),
                format_duration(p.max_delay)
            ),
        ));
    }
    if let Some(hedges) = raw.max_hedges {
        if !(1..=5).contains(&hedges) {
            return Err(error(
                &field("max_hedges"),
                hedges,
                "must be between 1 and 5 (use \"disabled\": true to turn hedging off)",
            ));
        }
        p.max_hedges = hedges;
    }
    if let Some(n) = raw.min_samples {
        if !(1..=1_000_000).contains(&n) {
            return Err(error(
                &field("min_samples"),
                n,
                "must be between 1 and 1000000",
            ));
        }
        p.min_samples = n;
    }
    if let Some(methods) = &raw.idempotent_methods {
        if methods.is_empty() {
            return Err(error(
                &field("idempotent_methods"),
                "[]",
                "must list at least one method (use \"disabled\": true to turn hedging off)",
            ));
        }
        for m in methods {
            if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(error(
                    &field("idempotent_methods"),
                    quoted(m),
                    "methods are upper-case tokens such as \"GET\"",
                ));
            }
            if m == "CONNECT" {
                return Err(error(
                    &field("idempotent_methods"),
                    quoted(m),
                    "a CONNECT tunnel cannot be duplicated",
                ));
            }
            if NON_IDEMPOTENT_METHODS.contains(&m.as_str()) {
                warnings.push(format!(
                    "{}: {m} is not idempotent in general; hedging it may apply a request twice",
                    field("idempotent_methods")
                ));
            }
        }
        p.idempotent_methods = methods.clone();
    }
    if let Some(retry_on) = &raw.retry_on {
        let values: Vec<&str> = retry_on.split(',').map(str::trim).collect();
        if values.iter().any(|v| !RETRY_ON_VALUES.contains(v)) {
            return Err(error(
                &field("retry_on"),
                quoted(retry_on),
                format!(
                    "must be a comma-separated list of Envoy retry-on values ({})",
                    RETRY_ON_VALUES.join(", ")
                ),
            ));
        }
        p.retry_on = values.join(",");
    }
    Ok(p)
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
        for field in ["percentile", "latency_signal", "clusters"] {
            let value = match field {
                "percentile" => "0.9",
                "latency_signal" => "\"first_byte\"",
                _ => "{}",
            };
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

    #[test]
    fn empty_means_defaults() {
        for empty in ["", "  \n", "{}"] {
            let c = Config::parse(empty.as_bytes()).unwrap();
            assert_eq!(*c.defaults, ClusterPolicy::default());
            assert_eq!(c.window, Duration::from_secs(30));
            assert_eq!(c.latency_signal, LatencySignal::Headers);
            assert!(!c.trust_client_headers);
            assert_eq!(c.max_clusters, 1000);
        }
    }

    #[test]
    fn full_config_with_override() {
        let c = Config::parse(
            br#"{"percentile": 0.95, "budget_percent": 5, "min_delay": "2ms", "max_delay": "2s",
                "max_hedges": 2, "window": "12s", "min_samples": 50,
                "idempotent_methods": ["GET"], "retry_on": "5xx,reset",
                "latency_signal": "first_byte", "trust_client_headers": true, "max_clusters": 10,
                "clusters": {"slow": {"percentile": 0.99}, "off": {"disabled": true}}}"#,
        )
        .unwrap();
        assert_eq!(c.defaults.percentile, 0.95);
        assert!((c.defaults.budget_share - 0.05).abs() < 1e-12);
        assert_eq!(c.defaults.max_hedges, 2);
        assert_eq!(c.defaults.retry_on, "5xx,reset");
        assert_eq!(c.latency_signal, LatencySignal::FirstByte);
        let slow = c.policy_for("slow");
        assert_eq!(slow.percentile, 0.99);
        // an override inherits everything it does not set
        assert_eq!(slow.min_delay, Duration::from_millis(2));
        assert!(c.policy_for("off").disabled);
        assert_eq!(c.policy_for("other").percentile, 0.95);
        assert!(c.effective_json().contains("\"percentile\":0.95"));
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
            (r#"{"min_delay": "50ms", "max_delay": "10ms"}"#, "max_delay"),
            (r#"{"max_hedges": 0}"#, "max_hedges"),
            (r#"{"max_hedges": -1}"#, "max_hedges"),
            (r#"{"min_samples": 0}"#, "min_samples"),
            (r#"{"window": "10ms"}"#, "window"),
            (r#"{"sync_interval": "1ms"}"#, "sync_interval"),
            (
                r#"{"window": "2s", "sync_interval": "1s"}"#,
                "sync_interval",
            ),
            (r#"{"idempotent_methods": []}"#, "idempotent_methods"),
            (r#"{"idempotent_methods": ["get"]}"#, "idempotent_methods"),
            (
                r#"{"idempotent_methods": ["CONNECT"]}"#,
                "idempotent_methods",
            ),
            (r#"{"retry_on": "sometimes"}"#, "retry_on"),
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
                r#"{"clusters": {"a": {"min_delay": "30s"}}}"#,
                "clusters.a.min_delay",
            ),
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
        assert_eq!(c.warnings.len(), 2);
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
}

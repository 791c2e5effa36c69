//! Static checks of configs that load adaptive-hedge: Envoy bootstrap YAML,
//! and Kubernetes manifests that embed Envoy config (Istio `WasmPlugin` and
//! `EnvoyFilter`, Envoy Gateway policies). `make check-configs` runs them
//! over `envoy-configs/`; the `check-configs` binary takes any file.
//!
//! Why: the first-byte mode's worst mistake is silent. An upstream-role
//! filter without `allow_on_headers_stop_iteration: true` starts without
//! error and then hangs every armed streamed request until the route
//! timeout; nothing inside the module can read that flag.

use adaptive_hedge::policy::config::{Config, LatencySignal, Role};
use serde::Deserialize;
use serde_norway::Value;

/// What a file's check found.
#[derive(Debug, Default)]
pub struct Report {
    /// Each stops the config from working as meant.
    pub problems: Vec<String>,
    /// Worth knowing; may be fine across files.
    pub warnings: Vec<String>,
    /// Instances of the module found (downstream, upstream).
    pub downstream: usize,
    pub upstream: usize,
}

/// Checks every YAML document in `text`.
pub fn check(text: &str) -> Report {
    let mut report = Report::default();
    let mut first_byte = false;
    for (n, document) in serde_norway::Deserializer::from_str(text).enumerate() {
        let value = match Value::deserialize(document) {
            Ok(v) => v,
            Err(e) => {
                report
                    .problems
                    .push(format!("document {}: not YAML: {e}", n + 1));
                continue;
            }
        };
        let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
        let mut path = vec![format!(
            "document {}{}",
            n + 1,
            if kind.is_empty() {
                String::new()
            } else {
                format!(" ({kind})")
            }
        )];
        walk(&value, &mut path, kind, &mut report, &mut first_byte);
    }
    if first_byte && report.upstream == 0 {
        report.warnings.push(
            "latency_signal is first_byte but no {\"role\": \"upstream\"} filter is configured here: streamed responses are not hedged unless a cluster runs it (elsewhere)".into(),
        );
    }
    report
}

fn walk(
    value: &Value,
    path: &mut Vec<String>,
    kind: &str,
    report: &mut Report,
    first_byte: &mut bool,
) {
    match value {
        Value::Mapping(map) => {
            if let Some(plugin) = plugin_config(value, kind) {
                inspect(value, &plugin, path, kind, report, first_byte);
            }
            check_upstream_chain(value, path, report);
            check_outlier_detection(value, path, report);
            // A JSON patch (`{op, path, value}`) puts its target in a string.
            let patch_path = value
                .get("path")
                .and_then(Value::as_str)
                .map(str::to_string);
            for (key, child) in map {
                let key = key
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("{key:?}"));
                let label = match (&patch_path, key.as_str()) {
                    (Some(p), "value") => format!("value@{p}"),
                    _ => key,
                };
                path.push(label);
                walk(child, path, kind, report, first_byte);
                path.pop();
            }
        }
        Value::Sequence(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(format!("[{i}]"));
                walk(item, path, kind, report, first_byte);
                path.pop();
            }
        }
        _ => {}
    }
}

/// The plugin configuration text of an instance of this module, if `value`
/// is one: an Envoy `PluginConfig` (`configuration` beside a `vm_config`
/// whose code is adaptive_hedge), an Istio `WasmPlugin` spec or an Envoy
/// Gateway `EnvoyExtensionPolicy` wasm entry.
fn plugin_config(value: &Value, kind: &str) -> Option<String> {
    let ours = |v: &Value| {
        serde_norway::to_string(v)
            .is_ok_and(|t| t.contains("adaptive_hedge") || t.contains("adaptive-hedge"))
    };
    // (kind, a key only its wasm entry has, the key of the plugin config)
    let manifest_entry = [
        ("WasmPlugin", "url", "pluginConfig"),
        ("EnvoyExtensionPolicy", "code", "config"),
    ]
    .into_iter()
    .find(|(k, marker, _)| *k == kind && value.get(marker).is_some());
    if let Some((_, _, config_key)) = manifest_entry {
        if !ours(value) {
            return None;
        }
        return Some(
            value
                .get(config_key)
                .map(|config| serde_json::to_string(config).unwrap_or_default())
                .unwrap_or_default(),
        );
    }
    let code = value.get("vm_config")?;
    if !ours(code) {
        return None;
    }
    Some(match value.get("configuration") {
        Some(Value::String(s)) => s.clone(),
        Some(c) => c
            .get("value")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        None => String::new(),
    })
}

fn inspect(
    value: &Value,
    plugin: &str,
    path: &[String],
    kind: &str,
    report: &mut Report,
    first_byte: &mut bool,
) {
    let at = path.join(".");
    let config = match Config::parse(plugin.as_bytes()) {
        Ok(c) => c,
        Err(e) => {
            report
                .problems
                .push(format!("{at}: Envoy would refuse it: {e}"));
            return;
        }
    };
    let in_cluster = path
        .iter()
        .any(|p| p.contains("typed_extension_protocol_options"));
    match config.role {
        Role::Downstream => {
            report.downstream += 1;
            *first_byte |= config.latency_signal == LatencySignal::FirstByte;
            if in_cluster {
                report.problems.push(format!(
                    "{at}: the downstream role in a cluster's http_filters does nothing there; use {{\"role\": \"upstream\"}}"
                ));
            }
        }
        Role::Upstream => {
            report.upstream += 1;
            if kind == "WasmPlugin" || kind == "EnvoyExtensionPolicy" {
                report.problems.push(format!(
                    "{at}: a {kind} installs HTTP connection manager (downstream) filters only; the upstream role needs the cluster's http_filters (Istio: an EnvoyFilter patching the CLUSTER; Envoy Gateway: an EnvoyPatchPolicy)"
                ));
                return;
            }
            if !in_cluster {
                report.problems.push(format!(
                    "{at}: the upstream role must be in a cluster's HttpProtocolOptions.http_filters, not the HTTP connection manager's"
                ));
            }
            if value
                .get("allow_on_headers_stop_iteration")
                .and_then(Value::as_bool)
                != Some(true)
            {
                report.problems.push(format!(
                    "{at}: the upstream role needs \"allow_on_headers_stop_iteration: true\" beside its configuration; without it every armed streamed request hangs until the route timeout"
                ));
            }
        }
    }
}

/// Outlier detection (an Envoy cluster's, an Istio `DestinationRule`'s, an
/// Envoy Gateway passive health check) that splits local-origin errors
/// counts every fired per-try timeout, which is what a hedge is, as a
/// local-origin failure (without the split, armed requests make it a 204:
/// no failure). Fewer than 10 in a row (Envoy's default is 5) can then
/// eject healthy hosts when a whole cluster slows at once
/// (docs/deployment.md, outlier detection).
fn check_outlier_detection(value: &Value, path: &[String], report: &mut Report) {
    /// Envoy's `consecutive_local_origin_failure` when not set.
    const ENVOY_DEFAULT: u64 = 5;
    let in_health_check = path.last().is_some_and(|p| p == "healthCheck");
    for (key, split, failures) in [
        (
            "outlier_detection",
            "split_external_local_origin_errors",
            "consecutive_local_origin_failure",
        ),
        (
            "outlierDetection",
            "splitExternalLocalOriginErrors",
            "consecutiveLocalOriginFailures",
        ),
        (
            "passive",
            "splitExternalLocalOriginErrors",
            "consecutiveLocalOriginFailures",
        ),
    ] {
        if key == "passive" && !in_health_check {
            continue;
        }
        let Some(detection) = value.get(key).filter(|v| v.is_mapping()) else {
            continue;
        };
        if detection.get(split).and_then(Value::as_bool) != Some(true) {
            continue;
        }
        let count = detection
            .get(failures)
            .and_then(Value::as_u64)
            .unwrap_or(ENVOY_DEFAULT);
        if count < MIN_LOCAL_ORIGIN_FAILURES {
            report.warnings.push(format!(
                "{}.{key}: with {split} every hedge's fired per-try timeout is a local-origin failure, and {failures} at {count} (under {MIN_LOCAL_ORIGIN_FAILURES}) can have healthy hosts ejected when a cluster slows all at once (docs/deployment.md#outlier-detection)",
                path.join(".")
            ));
        }
    }
}

/// With the local-origin split: the failures in a row that leave twice the
/// margin of a brownout's burst of timeouts (docs/design.md).
const MIN_LOCAL_ORIGIN_FAILURES: u64 = 10;

/// A cluster's upstream filter chain must end with the upstream codec.
fn check_upstream_chain(value: &Value, path: &[String], report: &mut Report) {
    let Some(filters) = value.get("http_filters").and_then(Value::as_sequence) else {
        return;
    };
    let is_cluster_chain = path
        .last()
        .is_some_and(|p| p.contains("HttpProtocolOptions"))
        || value
            .get("@type")
            .and_then(Value::as_str)
            .is_some_and(|t| t.ends_with("upstreams.http.v3.HttpProtocolOptions"));
    if !is_cluster_chain {
        return;
    }
    let last = filters
        .last()
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str);
    if last != Some("envoy.filters.http.upstream_codec") {
        report.problems.push(format!(
            "{}.http_filters: a cluster's filter chain must end with envoy.filters.http.upstream_codec (found {last:?})",
            path.join(".")
        ));
    }
    // A patch that writes a cluster's HttpProtocolOptions replaces the ones
    // the platform generated (an Istio MERGE does not merge inside an Any;
    // a JSON patch "add" replaces the map): without its own protocol
    // selection Envoy refuses the cluster.
    let selects_protocol = [
        "explicit_http_config",
        "use_downstream_protocol_config",
        "auto_config",
    ]
    .iter()
    .any(|k| value.get(*k).is_some());
    if !selects_protocol {
        report.problems.push(format!(
            "{}: HttpProtocolOptions without a protocol selection (explicit_http_config, use_downstream_protocol_config or auto_config): a patch replaces the options the platform generated, protocol included (envoy-configs/istio/streaming.yaml says what Istio writes)",
            path.join(".")
        ));
    }
}

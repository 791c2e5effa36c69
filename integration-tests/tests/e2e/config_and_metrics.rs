//! Configuration errors and metrics, against real Envoy.

use crate::common;

use std::time::Duration;

use integration_tests::harness::envoy::{filter_stat_name, Envoy, EnvoyOptions};
use integration_tests::harness::load;
use integration_tests::harness::sim::{Latency, Simulator};
use integration_tests::harness::{replace_file, RemoveOnDrop};
use integration_tests::runtime;

/// Each mistake makes Envoy refuse to start, and its log names the field.
#[test]
fn bad_configs_are_refused_and_the_log_names_the_field() {
    let cases = [
        (r#"{"percentile": 1.5}"#, r#"field "percentile" = 1.5"#),
        (r#"{"budget_percnt": 10}"#, "budget_percnt"),
        (
            r#"{"min_delay": "50ms", "max_delay": "10ms"}"#,
            r#"field "max_delay""#,
        ),
        (r#"{"window": "forever"}"#, r#"field "window""#),
        (
            r#"{"latency_signal": "trailers"}"#,
            r#"field "latency_signal""#,
        ),
        (
            r#"{"idempotent_methods": ["CONNECT"]}"#,
            r#"field "idempotent_methods""#,
        ),
        (
            r#"{"clusters": {"backend": {"max_hedges": 9}}}"#,
            r#"field "clusters.backend.max_hedges""#,
        ),
        (
            r#"{"max_clusters": 5000}"#,
            r#"field "max_clusters" = 5000: must be between 1 and 1006"#,
        ),
        (
            r#"{"idempotent_grpc_methods": ["demo.Echo/Get"]}"#,
            r#"field "idempotent_grpc_methods""#,
        ),
        ("not json", "invalid plugin config"),
    ];
    for (config, field) in cases {
        let err = match Envoy::start(
            EnvoyOptions::new("envoy.yaml", &[1, 2, 3, 4]).plugin_config(config),
        ) {
            Ok(envoy) => panic!("Envoy started with {config}:\n{}", envoy.log()),
            Err(e) => e,
        };
        assert!(
            err.contains("exited"),
            "{config}: Envoy should exit, not hang: {err}"
        );
        assert!(
            err.contains(field),
            "{config}: the log should name {field}:\n{err}"
        );
    }
}

/// The per-cluster metrics appear at /stats/prometheus with a `cluster`
/// label and the right counts.
#[test]
fn metrics_have_a_cluster_label_and_the_right_counts() {
    let model = Latency::fixed_ms(3);
    let sim = Simulator::start(vec![
        model.clone(),
        model.clone(),
        model.clone(),
        Latency::fixed_ms(20),
    ])
    .unwrap();
    // The three held requests below must find tokens: with a 3 ms upstream
    // the warm-up's own hedges (which, with a busy event loop, fire on far
    // more than the planned 10% of requests) could spend a 50% budget; a
    // 10 ms floor on the delay keeps the warm-up from hedging.
    let envoy = Envoy::start(
        EnvoyOptions::new("envoy.yaml", sim.ports())
            .plugin_config(r#"{"budget_percent": 50, "min_delay": "10ms", "debug_header": true}"#),
    )
    .unwrap();
    let client = load::client();
    let (warm_backend, warm_backend_b) = runtime().block_on(async {
        let backend = common::warm_up(&client, &envoy, "/", 300, 4).await;
        let backend_b = common::warm_up(&client, &envoy, "/b/", 120, 4).await;
        // three requests whose first attempt is held: hedged. Ordinary
        // requests in between, as in real traffic: held requests back to
        // back and nothing else would look like a brownout (every armed
        // request past its delay), where the filter holds back hosts with
        // a per-try timeout standing (see `timeouts`)
        for _ in 0..3 {
            for _ in 0..4 {
                load::request(&client, "GET", &envoy.url("/"), &[])
                    .await
                    .unwrap();
            }
            let r = load::request(
                &client,
                "GET",
                &envoy.url("/"),
                &[("x-sim-first-delay-ms", "300")],
            )
            .await
            .unwrap();
            assert_eq!(
                r.headers.get("x-sim-attempt").map(String::as_str),
                Some("2"),
                "{r:?}\n{}",
                envoy.filter_stats("backend")
            );
        }
        // POSTs: counted, never armed
        for _ in 0..7 {
            let r = load::request(&client, "POST", &envoy.url("/b/"), &[])
                .await
                .unwrap();
            assert_eq!(r.status, 200);
        }
        (backend, backend_b)
    });
    // the warm-ups' requests, the held ones with the ordinary ones between,
    // and the POSTs
    let backend_total = warm_backend as f64 + 3.0 * 5.0;
    let backend_b_total = warm_backend_b as f64 + 7.0;
    // each worker flushes its counters together, on its tick. A worker's
    // first requests to a cluster, before an upstream of it answered, are
    // counted unconfirmed, not the cluster's
    let requests_sent = (backend_total + backend_b_total) as i64;
    // (requests are counted as they start, hedges as they end: the last
    // held request's hedge may be flushed a tick later)
    let stats = envoy.wait_for_stats("every request counted, every hedge settled", |s| {
        let get = |name: &str| s.get(name).copied().unwrap_or(0);
        let backend = |m: &str| get(&filter_stat_name(m, "backend"));
        get(&filter_stat_name("requests_total", "backend"))
            + get(&filter_stat_name("requests_total", "backend-b"))
            + get("wasmcustom.adaptive_hedge.unconfirmed_requests_total")
            == requests_sent
            && backend("hedges_armed_total")
                == backend("hedges_sent_total") + backend("hedges_refunded_total")
    });
    let unconfirmed = stats["wasmcustom.adaptive_hedge.unconfirmed_requests_total"] as f64;
    assert!((1.0..=16.0).contains(&unconfirmed), "{unconfirmed}");
    let (status, prom) = envoy.admin("/stats/prometheus").unwrap();
    assert_eq!(status, 200);
    let value = |metric: &str, cluster: &str| -> f64 {
        let prefix = format!("{metric}{{envoy_cluster_name=\"{cluster}\"}} ");
        prom.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{prefix} missing from /stats/prometheus:\n{prom}"))
    };
    let backend_total = value("adaptive_hedge_requests_total", "backend");
    let backend_b_total = value("adaptive_hedge_requests_total", "backend-b");
    assert_eq!(
        backend_total + backend_b_total + unconfirmed,
        requests_sent as f64,
        "the prometheus view agrees"
    );
    // backend-b: 100 warming up + 7 POSTs were not eligible
    assert!(value("adaptive_hedge_ineligible_total", "backend-b") >= 107.0);
    // sampling is capped per tick (SAMPLES_PER_TICK): never more samples than
    // requests, and at this rate enough to be warm
    let samples = value("adaptive_hedge_window_samples", "backend");
    assert!(
        (100.0..=backend_total).contains(&samples),
        "{samples} samples in the window"
    );
    let armed = value("adaptive_hedge_hedges_armed_total", "backend");
    let exhausted = value("adaptive_hedge_budget_exhausted_total", "backend");
    let ineligible = value("adaptive_hedge_ineligible_total", "backend");
    let paced = value("adaptive_hedge_paced_total", "backend");
    assert_eq!(
        armed + exhausted + ineligible + paced,
        backend_total,
        "every request is armed, refused, paced or ineligible"
    );
    // hedges sent = extra attempts Envoy started; a hedge cancelled while its
    // connection was still being set up (the primary won first) never reaches
    // the upstream, so the upstream may see fewer, never more. How many fewer
    // is the box's timing: backend-b's fixed 20 ms puts its delay just past
    // the answer, where a hedge and the primary's reply cross (4 of 8 hedges
    // never arrived in one run). The three held requests were answered by
    // their hedge, so those three did arrive.
    let sent = value("adaptive_hedge_hedges_sent_total", "backend")
        + value("adaptive_hedge_hedges_sent_total", "backend-b");
    let t = sim.settle(Duration::from_secs(3));
    let extra_arrivals = t.arrivals as f64 - requests_sent as f64;
    assert!(sent >= 3.0, "the three held requests were hedged: {sent}");
    assert!(
        extra_arrivals <= sent,
        "upstream saw {extra_arrivals} extra attempts, filter counted {sent}: {t:?}"
    );
    assert!(
        extra_arrivals >= 3.0,
        "upstream saw {extra_arrivals}, filter counted {sent}: {t:?}"
    );
    // the delays: backend's ~4 ms raised to min_delay, backend-b's ~20 ms learned
    let fast = value("adaptive_hedge_hedge_delay_microseconds", "backend") / 1000.0;
    let slow = value("adaptive_hedge_hedge_delay_microseconds", "backend-b") / 1000.0;
    // upper bounds with room for a noisy box's stalls (the p94 of about
    // 150 samples is their ninth slowest)
    assert!((10.0..30.0).contains(&fast), "backend delay {fast} ms");
    assert!((20.0..80.0).contains(&slow), "backend-b delay {slow} ms");
    // the window's quantiles beside them: backend-b answers in a fixed
    // 20 ms, backend in a few
    let quantiles = |cluster: &str| {
        ["p50", "p90", "p99"]
            .map(|q| value(&format!("adaptive_hedge_latency_{q}_microseconds"), cluster) / 1000.0)
    };
    let [p50, p90, p99] = quantiles("backend-b");
    assert!(
        (19.0..30.0).contains(&p50) && p50 <= p90 && p90 <= p99,
        "backend-b latency p50/p90/p99 {p50}/{p90}/{p99} ms"
    );
    let [p50, _, p99] = quantiles("backend");
    assert!(
        p50 > 0.0 && p50 < 19.0 && p50 <= p99,
        "backend latency p50/p99 {p50}/{p99} ms"
    );
    // the worker-wide counters too
    assert!(
        prom.contains("adaptive_hedge_shared_state_resets_total"),
        "{prom}"
    );
    envoy.assert_no_vm_failure();
}

/// The filter's configuration as an ECDS resource (what Istio sends for a
/// `WasmPlugin`), read by Envoy from a file it watches: `plugin_config` is
/// the filter's JSON.
fn ecds_resource(version: u32, plugin_config: &str) -> String {
    let quoted = serde_json::to_string(plugin_config).unwrap();
    let wasm = integration_tests::harness::envoy::wasm_path();
    format!(
        r#"version_info: "{version}"
resources:
- "@type": type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig
  name: adaptive_hedge
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
    config:
      name: adaptive_hedge
      root_id: adaptive_hedge
      failure_policy: FAIL_OPEN
      configuration:
        "@type": type.googleapis.com/google.protobuf.StringValue
        value: {quoted}
      vm_config:
        vm_id: adaptive_hedge
        runtime: envoy.wasm.runtime.v8
        code:
          local: {{ filename: {} }}
"#,
        wasm.display()
    )
}

/// A new configuration pushed to a running Envoy (through ECDS, as Istio
/// updates a `WasmPlugin`) makes a new plugin in the same VM while the
/// old one drains. The new one hedges at once with what the old one
/// learned (no request unconfirmed or warming up again), the old one
/// hands its budget's tokens over when it goes, and no count is lost or
/// counted twice.
#[test]
fn a_configuration_pushed_at_run_time_hedges_at_once() {
    let model = Latency::fixed_ms(3);
    let sim = Simulator::start(vec![model.clone(), model.clone(), model.clone(), model]).unwrap();
    let dir = std::env::temp_dir().join(format!("adaptive-hedge-ecds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _remove = RemoveOnDrop(dir.clone());
    let resource = dir.join("adaptive_hedge.yaml");
    // the old configuration and the new differ in a setting that changes
    // nothing here; a 10 ms floor keeps the 3 ms upstream from hedging
    let old = r#"{"debug_header": true, "min_delay": "10ms"}"#;
    let new = r#"{"debug_header": true, "min_delay": "10ms", "admin_refresh": "6s"}"#;
    replace_file(&resource, &ecds_resource(1, old)).unwrap();
    // envoy.yaml's filter, its configuration given by ECDS instead of inline
    let text = std::fs::read_to_string(
        integration_tests::harness::envoy::repo_root().join("envoy-configs/envoy.yaml"),
    )
    .unwrap();
    let start = text
        .find("                  - name: envoy.filters.http.wasm\n")
        .unwrap();
    let end = text
        .find("                  - name: envoy.filters.http.router")
        .unwrap();
    let inline = text[start..end].replace(
        "build/adaptive_hedge.wasm",
        &integration_tests::harness::envoy::wasm_path()
            .display()
            .to_string(),
    );
    let discovered = format!(
        "                  - name: adaptive_hedge
                    # the module (filename: adaptive_hedge.wasm) and its configuration come by ECDS
                    config_discovery:
                      config_source:
                        path_config_source:
                          path: {}
                          watched_directory: {{ path: {} }}
                      type_urls: [\"type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm\"]
",
        resource.display(),
        dir.display()
    );
    let envoy = Envoy::start(
        EnvoyOptions::new("envoy.yaml", sim.ports())
            // ECDS asks for a node
            .edit(
                "admin:\n",
                "node: { id: adaptive-hedge-test, cluster: test }\nadmin:\n",
            )
            .edit(&inline, &discovered),
    )
    .unwrap();
    let client = load::client();
    let url = envoy.url("/");
    let requests_total = |s: &std::collections::HashMap<String, i64>| {
        s.get(&filter_stat_name("requests_total", "backend"))
            .copied()
            .unwrap_or(0)
            + s.get("wasmcustom.adaptive_hedge.unconfirmed_requests_total")
                .copied()
                .unwrap_or(0)
    };
    let (sent, decisions) = runtime().block_on(async {
        let mut sent = common::warm_up(&client, &envoy, "/", 300, 4).await;
        // seconds of traffic: each worker saves a reserve
        let r = load::closed_loop(&client, &url, 2, 1500, Duration::from_secs(20)).await;
        assert_eq!(r.ok(), 1500, "{}", r.summary());
        sent += 1500;
        replace_file(&resource, &ecds_resource(2, new)).unwrap();
        // every thread (the main one and both workers) has the new plugin,
        // and the old ones have gone (Envoy ends a plugin once its last
        // stream has)
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let log = envoy.log();
            let threads: std::collections::BTreeSet<&str> = log
                .lines()
                .filter(|l| l.contains("configured:") && l.contains(r#""admin_refresh":"6s""#))
                .filter_map(|l| l.split("][").nth(1))
                .collect();
            if threads.len() >= 3 && log.matches("configuration retired").count() >= 2 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the new configuration not on every thread after 10 s:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // each on a new connection: both workers
        let mut decisions = Vec::new();
        for _ in 0..64 {
            let mut connection = load::Connection::open(envoy.listener_port).await.unwrap();
            let reply = connection.get("/", &[]).await.unwrap();
            assert_eq!(reply.status, 200);
            decisions.push(common::decision(&reply).to_string());
        }
        (sent + 64, decisions)
    });
    let log = envoy.log();
    assert!(
        log.contains("clusters taken up from shared memory"),
        "the new plugin found the old one's clusters:\n{log}"
    );
    assert!(
        log.contains("configuration retired; 1 clusters' budgets handed over"),
        "{log}"
    );
    let learning = decisions
        .iter()
        .filter(|d| {
            d.as_str() == "skipped; reason=warming_up"
                || d.as_str() == "skipped; reason=unconfirmed"
        })
        .count();
    let armed = decisions.iter().filter(|d| d.starts_with("armed")).count();
    assert_eq!(learning, 0, "learned already: {decisions:?}");
    // hedging goes on, paid with the tokens the old plugins handed over:
    // each new one draws them as it takes the cluster up (64 of 64 armed
    // in three runs here; with the hand-over undone, 46: the first
    // requests on each worker refused for tokens until it has earned
    // some; the module before this change: 2 unconfirmed and 36 warming
    // up of 64)
    let exhausted = decisions
        .iter()
        .filter(|d| d.as_str() == "skipped; reason=budget_exhausted")
        .count();
    assert!(
        armed >= 48 && exhausted <= 4,
        "{armed} of 64 armed, {exhausted} refused for tokens: {decisions:?}"
    );
    // every request counted once, by the old plugins (flushed as they
    // went) or the new
    let stats = envoy.wait_for_stats("every request counted", |s| {
        requests_total(s) == sent as i64
    });
    assert_eq!(requests_total(&stats), sent as i64);
    envoy.assert_no_vm_failure();
}

//! The filter among the settings a mesh already has: the routes' own
//! retry policy (Istio's default) is not weakened by arming; shadow mode;
//! per-route control through route metadata.

use crate::common;

use integration_tests::harness::envoy::{filter_stat_name, Envoy, EnvoyOptions, RefusingPort};
use integration_tests::harness::load;
use integration_tests::harness::sim::{Latency, Simulator};
use integration_tests::runtime;
use std::time::{Duration, Instant};

/// Istio's default route retry policy, on both routes of the backend
/// cluster: 2 retries on connect-failure, refused-stream, unavailable,
/// cancelled and 503, never twice on one host.
const ISTIO_RETRIES: &str = r#"                          route:
                            cluster: backend
                            retry_policy:
                              retry_on: connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes
                              retriable_status_codes: [503]
                              num_retries: 2
                              retry_host_predicate:
                                - name: envoy.retry_host_predicates.previous_hosts
                                  typed_config:
                                    "@type": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate
                              host_selection_retry_max_attempts: 5
"#;

/// Client errors (non-200) of 3,000 GETs at 600 req/s after 1,500
/// warm-up requests, through `config` with Istio's retries in front of
/// `ports`, and the filter's stats.
fn client_errors(config: &str, plugin_config: Option<&str>, ports: &[u16]) -> (u64, String) {
    let mut options = EnvoyOptions::new(config, ports).four_backend_hosts().edit(
        "                          route: { cluster: backend }\n",
        ISTIO_RETRIES,
    );
    if let Some(plugin_config) = plugin_config {
        options = options.plugin_config(plugin_config);
    }
    let envoy = Envoy::start(options).unwrap();
    let client = load::client();
    let url = envoy.url("/");
    let run = runtime().block_on(async {
        load::closed_loop(&client, &url, 4, 1500, Duration::from_secs(5)).await;
        load::open_loop(&client, &url, 600.0, 3000, Duration::from_secs(5)).await
    });
    eprintln!("{config}: {}", run.summary());
    let stats = envoy.filter_stats("backend");
    if plugin_config.is_some() {
        let armed = envoy
            .stats()
            .get(&filter_stat_name("hedges_armed_total", "backend"))
            .copied()
            .unwrap_or_default();
        assert!(armed >= 300, "the filter armed {armed}: {stats}");
    }
    envoy.assert_no_vm_failure();
    // the caller's assertions come after this Envoy (and its log) are gone
    let stats = format!(
        "{stats}\n----- envoy log, last 30 lines -----\n{}",
        envoy.log_tail(30)
    );
    (run.sent - run.ok(), stats)
}

/// Client errors without the filter and with it (`route_retries: 2`),
/// hosts answering 503 to `share` of requests, and with `refusing` a
/// fourth host that refuses connections.
fn errors_without_and_with(share: f64, refusing: bool) -> (u64, u64, String) {
    let m = Latency::reference();
    let sim = Simulator::start(vec![m.clone(), m.clone(), m]).unwrap();
    for host in 0..3 {
        sim.set_flaky(host, Some(503), share);
    }
    let mut ports = sim.ports().to_vec();
    // bound, never listening; without `refusing`, a working host again
    let dead = RefusingPort::new();
    ports.push(if refusing { dead.port } else { ports[0] });
    let (without, _) = client_errors("envoy-baseline.yaml", None, &ports);
    let (with, stats) = client_errors(
        "envoy.yaml",
        Some(r#"{"route_retries": 2, "min_samples": 50}"#),
        &ports,
    );
    eprintln!(
        "503 from {:.0}% of requests{}: client errors {without} without the filter, {with} with it",
        100.0 * share,
        if refusing { ", a host refusing" } else { "" }
    );
    (without, with, stats)
}

/// Istio's default retries (3 attempts) in front of flaky hosts: without
/// the filter a request fails when all three attempts fail. Arming
/// replaces the route's `num_retries` with `x-envoy-max-retries`: at one
/// (the hedge alone) a request failed after two attempts (measured: at
/// 50% 503s, errors doubled); with `route_retries: 2` the filter keeps
/// three, and its host choice keeps requests off a host that refuses
/// connections. Allowed: the errors without the filter plus noise (40%
/// and 20 requests): each count is binomial (at 50% 503s about 375 of
/// 3,000, give or take 18, so their difference about 26), and a hedge
/// sent takes one of the three attempts a failure could have retried
/// with. A clean-clone run saw 412 against 344 (20% more), about 1.3
/// standard deviations from the 25% allowed before; losing the route's
/// retries doubles the errors, far past 40%.
#[test]
fn the_routes_retries_are_kept() {
    for (share, refusing) in [(0.5, false), (0.3, true)] {
        let (without, with, stats) = errors_without_and_with(share, refusing);
        assert!(
            without >= 50,
            "the workload should fail some requests: {without}"
        );
        assert!(
            with as f64 <= without as f64 * 1.4 + 20.0,
            "{with} errors with the filter, {without} without: {stats}"
        );
    }
}

/// `mode: shadow` through Envoy: not one upstream attempt more than the
/// client's requests, no host named; the metrics say what hedging would
/// have done: the requests it would have armed, the hedges they would have
/// sent, and the p99 it estimates (well under the p99 the client got).
#[test]
fn a_shadow_adds_no_upstream_attempt_and_says_what_hedging_would_do() {
    let m = Latency::reference();
    let sim = Simulator::start(vec![m.clone(), m.clone(), m]).unwrap();
    let envoy = Envoy::start(
        EnvoyOptions::new("envoy.yaml", sim.ports())
            .plugin_config(r#"{"mode": "shadow", "debug_header": true, "min_samples": 50}"#),
    )
    .unwrap();
    let client = load::client();
    let url = envoy.url("/");
    let (warm_up, run) = runtime().block_on(async {
        let warm_up = common::warm_up(&client, &envoy, "/", 300, 4).await;
        let run = load::open_loop(&client, &url, 300.0, 3000, Duration::from_secs(5)).await;
        (warm_up, run)
    });
    assert_eq!(run.ok(), 3000, "{}", run.summary());
    let counts = sim.settle(Duration::from_secs(3));
    assert_eq!(
        counts.arrivals,
        warm_up + 3000,
        "upstream attempts against client requests: {:?}",
        sim.counts()
    );
    let name = |metric: &str| filter_stat_name(metric, "backend");
    let stats = envoy.wait_for_stats("the shadow's estimate", |s| {
        s.get(&name("shadow_p99_microseconds"))
            .is_some_and(|&us| us > 0)
    });
    let get = |metric: &str| stats.get(&name(metric)).copied().unwrap_or_default();
    let (armed, hedges) = (get("shadow_armed_total"), get("shadow_hedges_total"));
    let report = envoy.filter_stats("backend");
    assert!(armed >= 2500, "{report}");
    assert!(
        hedges * 50 >= armed && hedges * 5 <= armed,
        "would-be hedges {hedges} of {armed}: {report}"
    );
    assert_eq!(get("hedges_armed_total"), 0, "{report}");
    assert_eq!(get("hedges_sent_total"), 0, "{report}");
    assert_eq!(get("host_picks_total"), 0, "{report}");
    let estimate_ms = get("shadow_p99_microseconds") as f64 / 1000.0;
    let delay_ms = get("hedge_delay_microseconds") as f64 / 1000.0;
    eprintln!(
        "shadow: p99 {:.1} ms unhedged, {estimate_ms:.1} ms estimated with hedging after {delay_ms:.1} ms; {hedges} would-be hedges of {armed}",
        run.ms(0.99)
    );
    assert!(
        estimate_ms > delay_ms && estimate_ms < 0.6 * run.ms(0.99),
        "estimated p99 {estimate_ms} ms, delay {delay_ms} ms, client p99 {}: {report}",
        run.ms(0.99)
    );
    envoy.assert_no_vm_failure();
}

/// The expensive route of `envoy.yaml`, and two more, with overrides in
/// their metadata.
const ROUTES_WITH_METADATA: &str = r#"                        - name: expensive
                          match: { prefix: "/x10/" }
                          route: { cluster: backend }
                          metadata:
                            filter_metadata:
                              adaptive_hedge: { max_hedges: 2, percentile: 0.5, budget_percent: 60 }
                        - name: admin
                          match: { prefix: "/admin/" }
                          route: { cluster: backend }
                          metadata:
                            filter_metadata:
                              adaptive_hedge: { disabled: true }
                        - name: bulk
                          match: { prefix: "/bulk/" }
                          route: { cluster: backend }
                          metadata:
                            filter_metadata:
                              adaptive_hedge: { max_hedges: 9 }
"#;

/// Per-route control through Envoy's route metadata
/// (`filter_metadata.adaptive_hedge`, read with the route-metadata
/// property): a route with its own percentile, budget and hedge count is
/// hedged as a cluster of its own at those settings (two hedges, about half
/// its requests hedged where the cluster's budget allows a tenth); a route
/// can turn hedging off; a bad override is logged with its field and its
/// route is not hedged; the other routes keep the cluster's policy.
#[test]
fn route_metadata_overrides_the_cluster_s_policy_per_route() {
    let m = Latency::reference();
    let sim = Simulator::start(vec![m.clone(), m.clone(), m]).unwrap();
    let envoy = Envoy::start(
        EnvoyOptions::new("envoy.yaml", sim.ports())
            .plugin_config(r#"{"debug_header": true, "min_samples": 50}"#)
            .edit(
                "                        - name: expensive\n                          match: { prefix: \"/x10/\" }\n                          route: { cluster: backend }\n",
                ROUTES_WITH_METADATA,
            ),
    )
    .unwrap();
    let client = load::client();
    let decided = runtime().block_on(async {
        common::warm_up(&client, &envoy, "/", 300, 4).await;
        common::warm_up(&client, &envoy, "/x10/", 300, 4).await;
        let run = load::open_loop(
            &client,
            &envoy.url("/x10/"),
            100.0,
            600,
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(run.ok(), 600, "{}", run.summary());
        let mut decided = Vec::new();
        for path in ["/", "/x10/", "/admin/", "/bulk/"] {
            // A request that finds its worker's tokens spent for the moment
            // says nothing of the route's policy: ask again (at most 10).
            let mut decision = String::new();
            for _ in 0..10 {
                let reply = load::Connection::open(envoy.listener_port)
                    .await
                    .unwrap()
                    .get(path, &[])
                    .await
                    .unwrap();
                assert_eq!(reply.status, 200, "{path}");
                decision = common::decision(&reply).to_string();
                if decision != "skipped; reason=budget_exhausted" {
                    break;
                }
            }
            decided.push(decision);
        }
        // What the hosts saw: one request per route held 1.5 s at every
        // attempt, so each hedge the route allows goes out (asked again
        // while the worker's tokens are spent for the moment).
        for (path, attempts) in [("/x10/", 3), ("/", 2), ("/admin/", 1)] {
            let mut seen = (String::new(), 0);
            for _ in 0..10 {
                sim.settle(Duration::from_secs(5));
                sim.reset_counts();
                let reply = load::Connection::open(envoy.listener_port)
                    .await
                    .unwrap()
                    .get(path, &[("x-sim-delay-ms", "1500")])
                    .await
                    .unwrap();
                assert_eq!(reply.status, 200, "{path}");
                seen = (
                    common::decision(&reply).to_string(),
                    sim.settle(Duration::from_secs(5)).arrivals,
                );
                if !seen.0.starts_with("skipped; reason=") || path == "/admin/" {
                    break;
                }
            }
            assert_eq!(seen.1, attempts, "{path}: {} ({:?})", seen.0, sim.counts());
        }
        decided
    });
    let [cluster, expensive, admin, bulk] = decided.as_slice() else {
        panic!("{decided:?}");
    };
    assert!(cluster.ends_with("; hedges=1"), "/: {cluster}");
    assert!(
        expensive.starts_with("armed;") && expensive.ends_with("; hedges=2"),
        "/x10/: {expensive}"
    );
    assert_eq!(admin, "skipped; reason=disabled");
    assert_eq!(bulk, "skipped; reason=route_metadata");
    let variant = "backend.route.expensive";
    let requests = envoy.flushed_filter_stat("requests_total", variant, 890);
    let get = |metric: &str| envoy.filter_stat(metric, variant).unwrap_or_default();
    let sent = get("hedges_sent_total");
    eprintln!(
        "route expensive: {sent} hedges sent for {requests} requests, delay {} us; backend: {}",
        get("hedge_delay_microseconds"),
        envoy.filter_stats("backend")
    );
    // p50 with a 60% budget: about half; the cluster's p94 would be < 10%
    assert!(
        sent * 4 >= requests,
        "{sent} hedges for {requests} requests: {}",
        envoy.filter_stats(variant)
    );
    envoy.wait_for_log(
        r#"route "bulk" of cluster "backend": filter_metadata.adaptive_hedge.max_hedges = 9: must be between 1 and 5"#,
    );
    envoy.wait_for_stats("the refused route counted", |s| {
        s.get("wasmcustom.adaptive_hedge.route_overrides_refused_total")
            .is_some_and(|&n| n >= 1)
    });
    envoy.assert_no_vm_failure();
}

/// Outlier detection as many meshes have it, and the shipped manifests (5
/// consecutive 5xx eject a host, any share of hosts), optionally with the
/// local-origin split and 10 local-origin failures in a row.
fn with_outlier_detection(split: bool) -> String {
    format!(
        "    - name: backend\n      type: STATIC\n      connect_timeout: 1s\n      outlier_detection: {{ consecutive_5xx: 5, max_ejection_percent: 100{} }}\n",
        if split {
            ", split_external_local_origin_errors: true, consecutive_local_origin_failure: 10"
        } else {
            ""
        }
    )
}

/// Ejections of the backend cluster's hosts by outlier detection, through
/// `config` (with `plugin_config`, or the filter's absent), when every host
/// turns 10x slower at once after the filter has learned the fast latency:
/// its delay is stale for a while, and every request armed with it fires
/// its per-try timeout (reported to outlier detection: a 204 without the
/// local-origin split, a local-origin failure with it).
fn ejections_in_a_brownout(
    config: &str,
    plugin_config: Option<&str>,
    split: bool,
) -> (i64, String) {
    let (envoy, report, paced) = brownout(config, plugin_config, Some(split));
    let stats = envoy.stats();
    let ejections = stats
        .get("cluster.backend.outlier_detection.ejections_enforced_total")
        .copied();
    assert!(ejections.is_some(), "outlier detection is not configured");
    (
        ejections.unwrap_or_default(),
        // the log before the end: callers read "; paced: N" at the end
        format!(
            "{report}\n----- envoy log, last 30 lines -----\n{}\n; paced: {paced}",
            envoy.log_tail(30)
        ),
    )
}

/// The brownout of `ejections_in_a_brownout`, with outlier detection as
/// `with_outlier_detection(split)` sets it, or none (`outlier: None`).
/// With `admin_cluster` in the plugin config, the brownout waits until
/// every worker has Envoy's word on the cluster's outlier detection.
/// Also returns the brownout's requests paced for outlier detection (by
/// the debug header, if on).
fn brownout(
    config: &str,
    plugin_config: Option<&str>,
    outlier: Option<bool>,
) -> (Envoy, String, u64) {
    let m = Latency::reference();
    let sim = Simulator::start(vec![m.clone(), m.clone(), m]).unwrap();
    let mut options = EnvoyOptions::new(config, sim.ports());
    if let Some(split) = outlier {
        options = options.edit(
            "    - name: backend\n      type: STATIC\n      connect_timeout: 1s\n",
            &with_outlier_detection(split),
        );
    }
    if let Some(plugin_config) = plugin_config {
        options = options.plugin_config(plugin_config);
    }
    let envoy = Envoy::start(options).unwrap();
    let client = load::client();
    let url = envoy.url("/");
    let admin = plugin_config.is_some_and(|c| c.contains("admin_cluster"));
    let run = runtime().block_on(async {
        if plugin_config.is_some() {
            common::warm_up(&client, &envoy, "/", 300, 4).await;
        }
        // each worker (two) says what it made of the admin interface's
        // word when it changes its pacing; with outlier detection that
        // splits local-origin errors there is nothing to change: one read
        // is enough
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let told = envoy.log().matches("outlier pacing off").count();
            let read = envoy
                .stat("wasmcustom.adaptive_hedge.admin_reads_total")
                .unwrap_or_default();
            if !admin || (read > 0 && (outlier == Some(true) || told >= 2)) {
                break;
            }
            common::warm_up(&client, &envoy, "/", 100, 4).await;
        }
        assert!(
            !admin || Instant::now() < deadline,
            "{config}: the admin interface's word not taken within 20 s: {} reads; log:\n{}",
            envoy
                .stat("wasmcustom.adaptive_hedge.admin_reads_total")
                .unwrap_or_default(),
            envoy.log()
        );
        load::open_loop(&client, &url, 300.0, 900, Duration::from_secs(5)).await;
        sim.set_all_models(Latency::LogNormal {
            mean_ms: 50.0,
            sd_ms: 20.0,
            straggler_prob: 0.05,
            straggler_mult: 10.0,
        });
        load::open_loop(&client, &url, 300.0, 1800, Duration::from_secs(10)).await
    });
    assert_eq!(run.ok(), 1800, "{config}: {}", run.summary());
    let stats = envoy.stats();
    let get = |name: &str| stats.get(name).copied().unwrap_or_default();
    let ejections = get("cluster.backend.outlier_detection.ejections_enforced_total");
    let report = format!(
        "{config} {}: {ejections} ejections (consecutive 5xx detected {}, local origin detected {}); p99 {:.1} ms; {}",
        plugin_config.unwrap_or("without the filter"),
        get("cluster.backend.outlier_detection.ejections_detected_consecutive_5xx"),
        get("cluster.backend.outlier_detection.ejections_detected_consecutive_local_origin_failure"),
        run.ms(0.99),
        envoy.filter_stats("backend"),
    );
    eprintln!("{report}; paced in the brownout: {}", run.paced);
    envoy.assert_no_vm_failure();
    (envoy, report, run.paced)
}

/// `name`'s value for the backend cluster in a brownout's report.
fn reported(report: &str, name: &str) -> u64 {
    report
        .split(&format!("{name}.backend="))
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_default()
}

/// A brownout (every host 10x slower at once, none failing) through
/// outlier detection: each per-try timeout that fires (every hedge's) is
/// reported to it, which without the filter never happens. Armed requests
/// ask the router for a 204 on timeouts (`x-envoy-upstream-rq-timeout-
/// alt-response`), so without the local-origin split a fired per-try
/// timeout is no 5xx and resets `consecutive_5xx`, as the attempt's late
/// 200 would have; with the split it is a local-origin failure whatever
/// the code, and the filter's pacing (`reason=paced`, a fresh attempt to a
/// host whose armed attempts fired) keeps a host far from ten
/// in a row. Before the 204, measured with `--nocapture`: with outlier
/// detection's defaults 0 to 3 hosts ejected per run (all 3 in one CI run
/// of this test, and in every run without the pacing). Asserted: no host
/// ejected in any of the forms, the pacing off included; with
/// `admin_cluster`, requests paced with the split and none without it
/// (the configuration dump says which).
#[test]
fn a_brownout_ejects_no_host_with_default_or_shipped_outlier_settings() {
    let (without, report) = ejections_in_a_brownout("envoy-baseline.yaml", None, false);
    assert_eq!(without, 0, "the brownout alone ejects: {report}");
    // with the admin interface read: Envoy says the cluster's outlier
    // detection splits local-origin errors, so it is paced as without the
    // read; unsplit, a timeout is the 204 and nothing is paced
    let paced = r#"{"debug_header": true, "min_samples": 50, "admin_cluster": "prometheus_stats", "admin_refresh": "1s"}"#;
    let unpaced = r#"{"debug_header": true, "min_samples": 50, "outlier_pacing": false}"#;
    for (plugin, split) in [(paced, true), (paced, false), (unpaced, false)] {
        let (with, report) = ejections_in_a_brownout("envoy.yaml", Some(plugin), split);
        assert_eq!(with, 0, "{report}");
        // the filter was there: hedges fired per-try timeouts, and the
        // pacing held arming back while the delay was stale
        assert!(
            reported(&report, "hedges_sent_total") > 20,
            "few hedges: {report}"
        );
        if plugin == paced && split {
            assert!(!report.ends_with("; paced: 0"), "never paced: {report}");
        } else {
            assert!(report.ends_with("; paced: 0"), "paced: {report}");
        }
    }
}

/// A cluster Envoy runs no outlier detection on has nothing to pace for:
/// once the admin interface says so (`admin_cluster`), the same brownout
/// paces no request (above, with outlier detection, it does), and the
/// filter hedges through it.
#[test]
fn a_cluster_without_outlier_detection_is_not_paced_once_envoy_says_so() {
    let plugin = r#"{"debug_header": true, "min_samples": 50, "admin_cluster": "prometheus_stats", "admin_refresh": "1s"}"#;
    let (envoy, report, paced) = brownout("envoy.yaml", Some(plugin), None);
    assert!(
        !envoy
            .stats()
            .contains_key("cluster.backend.outlier_detection.ejections_enforced_total"),
        "outlier detection is configured"
    );
    assert!(
        envoy.log().matches("outlier pacing off").count() >= 2,
        "{}",
        envoy.log()
    );
    assert_eq!(paced, 0, "paced: {report}");
    assert!(
        reported(&report, "hedges_sent_total") > 20,
        "few hedges: {report}"
    );
}

/// Without host choice (an Istio waypoint's plugin), outlier pacing still
/// holds armed requests back, and the admin interface still tells where it
/// cannot be needed: the filter reads it and turns pacing off, logging no
/// warning that the cluster goes unread.
#[test]
fn without_host_choice_the_admin_interface_still_turns_pacing_off() {
    let m = Latency::reference();
    let sim = Simulator::start(vec![m.clone(), m.clone(), m]).unwrap();
    let envoy = Envoy::start(EnvoyOptions::new("envoy.yaml", sim.ports()).plugin_config(
        r#"{"debug_header": true, "host_choice": false, "min_samples": 50, "admin_cluster": "prometheus_stats", "admin_refresh": "1s"}"#,
    ))
    .unwrap();
    let client = load::client();
    let deadline = Instant::now() + Duration::from_secs(20);
    // each worker (two) logs the change once it has the read
    while envoy.log().matches("outlier pacing off").count() < 2 {
        assert!(Instant::now() < deadline, "{}", envoy.log());
        runtime().block_on(common::warm_up(&client, &envoy, "/", 100, 4));
    }
    assert!(
        envoy
            .stat("wasmcustom.adaptive_hedge.admin_reads_total")
            .unwrap_or_default()
            > 0
    );
    assert!(!envoy.log().contains("is not read"), "{}", envoy.log());
    assert!(envoy.flushed_filter_stat("requests_total", "backend", 1) > 0);
    let picks = filter_stat_name("host_picks_total", "backend");
    assert_eq!(
        envoy.stats().get(&picks).copied().unwrap_or_default(),
        0,
        "host choice is off"
    );
    envoy.assert_no_vm_failure();
}

/// With no `admin_cluster` in its configuration the filter reads Envoy's
/// admin interface through `prometheus_stats`, the cluster Istio's and
/// Envoy Gateway's bootstraps declare and envoy.yaml ships: pacing turns
/// off with nothing configured. Without such a cluster (a plain Envoy
/// whose admin cluster has another name) each worker says so once, at info
/// level, and no failure is counted.
#[test]
fn unconfigured_the_admin_interface_is_read_where_mesh_bootstraps_put_it() {
    let m = Latency::reference();
    let sim = Simulator::start(vec![m.clone(), m.clone(), m]).unwrap();
    let client = load::client();
    // debug_header for warm_up; min_samples to be quick: nothing about the admin interface
    let plugin = r#"{"debug_header": true, "min_samples": 50}"#;
    let mesh_like =
        Envoy::start(EnvoyOptions::new("envoy.yaml", sim.ports()).plugin_config(plugin)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while mesh_like.log().matches("outlier pacing off").count() < 2 {
        assert!(Instant::now() < deadline, "{}", mesh_like.log());
        runtime().block_on(common::warm_up(&client, &mesh_like, "/", 100, 4));
    }
    assert!(!mesh_like.log().contains("no cluster \"prometheus_stats\""));
    mesh_like.assert_no_vm_failure();
    drop(mesh_like);

    let plain = Envoy::start(
        EnvoyOptions::new("envoy.yaml", sim.ports())
            .edit("prometheus_stats", "envoy_admin")
            .plugin_config(plugin),
    )
    .unwrap();
    runtime().block_on(common::warm_up(&client, &plain, "/", 100, 4));
    let log = plain.wait_for_log("no cluster \"prometheus_stats\" to Envoy's admin interface");
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("no cluster \"prometheus_stats\""))
        .collect();
    assert!(
        said.len() <= 2 && said.iter().all(|l| l.contains("[info]")),
        "{said:?}"
    );
    assert!(!log.contains("cannot read"), "{log}");
    assert!(plain.flushed_filter_stat("requests_total", "backend", 1) > 0);
    assert_eq!(
        plain
            .stat("wasmcustom.adaptive_hedge.admin_read_failures_total")
            .unwrap_or_default(),
        0
    );
    plain.assert_no_vm_failure();
}

/// The config check warns where outlier detection splits local-origin
/// errors and ejects at fewer than ten of them in a row (Envoy's default
/// is five), in each form: an Envoy cluster, an Istio DestinationRule, an
/// Envoy Gateway passive health check. Without the split (the shipped
/// manifests), or with ten, nothing to say.
#[test]
fn the_config_check_warns_of_a_local_origin_split_ejecting_under_ten() {
    use integration_tests::tools::config_check::check;
    let root = integration_tests::harness::envoy::repo_root().join("envoy-configs");
    let read = |file: &str| std::fs::read_to_string(root.join(file)).unwrap();
    let warned = |text: &str| {
        check(text)
            .warnings
            .iter()
            .any(|w| w.contains("is a local-origin failure"))
    };
    let envoy = read("envoy.yaml");
    assert!(!warned(&envoy));
    let from = "    - name: backend\n      type: STATIC\n      connect_timeout: 1s\n";
    // outlier detection's defaults: no split, nothing to say
    assert!(!warned(
        &envoy.replace(from, &with_outlier_detection(false))
    ));
    let split = envoy.replace(from, &with_outlier_detection(true));
    assert!(!warned(&split));
    assert!(warned(&split.replace(
        "consecutive_local_origin_failure: 10",
        "consecutive_local_origin_failure: 5"
    )));
    assert!(warned(
        &split.replace(", consecutive_local_origin_failure: 10", "")
    ));
    // the shipped manifests do not split; an operator who adds the split
    // is warned below ten
    for (file, consecutive) in [
        ("istio/wasmplugin.yaml", "      consecutive5xxErrors: 5\n"),
        (
            "gateway/adaptive-hedge.yaml",
            "      consecutive5XxErrors: 5\n",
        ),
    ] {
        let shipped = read(file);
        assert!(shipped.contains(consecutive), "{file}");
        assert!(
            !shipped.contains("splitExternalLocalOriginErrors:"),
            "{file}"
        );
        assert!(!warned(&shipped), "{file}");
        let split = |rest: &str| {
            shipped.replacen(
                consecutive,
                &format!("{consecutive}      splitExternalLocalOriginErrors: true\n{rest}"),
                1,
            )
        };
        assert!(
            !warned(&split("      consecutiveLocalOriginFailures: 10\n")),
            "{file}"
        );
        assert!(
            warned(&split("      consecutiveLocalOriginFailures: 3\n")),
            "{file}"
        );
        assert!(warned(&split("")), "{file}");
    }
}

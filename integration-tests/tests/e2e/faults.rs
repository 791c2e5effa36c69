//! The filter under faults, against real Envoy: it never turns a fault into a
//! new error, never multiplies load past its budget, keeps its books
//! (armed = sent + refunded once nothing is in flight), survives garbage in
//! its shared memory, and under FAIL_OPEN a VM fault lets requests through.
//! Each fault runs through Envoy without the filter too, for comparison.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use integration_tests::harness::envoy::{self, repo_root, Envoy, EnvoyOptions};
use integration_tests::harness::load::{self, request, Client};
use integration_tests::harness::sim::{Latency, Simulator};
use integration_tests::runtime;

/// Learns fast (20 samples) so each test warms up in a moment; the debug
/// header tells when it has.
const QUICK: &str = r#"{"min_samples": 20, "debug_header": true}"#;

fn fast() -> Latency {
    Latency::fixed_ms(2)
}

fn adaptive(ports: &[u16], plugin_config: &str) -> Envoy {
    Envoy::start(EnvoyOptions::new("envoy.yaml", ports).plugin_config(plugin_config)).unwrap()
}

fn baseline(ports: &[u16]) -> Envoy {
    Envoy::start(EnvoyOptions::new("envoy-baseline.yaml", ports)).unwrap()
}

/// Sends `n` GETs one after another with `headers`; statuses by count
/// (0 = the response failed, e.g. a body cut by a reset).
fn statuses(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    envoy: &Envoy,
    n: usize,
    headers: &[(&str, &str)],
) -> BTreeMap<u16, usize> {
    rt.block_on(async {
        let mut counts = BTreeMap::new();
        for _ in 0..n {
            let status = request(client, "GET", &envoy.url("/"), headers)
                .await
                .map_or(0, |r| r.status);
            *counts.entry(status).or_insert(0) += 1;
        }
        counts
    })
}

/// Armed hedges are either sent or refunded once nothing is in flight: no
/// token lost or created. Waits for the counters' flush.
fn assert_books_balance(envoy: &Envoy) {
    let name = |m| envoy::filter_stat_name(m, "backend");
    let (armed, sent, refunded) = (
        name("hedges_armed_total"),
        name("hedges_sent_total"),
        name("hedges_refunded_total"),
    );
    let stats = envoy.wait_for_stats("armed = sent + refunded", |s| {
        let get = |n: &String| s.get(n).copied();
        matches!(
            (get(&armed), get(&sent), get(&refunded)),
            (Some(a), Some(s), Some(r)) if a == s + r
        )
    });
    assert!(
        stats[&armed] > 0,
        "nothing was armed: {}",
        envoy.filter_stats("backend")
    );
}

fn warm(rt: &tokio::runtime::Runtime, client: &Client, envoy: &Envoy) {
    rt.block_on(common::warm_up(client, envoy, "/", 100, 2));
}

/// Three fast hosts and an Envoy with the filter (its options from the
/// hosts' ports), after warm-up.
fn warmed(
    options: impl FnOnce(&[u16]) -> EnvoyOptions,
) -> (Simulator, Envoy, Client, tokio::runtime::Runtime) {
    let sim = Simulator::start(vec![fast(), fast(), fast()]).unwrap();
    let envoy = Envoy::start(options(sim.ports())).unwrap();
    let (client, rt) = (load::client(), runtime());
    warm(&rt, &client, &envoy);
    (sim, envoy, client, rt)
}

fn quick(ports: &[u16]) -> EnvoyOptions {
    EnvoyOptions::new("envoy.yaml", ports).plugin_config(QUICK)
}

/// A 503 storm: every attempt fails fast. With `retry_on: 5xx` each armed
/// request is retried at once; those retries are paid from the same budget
/// as hedges, so the storm is not doubled.
#[test]
fn a_503_storm_is_not_amplified_past_the_budget() {
    let (sim, envoy, client, rt) = warmed(quick);
    sim.reset_counts();
    let requests = 3000u64;
    let run = rt.block_on(load::open_loop_with_headers(
        &client,
        &envoy.url("/"),
        400.0,
        requests,
        Duration::from_secs(5),
        &[("x-sim-status", "503")],
    ));
    assert_eq!(
        run.statuses.get(&503).copied(),
        Some(requests),
        "{}",
        run.summary()
    );
    let extra = sim.settle(Duration::from_secs(5)).arrivals - requests;
    // budget (10% of requests) + what workers and the pool had saved (3 x
    // burst) + the most debt workers may leave (2 x burst)
    let bound = requests / 10 + 3 * 10 + 2 * 10;
    println!("503 storm: {requests} requests, {extra} retries (bound {bound})");
    assert!(extra <= bound, "{extra} retries > {bound}");
    assert!(
        extra >= requests / 20,
        "{extra}: the budget was not used: {}",
        envoy.filter_stats("backend")
    );
    assert_books_balance(&envoy);
    envoy.assert_no_vm_failure();
}

/// Resets before and after the response headers, hung upstreams (ended by
/// the route timeout), a host that refuses connections: each gives the
/// client what Envoy without the filter gives, or better.
#[test]
fn upstream_faults_become_no_new_errors() {
    let sim = Simulator::start(vec![fast(), fast(), fast()]).unwrap();
    let (client, rt) = (load::client(), runtime());
    let cases: [(&str, &[(&str, &str)]); 3] = [
        ("reset before headers", &[("x-sim-fault", "reset")]),
        ("reset mid-body", &[("x-sim-fault", "reset-mid-body")]),
        ("hang past the route timeout", &[("x-sim-delay-ms", "3000")]),
    ];
    // A 0.5 s route timeout; and no delayed close: after a reset mid-body
    // Envoy closes the client's connection only after delayed_close_timeout
    // (1 s by default), which would make each of those requests last 1 s.
    let short_timeout = |o: EnvoyOptions| {
        o.edit(
            "route: { cluster: backend }",
            "route: { cluster: backend, timeout: 0.5s }",
        )
        .edit(
            "stat_prefix: ingress\n",
            "stat_prefix: ingress\n                delayed_close_timeout: 0s\n",
        )
    };
    let base = Envoy::start(short_timeout(EnvoyOptions::new(
        "envoy-baseline.yaml",
        sim.ports(),
    )))
    .unwrap();
    let with = Envoy::start(short_timeout(
        EnvoyOptions::new("envoy.yaml", sim.ports()).plugin_config(QUICK),
    ))
    .unwrap();
    let mut seen = rt.block_on(common::warm_up(&client, &with, "/", 100, 2)) as i64;
    with.requests_seen("backend", seen);
    let stat = |m: &str| with.filter_stat(m, "backend").unwrap_or(0);
    // eligible and decided: armed, or held back (paced, stale, budget)
    let decided = || {
        [
            "hedges_armed_total",
            "paced_total",
            "budget_exhausted_total",
        ]
        .map(stat)
        .iter()
        .sum::<i64>()
    };
    let (mut armed_before, mut decided_before) = (stat("hedges_armed_total"), decided());
    for (name, headers) in cases {
        let n = if name.starts_with("hang") { 6 } else { 40 };
        let expected = statuses(&rt, &client, &base, n, headers);
        let got = statuses(&rt, &client, &with, n, headers);
        println!("{name}: without {expected:?}, with {got:?}");
        // the filter was in play, not passing them by (the counters of a
        // tick flush together): each fault's requests were decided on,
        // and the first fault's armed. After it, the filter may hold
        // requests back by design (a host's attempts failing in a row
        // read as timeouts standing: `paced`).
        seen += n as i64;
        with.requests_seen("backend", seen);
        let (armed_now, decided_now) = (stat("hedges_armed_total"), decided());
        assert!(
            decided_now >= decided_before + n as i64,
            "{name}: not every faulted request was decided on: {}",
            with.filter_stats("backend")
        );
        assert!(
            name != "reset before headers" || armed_now > armed_before,
            "{name}: none of the faulted requests was armed: {}",
            with.filter_stats("backend")
        );
        (armed_before, decided_before) = (armed_now, decided_now);
        let ok = |m: &BTreeMap<u16, usize>| m.get(&200).copied().unwrap_or(0);
        assert!(ok(&got) >= ok(&expected), "{name}: {got:?} vs {expected:?}");
        assert_eq!(got.values().sum::<usize>(), n);
        // the same kind of failure, never a new status
        for status in got.keys().filter(|s| **s != 200) {
            assert!(expected.contains_key(status), "{name}: new status {status}");
        }
    }
    // after the faults, ordinary requests are served and hedged as before
    let after = statuses(&rt, &client, &with, 50, &[]);
    assert_eq!(after.get(&200).copied(), Some(50), "{after:?}");
    sim.settle(Duration::from_secs(5));
    assert_books_balance(&with);
    with.assert_no_vm_failure();
}

/// One of three hosts refuses connections; then none is reachable.
#[test]
fn refused_connections_and_no_healthy_host() {
    let sim = Simulator::start(vec![fast(), fast()]).unwrap();
    let dead = envoy::RefusingPort::new(); // bound, never listening
    let ports = [sim.ports()[0], sim.ports()[1], dead.port];
    let (client, rt) = (load::client(), runtime());
    let base = baseline(&ports);
    let one_dead = adaptive(&ports, QUICK);
    warm_tolerant(&rt, &client, &one_dead);
    let expected = statuses(&rt, &client, &base, 90, &[]);
    let got = statuses(&rt, &client, &one_dead, 90, &[]);
    println!("one host refuses: without {expected:?}, with {got:?}");
    let errors = |m: &BTreeMap<u16, usize>| {
        m.iter()
            .filter(|(s, _)| **s != 200)
            .map(|(_, n)| n)
            .sum::<usize>()
    };
    // round robin without retries fails about a third; armed requests
    // retry a refused connection, and the filter names the other hosts
    assert!(
        errors(&got) <= (errors(&expected) / 4).max(3),
        "{got:?} vs {expected:?}; {}",
        one_dead.filter_stats("backend")
    );
    one_dead.assert_no_vm_failure();
    // two Envoys at a time on two cores, not four
    drop((base, one_dead));

    // no healthy host at all: 503 from Envoy, with or without the filter;
    // local replies are not latency samples
    let refusing: Vec<envoy::RefusingPort> = (0..3).map(|_| envoy::RefusingPort::new()).collect();
    let all_dead: Vec<u16> = refusing.iter().map(|p| p.port).collect();
    let base = baseline(&all_dead);
    let with = adaptive(&all_dead, QUICK);
    let expected = statuses(&rt, &client, &base, 30, &[]);
    let got = statuses(&rt, &client, &with, 30, &[]);
    println!("no healthy host: without {expected:?}, with {got:?}");
    assert_eq!(got, expected);
    // no upstream ever answered: the cluster is not tracked (a name a
    // client made up would be the same), its requests counted unconfirmed
    with.wait_for_stats("30 unconfirmed requests", |s| {
        s.get("wasmcustom.adaptive_hedge.unconfirmed_requests_total")
            .is_some_and(|n| *n >= 30)
    });
    assert_eq!(with.filter_stat("window_samples", "backend"), None);
    assert_eq!(with.filter_stat("requests_total", "backend"), None);
    with.assert_no_vm_failure();
}

/// Warm-up that tolerates the errors of a refusing host.
fn warm_tolerant(rt: &tokio::runtime::Runtime, client: &Client, envoy: &Envoy) {
    let _ = statuses(rt, client, envoy, 100, &[]);
    rt.block_on(common::until_learned(envoy, "/"));
}

/// Clients that give up mid-request: Envoy cancels the upstream attempts,
/// the filter settles the budget of each, and keeps serving.
#[test]
fn clients_that_disconnect_mid_request() {
    let (sim, envoy, client, rt) = warmed(quick);
    // the counters as flushed: the filter publishes them on its ticks
    let flushed = |metric| envoy.flushed_filter_stat(metric, "backend", 0);
    let (sent_before, requests_before) = (flushed("hedges_sent_total"), flushed("requests_total"));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..40 {
            let client = load::client(); // its own connection, dropped on timeout
            let url = envoy.url("/");
            tasks.push(tokio::spawn(async move {
                // the first attempt is slow, so the request is hedged and then abandoned
                let slow = request(&client, "GET", &url, &[("x-sim-delay-ms", "400")]);
                tokio::time::timeout(Duration::from_millis(60), slow)
                    .await
                    .is_err()
            }));
        }
        for t in tasks {
            assert!(t.await.unwrap(), "the request was meant to be abandoned");
        }
    });
    let t = sim.settle(Duration::from_secs(5));
    assert!(
        t.cancellations > 0,
        "Envoy cancelled the abandoned attempts: {t:?}"
    );
    let after = statuses(&rt, &client, &envoy, 30, &[]);
    assert_eq!(after.get(&200).copied(), Some(30), "{after:?}");
    // every worker has published the 70 requests (and so their arming)
    // before the books are read: the warm-up's already balanced
    envoy.flushed_filter_stat("requests_total", "backend", requests_before + 70);
    assert_books_balance(&envoy);
    // abandoned requests were armed and hedged (their 400 ms primary
    // outlived the delay; the budget's burst arms about half of the 40
    // at once), and each hedge was paid
    envoy.flushed_filter_stat("hedges_sent_total", "backend", sent_before + 5);
    envoy.assert_no_vm_failure();
}

/// Values a client may send in the control headers: huge, not numbers,
/// negative, repeated, from a client Envoy trusts (so they reach the
/// filter). The filter removes every one: each request still makes one
/// upstream attempt to a fast host (the filter's own hedge aside, which
/// only a stall of the loop past 200 ms sends).
#[test]
fn hostile_control_header_values_change_nothing() {
    // min_delay 200 ms: the filter's own hedges fire on these fast hosts
    // (the slowest answers in 20 ms) only when the loop stalls that long,
    // so extra attempts past a stall's one or two are the client's doing
    let (sim, envoy, client, rt) = warmed(|ports| {
        EnvoyOptions::new("envoy.yaml", ports)
            .plugin_config(r#"{"min_samples": 20, "min_delay": "200ms", "debug_header": true}"#)
            .trust_loopback_clients()
    });
    let huge = "9".repeat(4096);
    let hostile: Vec<Vec<(&str, &str)>> = vec![
        vec![("x-envoy-upstream-rq-per-try-timeout-ms", huge.as_str())],
        vec![
            ("x-envoy-upstream-rq-per-try-timeout-ms", "-5"),
            ("x-envoy-max-retries", "-1"),
        ],
        vec![
            ("x-envoy-upstream-rq-per-try-timeout-ms", "abc"),
            ("x-envoy-max-retries", "lots"),
        ],
        // repeated, on failing hosts: obeyed, 6 to 8 attempts a request
        vec![
            ("x-envoy-max-retries", "5"),
            ("x-envoy-max-retries", "7"),
            ("x-envoy-retry-on", "5xx"),
            ("x-envoy-retry-on", "reset"),
            ("x-sim-status", "503"),
        ],
        vec![
            ("x-envoy-hedge-on-per-try-timeout", "true"),
            ("x-envoy-upstream-rq-per-try-timeout-ms", "1"),
            ("x-envoy-max-retries", "5"),
            ("x-envoy-retry-on", "5xx"),
            ("x-sim-delay-ms", "20"),
        ],
        vec![
            ("x-envoy-retry-grpc-on", "cancelled"),
            ("x-envoy-max-retries", "3"),
            ("x-sim-status", "503"),
        ],
        vec![("x-envoy-retry-on", huge.as_str())],
    ];
    for headers in &hostile {
        sim.reset_counts();
        let got = statuses(&rt, &client, &envoy, 20, headers);
        let arrivals = sim.settle(Duration::from_secs(5)).arrivals;
        let failing = headers.iter().any(|(k, _)| *k == "x-sim-status");
        println!(
            "{:?}: {got:?}, {arrivals} upstream attempts",
            headers
                .iter()
                .map(|(k, v)| (k, &v[..v.len().min(12)]))
                .collect::<Vec<_>>()
        );
        if failing {
            // the filter's own retry of a fast 503 (paid by the budget),
            // never the client's 3
            assert!(arrivals <= 40, "{arrivals} attempts for 20 requests");
            assert_eq!(got.get(&503).copied(), Some(20), "{got:?}");
        } else {
            // one attempt each, even where the client asked for 5 hedges
            // 1 ms apart on a host that takes 20 ms (up to 120 attempts);
            // two more at most: a stall of the loop past the filter's own
            // 200 ms delay sends the filter's hedge
            assert!(
                (20..=22).contains(&arrivals),
                "the client's headers multiplied the attempts: {arrivals}"
            );
            assert_eq!(got.get(&200).copied(), Some(20), "{got:?}");
        }
    }
    assert_books_balance(&envoy);
    envoy.assert_no_vm_failure();
}

fn fault_wasm() -> std::path::PathBuf {
    let path = repo_root().join("build/adaptive_hedge_fault_injection.wasm");
    assert!(
        path.exists(),
        "{} is missing: run `make build`",
        path.display()
    );
    path
}

/// Garbage and a foreign encoding version under the filter's shared-data
/// keys (written by the test-only build): detected, logged, reset, and
/// hedging recovers.
#[test]
fn corrupt_shared_data_is_reset_and_hedging_recovers() {
    let (_sim, envoy, client, rt) = warmed(|ports| quick(ports).wasm(fault_wasm()));
    const RESETS: &str = "wasmcustom.adaptive_hedge.shared_state_resets_total";
    let resets_before = envoy.stat(RESETS).unwrap_or(0);
    for (n, fault) in (1..).zip(["corrupt-shared-data", "foreign-version"]) {
        let got = statuses(
            &rt,
            &client,
            &envoy,
            1,
            &[("x-adaptive-hedge-fault", fault)],
        );
        assert_eq!(got.get(&200).copied(), Some(1), "{fault}: {got:?}");
        // the next tick detects it and resets the value
        envoy.wait_for_stats("the reset", |s| {
            s.get(RESETS).is_some_and(|r| *r >= resets_before + n)
        });
        let armed_before = envoy.flushed_filter_stat("hedges_armed_total", "backend", 0);
        warm(&rt, &client, &envoy); // re-learns from scratch
        let _ = statuses(&rt, &client, &envoy, 50, &[]);
        assert!(
            envoy.flushed_filter_stat("hedges_armed_total", "backend", armed_before + 21)
                > armed_before + 20,
            "{fault}: hedging did not recover: {}",
            envoy.filter_stats("backend")
        );
    }
    let log = envoy.log();
    assert!(
        log.contains(r#"shared state of cluster "backend" reset"#),
        "the reset is logged:\n{log}"
    );
    envoy.assert_no_vm_failure();
}

/// Under the shipped FAIL_OPEN policy, a VM fault (a trap, as a bug would
/// cause) lets requests through unhedged; FAIL_CLOSED would fail them.
#[test]
fn a_vm_fault_under_fail_open_lets_requests_through() {
    let sim = Simulator::start(vec![fast(), fast(), fast()]).unwrap();
    let (client, rt) = (load::client(), runtime());
    let debug = r#"{"min_samples": 20, "debug_header": true}"#;
    // one worker, so that every later request meets the faulted VM
    let open = Envoy::start(
        EnvoyOptions::new("envoy.yaml", sim.ports())
            .concurrency(1)
            .wasm(fault_wasm())
            .plugin_config(debug),
    )
    .unwrap();
    warm(&rt, &client, &open);
    let before = rt.block_on(common::until_not_held_back(&client, &open.url("/"), &[]));
    assert!(
        common::decision(&before).starts_with("armed"),
        "the filter is working before the fault: {:?}",
        before.headers
    );
    // The request whose callback traps is answered 503 by Envoy's wasm
    // filter under either policy (seen on Envoy 1.40); the policy decides
    // what happens to every request after it.
    let trapped = statuses(
        &rt,
        &client,
        &open,
        1,
        &[("x-adaptive-hedge-fault", "trap")],
    );
    assert_eq!(trapped.get(&503).copied(), Some(1), "{trapped:?}");
    let after = statuses(&rt, &client, &open, 50, &[]);
    println!("FAIL_OPEN: trapping request {trapped:?}, after {after:?}");
    // What the FilterSilent alert (envoy-configs/monitoring/alerts.yaml)
    // reads: the cluster's requests go on, the filter's count stands still
    // (Envoy 1.40 has no stat for a failed VM under FAIL_OPEN)
    let counted = open.filter_stat("requests_total", "backend");
    let upstream = open.stat("cluster.backend.upstream_rq_total").unwrap_or(0);
    let _ = statuses(&rt, &client, &open, 20, &[]);
    open.wait_for_stats("the cluster's requests counted by Envoy", |s| {
        s.get("cluster.backend.upstream_rq_total")
            .is_some_and(|&n| n >= upstream + 20)
    });
    assert_eq!(open.filter_stat("requests_total", "backend"), counted);
    assert!(counted.is_some_and(|n| n > 0));
    assert_eq!(after.get(&200).copied(), Some(50), "{after:?}");
    let reply = rt
        .block_on(request(&client, "GET", &open.url("/"), &[]))
        .unwrap();
    assert!(
        !reply.headers.contains_key("x-adaptive-hedge"),
        "the faulted filter is skipped: {:?}",
        reply.headers
    );
    // the trap, as Envoy 1.40 logs it (wasm_vm.cc)
    let log = open.log();
    assert!(
        log.contains(
            "Function: proxy_on_request_headers failed: Uncaught RuntimeError: unreachable"
        ),
        "the fault is in Envoy's log:\n{log}"
    );
    // the injected trap is the only failure: no panic, no load failure
    open.assert_no_vm_failure_except(&["Function: proxy_on", "unreachable"]);

    let closed = Envoy::start(
        EnvoyOptions::new("envoy.yaml", sim.ports())
            .wasm(fault_wasm())
            .concurrency(1)
            .plugin_config(debug)
            .edit("failure_policy: FAIL_OPEN", "failure_policy: FAIL_CLOSED"),
    )
    .unwrap();
    let _ = statuses(
        &rt,
        &client,
        &closed,
        1,
        &[("x-adaptive-hedge-fault", "trap")],
    );
    let after = statuses(&rt, &client, &closed, 5, &[]);
    println!("FAIL_CLOSED: after the trap {after:?}");
    assert!(
        !after.contains_key(&200),
        "FAIL_CLOSED fails requests after a fault: {after:?}"
    );
    // failed by the trap, not by a VM that never loaded
    let log = closed.log();
    assert!(
        log.contains("adaptive-hedge 0.1.0 configured")
            && log.contains("Function: proxy_on_request_headers failed"),
        "the FAIL_CLOSED VM loaded and trapped:\n{log}"
    );
    closed.assert_no_vm_failure_except(&["Function: proxy_on", "unreachable"]);
}

/// A route that takes its cluster from a client header (`cluster_header`):
/// a client sending made-up names gets Envoy's 503, and Envoy 1.40 gives
/// the filter no cluster name for them (`no_cluster`): nothing is counted
/// or tracked. With `max_clusters: 2` both slots stay for the real
/// clusters, tracked once an upstream answered and armed as usual, one of
/// them reached through the header too.
#[test]
fn made_up_cluster_names_from_a_client_take_no_slot() {
    let sim = Simulator::start(vec![fast(), fast(), fast(), fast()]).unwrap();
    let envoy = Envoy::start(
        EnvoyOptions::new("envoy.yaml", sim.ports())
            .plugin_config(r#"{"min_samples": 20, "debug_header": true, "max_clusters": 2}"#)
            .edit(
                "                        - name: default\n",
                "                        - name: by-header\n                          match: { prefix: \"/pick/\" }\n                          route: { cluster_header: x-cluster }\n                        - name: default\n",
            ),
    )
    .unwrap();
    let client = load::client();
    runtime().block_on(async {
        for i in 0..60 {
            let name = format!("made-up-{i}");
            let r = request(
                &client,
                "GET",
                &envoy.url("/pick/"),
                &[("x-cluster", name.as_str())],
            )
            .await
            .unwrap();
            assert_eq!(r.status, 503, "{r:?}");
            assert_eq!(common::decision(&r), "skipped; reason=no_cluster");
        }
        common::warm_up(&client, &envoy, "/", 100, 4).await;
        common::warm_up(&client, &envoy, "/b/", 100, 4).await;
        let r =
            common::until_not_held_back(&client, &envoy.url("/pick/"), &[("x-cluster", "backend")])
                .await;
        assert_eq!(r.status, 200);
        assert!(common::decision(&r).starts_with("armed"), "{r:?}");
    });
    envoy.flushed_filter_stat("requests_total", "backend-b", 1);
    let worker_stat = |name: &str| {
        envoy
            .stats()
            .get(&format!("wasmcustom.adaptive_hedge.{name}"))
            .copied()
    };
    assert_eq!(worker_stat("untracked_requests_total"), Some(0));
    // the real clusters' first requests only, at most one per caller and worker
    let unconfirmed = worker_stat("unconfirmed_requests_total").unwrap_or(0);
    assert!((1..=16).contains(&unconfirmed), "{unconfirmed}");
    assert!(
        !envoy.log().contains("max_clusters (2) reached"),
        "{}",
        envoy.log()
    );
    envoy.assert_no_vm_failure();
}

/// With the registry full (`max_clusters: 1`), a cluster idle for a whole
/// window (1 s here) gives its slot to a busy one that asks: the busy one
/// is then learned and armed, and the eviction is counted.
#[test]
fn an_idle_cluster_gives_its_slot_to_a_busy_one() {
    let sim = Simulator::start(vec![fast(), fast(), fast(), fast()]).unwrap();
    let envoy = Envoy::start(
        EnvoyOptions::new("envoy.yaml", sim.ports()).plugin_config(
            r#"{"min_samples": 20, "debug_header": true, "max_clusters": 1, "window": "1s", "sync_interval": "100ms"}"#,
        ),
    )
    .unwrap();
    let client = load::client();
    runtime().block_on(async {
        common::warm_up(&client, &envoy, "/", 50, 2).await;
        // backend holds the only slot; backend-b waits until backend has
        // been idle for a whole window, then takes it
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        let mut decisions = BTreeMap::new();
        loop {
            let r = request(&client, "GET", &envoy.url("/b/"), &[])
                .await
                .unwrap();
            assert_eq!(r.status, 200);
            let decision = common::decision(&r).to_string();
            if decision.starts_with("armed") {
                break;
            }
            *decisions.entry(decision).or_insert(0) += 1;
            assert!(
                std::time::Instant::now() < deadline,
                "backend-b never armed: {decisions:?} {}",
                envoy.filter_stats("")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            decisions.contains_key("skipped; reason=untracked"),
            "backend-b had to wait for the slot: {decisions:?}"
        );
    });
    let evicted = envoy.wait_for_stats("an eviction counted", |s| {
        s.get("wasmcustom.adaptive_hedge.clusters_evicted_total")
            .is_some_and(|&n| n >= 1)
    });
    assert_eq!(
        evicted.get("wasmcustom.adaptive_hedge.clusters_evicted_total"),
        Some(&1),
        "only backend was evicted"
    );
    envoy.wait_for_log("max_clusters (1) reached");
    envoy.assert_no_vm_failure();
}

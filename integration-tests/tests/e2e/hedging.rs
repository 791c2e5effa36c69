//! The filter's core promises against real Envoy (2 workers), the real .wasm
//! and a real upstream simulator.

use crate::common;

use std::time::Duration;

use integration_tests::harness::envoy::{Envoy, EnvoyOptions};
use integration_tests::harness::load::{self, request};
use integration_tests::harness::sim::{Latency, Simulator};
use integration_tests::runtime;

/// These tests check the race, not the budget: at the default 10% the budget
/// is often spent at the moment the probe arrives (on a noisy box the p90
/// trigger hedges about as much as the budget allows), so they give it room.
/// The budget has tests of its own.
const ROOMY_BUDGET: &str = r#"{"budget_percent": 50, "debug_header": true}"#;

fn steady() -> Latency {
    Latency::LogNormal {
        mean_ms: 5.0,
        sd_ms: 1.0,
        straggler_prob: 0.0,
        straggler_mult: 1.0,
    }
}

/// Three steady hosts and Envoy with the filter (roomy budget), after 400
/// warm-up requests: the filter has learned the delay.
fn warmed_up() -> (Simulator, Envoy, load::Client, tokio::runtime::Runtime) {
    let sim = Simulator::start(vec![steady(), steady(), steady()]).unwrap();
    let envoy =
        Envoy::start(EnvoyOptions::new("envoy.yaml", sim.ports()).plugin_config(ROOMY_BUDGET))
            .unwrap();
    let client = load::client();
    let rt = runtime();
    rt.block_on(common::warm_up(&client, &envoy, "/", 400, 4));
    (sim, envoy, client, rt)
}

/// After warm-up, a request whose first attempt the upstream holds for 1 s is
/// answered by a hedge near the learned delay; the upstream saw exactly two
/// attempts and the loser was cancelled.
#[test]
fn slow_first_attempt_is_raced_by_a_hedge() {
    let (sim, envoy, client, rt) = warmed_up();
    rt.block_on(async {
        let delay = common::learned_delay_ms(&envoy, "backend");
        // a ~5 ms backend's p94, with room for a loaded CI machine's
        // event loop (its p90 was seen at 31-43 ms there: tail.rs); far
        // below the first attempt's second either way
        assert!(
            (4.0..=200.0).contains(&delay),
            "learned p94 of a ~5 ms backend: {delay} ms"
        );

        let reply = common::armed_first_attempt_a_second_late(&client, &envoy, &sim, "/slow").await;
        assert_eq!(reply.status, 200);
        // the router's mark the filter tells a relayed response by
        assert!(reply.headers.contains_key("x-envoy-upstream-service-time"));
        assert_eq!(
            reply.headers.get("x-sim-attempt").map(String::as_str),
            Some("2"),
            "the hedge should answer; {:?}; {}",
            reply,
            envoy.filter_stats("backend")
        );
        // judged by this request's own per-try timeout (the debug header):
        // the gauge is the last worker's, and the request may have run on
        // the other with a delay a little shorter
        let armed_ms: f64 = reply
            .headers
            .get("x-adaptive-hedge")
            .and_then(|d| d.split("delay_ms=").nth(1))
            .and_then(|rest| rest.split(';').next())
            .and_then(|ms| ms.trim().parse().ok())
            .unwrap_or_else(|| panic!("armed with a delay: {reply:?}"));
        let elapsed_ms = reply.elapsed.as_secs_f64() * 1000.0;
        assert!(
            elapsed_ms >= armed_ms,
            "answered before the delay: {elapsed_ms} ms < {armed_ms} ms (gauge {delay} ms)"
        );
        assert!(
            elapsed_ms < armed_ms + 400.0,
            "answered at {elapsed_ms} ms, delay {armed_ms} ms"
        );

        let t = sim.settle(Duration::from_secs(3));
        assert_eq!(t.arrivals, 2, "primary + one hedge: {t:?}");
        assert_eq!(t.cancellations, 1, "the slow primary was cancelled: {t:?}");
    });
    assert!(envoy.flushed_filter_stat("hedges_sent_total", "backend", 1) >= 1);
    assert!(envoy.flushed_filter_stat("hedges_armed_total", "backend", 1) >= 1);
    envoy.assert_no_vm_failure();
}

/// A POST (or PUT, PATCH, DELETE) held the same way is never duplicated.
#[test]
fn non_idempotent_methods_are_never_duplicated() {
    let (sim, envoy, client, rt) = warmed_up();
    rt.block_on(async {
        for method in ["POST", "PUT", "PATCH", "DELETE"] {
            sim.reset_counts();
            let reply = request(
                &client,
                method,
                &envoy.url("/write"),
                &[("x-sim-first-delay-ms", "400")],
            )
            .await
            .unwrap();
            assert_eq!(reply.status, 200, "{method}");
            assert!(
                reply.elapsed >= Duration::from_millis(400),
                "{method} answered by a duplicate"
            );
            let t = sim.settle(Duration::from_secs(3));
            assert_eq!(
                t.arrivals, 1,
                "{method} reached the upstream {} times",
                t.arrivals
            );
        }
        // and a GET held the same way on the same Envoy is hedged (the test can fail)
        sim.reset_counts();
        let reply = request(
            &client,
            "GET",
            &envoy.url("/read"),
            &[("x-sim-first-delay-ms", "400")],
        )
        .await
        .unwrap();
        assert!(reply.elapsed < Duration::from_millis(400));
        assert_eq!(sim.settle(Duration::from_secs(3)).arrivals, 2);
    });
    envoy.assert_no_vm_failure();
}

/// The hedge goes to a host that answers 429 at once (overloaded) while
/// the primary is still running: the 429 must not end the race (without
/// `retriable-status-codes` in the armed `retry_on` the router took it and
/// cancelled the primary, and the client got a 429 it would not have had
/// without hedging); the primary's 200 answers.
#[test]
fn a_hedge_s_429_does_not_end_the_race() {
    let (sim, envoy, client, rt) = warmed_up();
    rt.block_on(async {
        sim.reset_counts();
        let reply = request(
            &client,
            "GET",
            &envoy.url("/overloaded"),
            &[
                ("x-sim-first-delay-ms", "300"),
                ("x-sim-later-status", "429"),
            ],
        )
        .await
        .unwrap();
        assert_eq!(
            reply.status,
            200,
            "{reply:?}; {}",
            envoy.filter_stats("backend")
        );
        assert_eq!(
            reply.headers.get("x-sim-attempt").map(String::as_str),
            Some("1"),
            "{reply:?}"
        );
        // the hedge was sent (and answered 429): the race was run
        let t = sim.settle(Duration::from_secs(3));
        assert_eq!(t.arrivals, 2, "primary + one hedge: {t:?}");
        assert!(
            reply.elapsed >= Duration::from_millis(300),
            "{:?}",
            reply.elapsed
        );
    });
    envoy.assert_no_vm_failure();
}

/// Every host answers 30% of requests with a 503 at once (a queue that
/// overflows), which the router retries on the hedge's host: a second
/// attempt answered before the per-try timeout, as a hedge sent by a
/// timer that fired early looks. Taken for early timers, such a storm set
/// every armed request's per-try timeout up to 50 ms later (and it came
/// back a millisecond per twenty verdicts). The filter tells them apart by
/// the host that answered: the per-try timeout stays at the learned delay.
#[test]
fn fast_failures_retried_do_not_set_the_hedges_later() {
    let (sim, envoy, client, rt) = warmed_up();
    for host in 0..3 {
        sim.set_flaky(host, Some(503), 0.3);
    }
    let fail_fast = [("x-sim-fail-fast", "1")];
    let delays = rt.block_on(async {
        let url = envoy.url("/flaky");
        let mut failed = 0;
        for _ in 0..900 {
            let reply = request(&client, "GET", &url, &fail_fast).await.unwrap();
            failed += u32::from(reply.status == 503);
        }
        // the router retried most failures: 9% fail twice
        assert!(failed < 200, "{failed} of 900 answered 503");
        let mut delays = Vec::new();
        for _ in 0..20 {
            let reply = request(&client, "GET", &url, &fail_fast).await.unwrap();
            let armed = common::decision(&reply)
                .strip_prefix("armed; delay_ms=")
                .and_then(|rest| rest.split(';').next())
                .and_then(|ms| ms.trim().parse::<u64>().ok());
            delays.extend(armed);
        }
        delays
    });
    let learned_ms = common::learned_delay_ms(&envoy, "backend");
    let stats = envoy.filter_stats("backend");
    assert!(delays.len() >= 5, "armed only {delays:?}: {stats}");
    let latest = delays.iter().max().copied().unwrap_or_default();
    println!("per-try timeouts armed {delays:?}, learned delay {learned_ms} ms");
    // a millisecond of rounding up, and the slack that timers which do
    // fire early on this box ask for (2-3 ms measured); taking the retries
    // for early timers set it 50 ms later (57 ms on a learned 6.7 ms)
    assert!(
        latest as f64 <= learned_ms + 10.0,
        "armed with a per-try timeout of {latest} ms, learned delay {learned_ms} ms: {stats}"
    );
    let sent = envoy.flushed_filter_stat("hedges_sent_total", "backend", 100);
    let early = envoy.flushed_filter_stat("early_hedges_total", "backend", 0);
    println!("{early} of {sent} hedges and retries counted early");
    // before: nearly all (the retries); now the timers that did fire early
    // on this box (about 2% of the armed requests, 8% of these)
    assert!(
        early * 4 <= sent,
        "{early} of {sent} hedges counted early: {stats}"
    );
    envoy.assert_no_vm_failure();
}

const CLIENT_CONTROL_HEADERS: [(&str, &str); 5] = [
    ("x-envoy-max-retries", "5"),
    ("x-envoy-upstream-rq-per-try-timeout-ms", "20"),
    ("x-envoy-hedge-on-per-try-timeout", "true"),
    ("x-envoy-retry-on", "5xx,reset"),
    ("x-envoy-retry-grpc-on", "unavailable"),
];

/// Sends one GET with the client's own hedge headers and a first attempt held
/// 300 ms; returns how many attempts reached the upstream. `/b/` routes to a
/// cluster with no samples, where the filter itself never arms.
fn attempts_for_client_hedge_headers(plugin_config: &str) -> (u64, Envoy) {
    let sim = Simulator::start(vec![steady(), steady(), steady(), steady()]).unwrap();
    let envoy = Envoy::start(
        EnvoyOptions::new("envoy.yaml", sim.ports())
            .plugin_config(plugin_config)
            .trust_loopback_clients(),
    )
    .unwrap();
    let client = load::client();
    let arrivals = runtime().block_on(async {
        let mut headers = CLIENT_CONTROL_HEADERS.to_vec();
        headers.push(("x-sim-first-delay-ms", "300"));
        headers.push(("x-sim-delay-ms", "300"));
        let reply = request(&client, "GET", &envoy.url("/b/x"), &headers)
            .await
            .unwrap();
        assert_eq!(reply.status, 200);
        sim.settle(Duration::from_secs(3)).arrivals
    });
    (arrivals, envoy)
}

/// A client cannot switch hedging on: its x-envoy-max-retries: 5 with hedge
/// headers produces no extra attempt, even with Envoy treating it as internal.
#[test]
fn clients_cannot_force_hedging() {
    let (arrivals, envoy) = attempts_for_client_hedge_headers("{}");
    assert_eq!(
        arrivals, 1,
        "client-sent control headers multiplied the request"
    );
    envoy.assert_no_vm_failure();
}

/// The control: with trust_client_headers the same request does fan out, so
/// the test above really exercises the stripping.
#[test]
fn trusted_client_headers_are_obeyed() {
    let (arrivals, envoy) = attempts_for_client_hedge_headers(r#"{"trust_client_headers": true}"#);
    assert!(
        arrivals >= 3,
        "Envoy should obey a trusted client's 5 retries: {arrivals} attempts"
    );
    envoy.assert_no_vm_failure();
}

/// The documented limit: a streamed response whose headers come at once and
/// whose first byte comes late is not hedged (Envoy's router commits to the
/// first attempt whose headers arrive). The simulator's streaming mode works.
#[test]
fn streamed_responses_with_early_headers_are_not_hedged() {
    let (sim, envoy, client, rt) = warmed_up();
    rt.block_on(async {
        sim.reset_counts();
        let headers = [
            ("x-sim-stream", "3"),
            ("x-sim-first-delay-ms", "300"),
            ("x-sim-chunk-gap-ms", "5"),
        ];
        let reply = request(&client, "GET", &envoy.url("/stream"), &headers)
            .await
            .unwrap();
        assert_eq!(reply.status, 200);
        // armed, with a delay far below the 300 ms first byte: the hedge
        // would fire if the router were still racing
        let delay = common::decision(&reply)
            .strip_prefix("armed; delay_ms=")
            .and_then(|v| v.split(';').next())
            .and_then(|v| v.parse::<u64>().ok());
        assert!(
            delay.is_some_and(|d| d < 100),
            "{reply:?}\n{}",
            envoy.filter_stats("backend")
        );
        assert_eq!(reply.body.matches("data: ").count(), 3, "{}", reply.body);
        assert!(reply.elapsed >= Duration::from_millis(300), "{reply:?}");
        let t = sim.settle(Duration::from_secs(3));
        assert_eq!(
            (t.arrivals, t.completions, t.cancellations),
            (1, 1, 0),
            "{t:?}"
        );
    });
    envoy.assert_no_vm_failure();
}

/// Arming adds the router's headers and nothing else: the host receives
/// the request's own headers as it would without the filter, repeated
/// headers included. (Writing the whole map back in one call, which would
/// save three calls, costs Envoy about 100k instructions: docs/evaluation.md,
/// "The filter's own cost".)
#[test]
fn an_armed_request_reaches_the_host_with_its_own_headers_intact() {
    let names = "accept,x-a,cookie,user-agent,x-forwarded-for,x-sim-echo";
    let headers = [
        ("accept", "text/plain"),
        ("x-a", "1"),
        ("x-a", "2"),
        ("cookie", "a=1"),
        ("cookie", "b=2"),
        ("user-agent", "probe/1"),
        ("x-forwarded-for", "10.0.0.1"),
        ("x-sim-echo", names),
    ];
    let echoed = |reply: &load::Reply| -> Vec<(String, Option<String>)> {
        names
            .split(',')
            .map(|n| {
                (
                    n.to_string(),
                    reply.headers.get(&format!("x-sim-echo-{n}")).cloned(),
                )
            })
            .collect()
    };
    let sim = Simulator::start(vec![steady(), steady(), steady()]).unwrap();
    let baseline = Envoy::start(EnvoyOptions::new("envoy-baseline.yaml", sim.ports())).unwrap();
    let client = load::client();
    let rt = runtime();
    let without = rt
        .block_on(request(&client, "GET", &baseline.url("/"), &headers))
        .unwrap();
    drop(baseline);
    let (_sim, envoy, client, rt) = warmed_up();
    let with = rt
        .block_on(request(&client, "GET", &envoy.url("/"), &headers))
        .unwrap();
    let decision = common::decision(&with);
    assert!(decision.starts_with("armed"), "{decision}");
    assert_eq!(echoed(&with), echoed(&without), "{with:?}");
    assert!(
        echoed(&with).iter().all(|(_, v)| v.is_some()),
        "every header reached the host: {with:?}"
    );
    envoy.assert_no_vm_failure();
}

/// The filter tells a relayed response by the router's
/// `x-envoy-upstream-service-time` (one read of the response headers): an
/// operator who suppresses Envoy's headers loses that mark, and the filter
/// falls back to `response.code_details`, still learning and hedging.
#[test]
fn suppressed_envoy_headers_still_learn_and_hedge() {
    const ROUTER: &str =
        r#""@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"#;
    let sim = Simulator::start(vec![steady(), steady(), steady()]).unwrap();
    let envoy = Envoy::start(
        EnvoyOptions::new("envoy.yaml", sim.ports())
            .plugin_config(ROOMY_BUDGET)
            .edit(
                ROUTER,
                &format!("{ROUTER}\n                      suppress_envoy_headers: true"),
            ),
    )
    .unwrap();
    let (client, rt) = (load::client(), runtime());
    rt.block_on(async {
        common::warm_up(&client, &envoy, "/", 400, 4).await;
        let delay = common::learned_delay_ms(&envoy, "backend");
        assert!((4.0..=200.0).contains(&delay), "learned {delay} ms");
        let reply = common::armed_first_attempt_a_second_late(&client, &envoy, &sim, "/slow").await;
        assert_eq!(
            reply.headers.get("x-envoy-upstream-service-time"),
            None,
            "the router's headers are suppressed"
        );
        assert_eq!(
            reply.headers.get("x-sim-attempt").map(String::as_str),
            Some("2"),
            "the hedge should answer: {reply:?}; {}",
            envoy.filter_stats("backend")
        );
    });
    assert!(envoy.filter_stat("window_samples", "backend").unwrap_or(0) >= 100);
    envoy.assert_no_vm_failure();
}

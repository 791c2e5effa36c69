//! Streaming upstreams (SSE, LLM tokens) hedged on the first body byte:
//! `envoy-configs/envoy-streaming.yaml` runs the module twice, downstream
//! (learns, arms, marks) and as the cluster's upstream filter (holds each
//! marked attempt's 2xx headers until its first body byte). Real Envoy, the
//! real .wasm, a real streaming upstream simulator.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use integration_tests::harness::envoy::{Envoy, EnvoyOptions};
use integration_tests::harness::load::{self, request, Reply};
use integration_tests::harness::sim::{Latency, Simulator, Stream};
use integration_tests::runtime;
use integration_tests::tools::config_check::check;

const CONFIG: &str = "envoy-streaming.yaml";
/// The downstream role's plugin config as shipped in CONFIG.
const SHIPPED_DOWNSTREAM: &str =
    r#"value: "{\"latency_signal\": \"first_byte\", \"host_choice\": false}""#;
const CHUNKS: u64 = 5;

/// The downstream config for tests: the shipped first-byte mode, learning
/// fast, a roomy budget (these tests check the race, not the budget) and
/// the debug header.
fn downstream(extra: &str) -> String {
    plugin_value(&format!(
        r#"{{"latency_signal": "first_byte", "min_samples": 50, "budget_percent": 50, "debug_header": true{extra}}}"#
    ))
}

/// The same, learning from (and hedging on) the response headers instead,
/// with a delay floor far above the ~1 ms header time and far below the 1 s
/// first byte: every GET is armed, but its per-try timer is stopped by the
/// first attempt's headers. (At the learned ~1 ms a hedge could go out
/// before the headers on a busy box and even win the header race; one run
/// in three did that here.)
fn downstream_on_headers() -> String {
    plugin_value(
        r#"{"min_samples": 50, "budget_percent": 50, "min_delay": "100ms", "debug_header": true}"#,
    )
}

fn plugin_value(json: &str) -> String {
    format!("value: {}", serde_json::to_string(json).unwrap())
}

fn streaming_envoy(sim: &Simulator, extra: &str) -> EnvoyOptions {
    EnvoyOptions::new(CONFIG, sim.ports()).edit(SHIPPED_DOWNSTREAM, &downstream(extra))
}

/// Three hosts streaming CHUNKS chunks 5 ms apart, first byte after ~20 ms.
fn streaming_sim() -> Simulator {
    let sim = Simulator::start(vec![Latency::fixed_ms(20); 3]).unwrap();
    sim.set_stream(Some(Stream {
        chunks: CHUNKS,
        gap: Duration::from_millis(5),
    }));
    sim
}

fn h2c(options: EnvoyOptions) -> EnvoyOptions {
    options.edit(
        "explicit_http_config:\n            http_protocol_options: {}",
        "explicit_http_config:\n            http2_protocol_options: {}",
    )
}

fn assert_full_stream(reply: &Reply, attempt: &str) {
    assert_eq!(reply.status, 200, "{reply:?}");
    for i in 0..CHUNKS {
        let chunk = format!("attempt={attempt} chunk={i}\n");
        assert!(
            reply.body.contains(&chunk),
            "missing {chunk:?} in {:?}",
            reply.body
        );
    }
    assert!(
        !reply.body.contains(if attempt == "1" {
            "attempt=2"
        } else {
            "attempt=1"
        }),
        "two attempts mixed in one body: {:?}",
        reply.body
    );
}

/// Sends requests (`send`) until one comes back armed, at most 20, 300 ms
/// apart, and returns it (a worker new to the cluster arms it from its next
/// tick: see `common::warm_up`). The unarmed replies must say why
/// (`warming_up`, `unconfirmed`, or held back: `paced`, `stale_delay`) and
/// carry attempt 1's whole stream.
async fn until_armed<F, Fut>(envoy: &Envoy, mut send: F) -> Reply
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Reply>,
{
    for _ in 0..20 {
        let reply = send().await;
        if common::decision(&reply).starts_with("armed") {
            return reply;
        }
        // (or, first of all, before any upstream answered: unconfirmed;
        // or held back while an earlier armed request's timeouts stand on
        // the host: paced, stale_delay)
        assert!(
            [
                "skipped; reason=warming_up",
                "skipped; reason=unconfirmed",
                "skipped; reason=paced",
                "skipped; reason=stale_delay",
            ]
            .contains(&common::decision(&reply)),
            "{reply:?}"
        );
        assert_full_stream(&reply, "1");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("never armed: {}", envoy.filter_stats("backend"))
}

/// Streaming hosts and Envoy running both roles (`h2`: h2c to the hosts),
/// after 200 warm-up requests: the filter has learned the time to first
/// byte and arms every GET.
fn warmed_up(h2: bool) -> (Simulator, Envoy, load::Client, tokio::runtime::Runtime) {
    let sim = streaming_sim();
    let mut options = streaming_envoy(&sim, "");
    if h2 {
        options = h2c(options);
    }
    let envoy = Envoy::start(options).unwrap();
    let client = load::client();
    let rt = runtime();
    rt.block_on(common::warm_up(&client, &envoy, "/", 200, 4));
    // The tests after this want requests armed one after another although
    // each outlives its delay: both workers must have read from Envoy's
    // admin interface that no outlier detection counts the timeouts (each
    // says so once), else pacing may hold one back.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while envoy.log().matches("outlier pacing off").count() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "pacing still on after 10 s: {}",
            envoy.log()
        );
        rt.block_on(common::warm_up(&client, &envoy, "/", 40, 4));
    }
    (sim, envoy, client, rt)
}

/// A streamed request whose first attempt's first byte is 1 s late is
/// answered by the hedge near the learned delay, with the hedge's whole
/// body; the loser is cancelled. The same request without the upstream role
/// (headers mode, as Envoy alone would do it) waits the full second.
fn first_byte_race(h2: bool) {
    let (sim, envoy, client, rt) = warmed_up(h2);
    rt.block_on(async {
        let delay = common::learned_delay_ms(&envoy, "backend");
        assert!(
            (15.0..=120.0).contains(&delay),
            "learned time to first byte of a 20 ms stream: {delay} ms; {}",
            envoy.filter_stats("backend")
        );
        let reply =
            common::armed_first_attempt_a_second_late(&client, &envoy, &sim, "/v1/completions")
                .await;
        assert_eq!(
            reply.headers.get("x-sim-attempt").map(String::as_str),
            Some("2"),
            "the hedge should answer: {reply:?}"
        );
        assert_full_stream(&reply, "2");
        let first_byte = reply.first_byte_after.unwrap().as_secs_f64() * 1000.0;
        let headers = reply.headers_after.as_secs_f64() * 1000.0;
        assert!(
            first_byte >= delay && first_byte < delay + 400.0,
            "first byte at {first_byte:.1} ms, delay {delay} ms"
        );
        // the client gets the headers with the first byte, not before, and
        // Envoy's upstream service time becomes the time to first byte
        assert!(headers >= delay, "headers at {headers:.1} ms");
        let service_ms: f64 = reply
            .headers
            .get("x-envoy-upstream-service-time")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        assert!(service_ms >= delay, "upstream service time {service_ms} ms");
        let counts = sim.settle(Duration::from_secs(3));
        assert_eq!(counts.arrivals, 2, "{counts:?}");
        assert_eq!(
            counts.cancellations, 1,
            "the slow first attempt: {counts:?}"
        );
    });
    // Both attempts held (the hedge saw the marker the first attempt left on
    // the shared request headers), one released, the loser ended held.
    // (The upstream role flushes its counters on its 1 s tick.)
    envoy.wait_for_stats("2 holds, 1 release, 1 ended held", |s| {
        let get = |m: &str| s.get(&format!("wasmcustom.adaptive_hedge.{m}")).copied();
        get("first_byte_holds_total") >= Some(2)
            && get("first_byte_releases_total") >= Some(1)
            && get("first_byte_held_ended_total") >= Some(1)
    });
    assert!(envoy.flushed_filter_stat("hedges_sent_total", "backend", 1) >= 1);
    envoy.assert_no_vm_failure();
    drop(envoy);

    // Control: headers mode (no marker, so nothing is held). The request is
    // armed with a 100 ms delay, yet the router commits to the first
    // attempt's immediate 200 and the hedge never fires.
    let plain = Envoy::start(
        EnvoyOptions::new(CONFIG, sim.ports()).edit(SHIPPED_DOWNSTREAM, &downstream_on_headers()),
    )
    .unwrap();
    rt.block_on(async {
        common::warm_up(&client, &plain, "/", 200, 4).await;
        let reply = until_armed(&plain, || {
            sim.reset_counts();
            common::first_attempt_a_second_late(&client, &plain, "/v1/completions")
        })
        .await;
        assert!(
            common::decision(&reply).starts_with("armed; delay_ms=100"),
            "{reply:?}"
        );
        assert_full_stream(&reply, "1");
        let first_byte = reply.first_byte_after.unwrap().as_secs_f64() * 1000.0;
        assert!(first_byte >= 950.0, "first byte at {first_byte:.1} ms");
        assert_eq!(sim.settle(Duration::from_secs(3)).arrivals, 1);
    });
    plain.assert_no_vm_failure();
}

#[test]
fn hedge_wins_on_first_byte_over_http1() {
    first_byte_race(false);
}

#[test]
fn hedge_wins_on_first_byte_over_h2c() {
    first_byte_race(true);
}

/// Both attempts' first bytes come long after the delay: the answer is
/// still the 200 of one of them (whichever byte came first), never a 504
/// made by a per-try timeout, and the stream is whole.
#[test]
fn both_attempts_slower_than_the_delay_still_end_in_a_200() {
    let (sim, envoy, client, rt) = warmed_up(false);
    rt.block_on(async {
        let delay = common::learned_delay_ms(&envoy, "backend");
        for _ in 0..5 {
            sim.reset_counts();
            let reply = request(
                &client,
                "GET",
                &envoy.url("/v1/completions"),
                &[("x-sim-delay-ms", "400")],
            )
            .await
            .unwrap();
            let attempt = reply
                .headers
                .get("x-sim-attempt")
                .cloned()
                .unwrap_or_default();
            assert_full_stream(&reply, &attempt);
            assert!(common::decision(&reply).starts_with("armed"), "{reply:?}");
            let first_byte = reply.first_byte_after.unwrap().as_secs_f64() * 1000.0;
            assert!(first_byte >= 400.0, "first byte at {first_byte:.1} ms");
            // the hedge went out at the delay, well before either first byte
            let counts = sim.settle(Duration::from_secs(3));
            assert_eq!(counts.arrivals, 2, "delay {delay} ms: {counts:?}");
        }
    });
    envoy.assert_no_vm_failure();
}

/// Responses with nothing to wait for, or that must not wait, pass both
/// roles at once: 204, 304, HEAD, empty bodies, 503 and (over HTTP/1.1) a
/// WebSocket upgrade, on armed requests. A held one would hang until the
/// route timeout (60 s), so "fast" here means "not held".
fn pass_through(h2: bool) {
    let (_sim, envoy, client, rt) = warmed_up(h2);
    rt.block_on(async {
        let cases: [Case; 7] = [
            (
                "GET",
                &[("x-sim-stream", "off"), ("x-sim-status", "204")],
                204,
            ),
            (
                "GET",
                &[("x-sim-stream", "off"), ("x-sim-status", "304")],
                304,
            ),
            ("HEAD", &[], 200),
            (
                "GET",
                &[("x-sim-stream", "off"), ("x-sim-body", "empty")],
                200,
            ),
            // headers at once, then the end of an empty body 30 ms later: held, then released
            (
                "GET",
                &[("x-sim-stream", "0"), ("x-sim-delay-ms", "30")],
                200,
            ),
            // ended by trailers alone (sent over h2c; HTTP/1.1 ends it plainly)
            (
                "GET",
                &[
                    ("x-sim-stream", "0"),
                    ("x-sim-trailers", "1"),
                    ("x-sim-delay-ms", "30"),
                ],
                200,
            ),
            (
                "GET",
                &[("x-sim-stream", "off"), ("x-sim-status", "503")],
                503,
            ),
        ];
        for (method, headers, status) in cases {
            let t0 = Instant::now();
            let reply = tokio::time::timeout(
                Duration::from_secs(10),
                request(&client, method, &envoy.url("/edge"), headers),
            )
            .await
            .unwrap_or_else(|_| panic!("{method} {headers:?} hung"))
            .unwrap();
            assert_eq!(reply.status, status, "{method} {headers:?}: {reply:?}");
            if status != 503 {
                assert!(reply.body.is_empty(), "{method} {headers:?}: {reply:?}");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(3),
                "{method} {headers:?} took {:?}",
                t0.elapsed()
            );
            if status != 503 {
                assert!(
                    common::decision(&reply).starts_with("armed"),
                    "{method} {headers:?} should be armed (so marked): {reply:?}"
                );
            }
        }
    });
    if !h2 {
        // Envoy speaks WebSocket upstream over HTTP/1.1 only (h2 would need
        // extended CONNECT on the host).
        let (head, echo) = websocket_roundtrip(envoy.listener_port, b"ping over the upgrade");
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        assert!(
            head.contains("x-adaptive-hedge: skipped; reason=upgrade"),
            "{head}"
        );
        assert_eq!(echo, b"ping over the upgrade");
    }
    envoy.assert_no_vm_failure();
}

/// Method, request headers, expected status.
type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], u16);

/// A raw WebSocket upgrade through Envoy: the 101's head, then what the
/// upstream echoed of `payload`.
fn websocket_roundtrip(port: u16, payload: &[u8]) -> (String, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /ws HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "closed after {head:?}");
        head.push(byte[0]);
    }
    s.write_all(payload).unwrap();
    let mut echo = vec![0u8; payload.len()];
    s.read_exact(&mut echo).unwrap();
    (
        String::from_utf8_lossy(&head)
            .to_lowercase()
            .replace("http/1.1", "HTTP/1.1"),
        echo,
    )
}

#[test]
fn responses_that_must_not_wait_pass_at_once_over_http1() {
    pass_through(false);
}

#[test]
fn responses_that_must_not_wait_pass_at_once_over_h2c() {
    pass_through(true);
}

/// The first-byte marker the upstream host received (echoed by the simulator).
fn marker(reply: &Reply) -> Option<&str> {
    reply.headers.get("x-sim-marker").map(String::as_str)
}

/// Only requests the filter arms carry the marker upstream: a client's own
/// marker is removed from a request that is not armed, and replaced on one
/// that is.
#[test]
fn only_armed_requests_are_marked() {
    let sim = streaming_sim();
    let envoy = Envoy::start(streaming_envoy(&sim, "").trust_loopback_clients()).unwrap();
    let client = load::client();
    runtime().block_on(async {
        common::warm_up(&client, &envoy, "/", 200, 4).await;
        // pacing (until the worker's admin read) may hold one back
        let armed = common::until_not_held_back(&client, &envoy.url("/"), &[]).await;
        assert_eq!(marker(&armed), Some("1"), "{armed:?}");
        let forged = request(
            &client,
            "GET",
            &envoy.url("/"),
            &[("x-adaptive-hedge-first-byte", "forged")],
        )
        .await
        .unwrap();
        assert_eq!(marker(&forged), Some("1"));
        let unarmed = request(
            &client,
            "DELETE",
            &envoy.url("/"),
            &[("x-adaptive-hedge-first-byte", "1")],
        )
        .await
        .unwrap();
        assert_eq!(unarmed.status, 200);
        assert!(
            common::decision(&unarmed).contains("reason=method"),
            "{unarmed:?}"
        );
        assert_eq!(marker(&unarmed), None, "{unarmed:?}");
    });
    envoy.assert_no_vm_failure();
}

/// `make check-configs`: every shipped config passes, and the mistakes
/// Envoy accepts silently are refused, each with its reason.
#[test]
fn config_check_passes_shipped_configs_and_refuses_silent_mistakes() {
    let root = integration_tests::harness::envoy::repo_root();
    let mut shipped = Vec::new();
    let mut dirs = vec![root.join("envoy-configs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                shipped.push(path);
            }
        }
    }
    let mut upstream_roles = 0;
    for path in &shipped {
        let report = check(&std::fs::read_to_string(path).unwrap());
        assert!(
            report.problems.is_empty(),
            "{}: {:?}",
            path.display(),
            report.problems
        );
        upstream_roles += report.upstream;
    }
    assert!(
        upstream_roles >= 1,
        "no shipped config runs the upstream role"
    );

    let streaming = std::fs::read_to_string(root.join("envoy-configs").join(CONFIG)).unwrap();
    let refused = |text: &str, why: &str| {
        let report = check(text);
        assert!(
            report.problems.iter().any(|p| p.contains(why)),
            "expected a problem with {why:?}: {:?}",
            report.problems
        );
    };
    refused(
        &streaming.replace(
            "allow_on_headers_stop_iteration: true",
            "allow_on_headers_stop_iteration: false",
        ),
        "allow_on_headers_stop_iteration",
    );
    refused(
        &streaming.replace(
            "                  allow_on_headers_stop_iteration: true\n",
            "",
        ),
        "hangs until the route timeout",
    );
    // Istio's MERGE replaces the cluster's whole HttpProtocolOptions: a
    // patch without its own protocol selection leaves none
    let istio = std::fs::read_to_string(root.join("envoy-configs/istio/streaming.yaml")).unwrap();
    refused(
        &istio.replace(
            "              explicit_http_config:\n                http_protocol_options: {}\n",
            "",
        ),
        "without a protocol selection",
    );
    // the roles swapped: each in the other's chain
    refused(
        &streaming.replace(r#"{\"role\": \"upstream\"}"#, "{}"),
        "downstream role in a cluster's http_filters",
    );
    refused(
        &streaming.replace(SHIPPED_DOWNSTREAM, r#"value: "{\"role\": \"upstream\"}""#),
        "not the HTTP connection manager's",
    );
    refused(
        &streaming.replace(
            "            - name: envoy.filters.http.upstream_codec",
            "            - name: envoy.filters.http.buffer",
        ),
        "must end with envoy.filters.http.upstream_codec",
    );
    refused(
        &streaming.replace("first_byte", "first_bite"),
        "latency_signal",
    );
    // first_byte with no upstream role anywhere in the file: a warning
    let plain = std::fs::read_to_string(root.join("envoy-configs/envoy.yaml")).unwrap();
    let report = check(&plain.replace(r#"value: "{}""#, SHIPPED_DOWNSTREAM));
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("no {\"role\": \"upstream\"}")),
        "{:?}",
        report.warnings
    );
}

/// The trap the config check exists for, at run time: without
/// `allow_on_headers_stop_iteration` an armed stream hangs until the route
/// timeout (a 504 here, at 3 s), and once holds have ended so, none ever
/// released, the upstream role says why in Envoy's log. Requests that are
/// not armed (warm-up) are untouched.
#[test]
fn without_allow_on_headers_stop_iteration_the_hang_is_named_in_the_log() {
    let sim = streaming_sim();
    let envoy = Envoy::start(
        streaming_envoy(&sim, "")
            .edit(
                "                  allow_on_headers_stop_iteration: true\n",
                "",
            )
            .edit("timeout: 60s", "timeout: 3s")
            // one worker: each worker's upstream role judges its own holds
            // (three that ended held), and with two the hung ones of this
            // short test may split two and two
            .concurrency(1),
    )
    .unwrap();
    let client = load::client();
    runtime().block_on(async {
        // Learning needs 50 samples; the requests armed after that hang too.
        let warm =
            load::closed_loop(&client, &envoy.url("/"), 4, 60, Duration::from_secs(10)).await;
        assert!(warm.ok() >= 50, "{}", warm.summary());
        // two armed requests: each one's primary and hedge held until the
        // route timeout, the role's evidence (three holds ended held)
        for _ in 0..2 {
            let reply = until_armed(&envoy, || async {
                request(&client, "GET", &envoy.url("/v1/completions"), &[])
                    .await
                    .unwrap()
            })
            .await;
            assert_eq!(reply.status, 504, "held until the route timeout: {reply:?}");
        }
    });
    let log = envoy.wait_for_log("allow_on_headers_stop_iteration");
    assert!(log.contains("none was ever released"));
    envoy.assert_no_vm_failure_except(&["none was ever released"]);
}

/// Each role in the other's chain starts, says so once in Envoy's log, and
/// passes requests through untouched.
#[test]
fn a_role_in_the_wrong_chain_is_named_and_passes_through() {
    let sim = streaming_sim();
    let swapped = [
        (
            streaming_envoy(&sim, "")
                .edit(r#"value: "{\"role\": \"upstream\"}""#, r#"value: "{}""#),
            "running as an upstream filter (a cluster's http_filters) with the downstream role",
        ),
        (
            EnvoyOptions::new("envoy.yaml", sim.ports()).plugin_config(r#"{"role": "upstream"}"#),
            "configured with \"role\": \"upstream\" but running in the HTTP connection manager's",
        ),
    ];
    let client = load::client();
    let rt = runtime();
    for (options, complaint) in swapped {
        let envoy = Envoy::start(options).unwrap();
        rt.block_on(async {
            for _ in 0..20 {
                let reply = request(&client, "GET", &envoy.url("/"), &[]).await.unwrap();
                assert_full_stream(&reply, "1");
            }
        });
        let log = envoy.log();
        assert!(log.contains(complaint), "{complaint}:\n{log}");
        // once per VM, not per request
        assert!(log.matches(complaint).count() <= 3, "{log}");
        envoy.assert_no_vm_failure_except(&["Requests pass through untouched"]);
    }
}

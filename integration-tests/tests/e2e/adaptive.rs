//! Adaptive behaviour against real Envoy: where hedges go, per-cluster
//! delays, the budget under an outage, workers learning together.

use crate::common;

use std::time::Duration;

use integration_tests::harness::envoy::{filter_stat_name, Envoy, EnvoyOptions};
use integration_tests::harness::load::{self, request};
use integration_tests::harness::sim::{HostCounts, Latency, Simulator};
use integration_tests::runtime;

fn lognormal(mean_ms: f64, sd_ms: f64) -> Latency {
    Latency::LogNormal {
        mean_ms,
        sd_ms,
        straggler_prob: 0.0,
        straggler_mult: 1.0,
    }
}

/// The hedge goes to a different host than the primary (previous_hosts).
#[test]
fn hedge_goes_to_another_host() {
    let m = lognormal(3.0, 0.5);
    let sim = Simulator::start(vec![m.clone(), m.clone(), m.clone()]).unwrap();
    let envoy = Envoy::start(
        EnvoyOptions::new("envoy.yaml", sim.ports())
            .plugin_config(r#"{"budget_percent": 50, "debug_header": true}"#),
    )
    .unwrap();
    let client = load::client();
    runtime().block_on(async {
        common::warm_up(&client, &envoy, "/", 300, 4).await;
        // A held primary is cancelled, never answered: its host keeps the
        // timeout standing until it answers another request, and a host
        // with two is held back (`timeouts`); a request with no pair of
        // hosts clear goes unarmed (`paced`), and its answer clears the
        // count. Allowed a few times; the next held request is hedged.
        let mut paced = 0;
        let mut i = 0;
        while i < 10 {
            // ordinary traffic in between earns the tokens each hedge spends
            // (ten back-to-back hedges on one connection would drain one
            // worker's budget, as designed)
            for _ in 0..4 {
                request(&client, "GET", &envoy.url("/"), &[]).await.unwrap();
            }
            sim.settle(Duration::from_secs(3));
            sim.reset_counts();
            let r = request(
                &client,
                "GET",
                &envoy.url("/"),
                &[("x-sim-first-delay-ms", "500")],
            )
            .await
            .unwrap();
            if common::decision(&r).starts_with("skipped; reason=paced") && paced < 3 {
                paced += 1;
                sim.settle(Duration::from_secs(3));
                continue;
            }
            assert_eq!(
                r.headers.get("x-sim-attempt").map(String::as_str),
                Some("2"),
                "request {i}: {r:?}"
            );
            let counts = sim.settle(Duration::from_secs(3));
            assert_eq!(counts.arrivals, 2);
            let primary = sim
                .counts()
                .iter()
                .position(|c| c.cancellations == 1)
                .expect("the held primary was cancelled");
            let winner: usize = r.headers["x-sim-host"].parse().unwrap();
            assert_ne!(
                primary, winner,
                "request {i}: the hedge went to the primary's host"
            );
            i += 1;
        }
    });
    envoy.assert_no_vm_failure();
}

/// Two clusters, ~2 ms and ~50 ms (25x apart): their learned delays differ
/// by at least 5x (a slowed VM inflates the fast one most) and each tracks
/// its own tail (the p94 with the defaults).
#[test]
fn each_cluster_learns_its_own_delay() {
    let fast = lognormal(2.0, 0.5);
    let sim = Simulator::start(vec![
        fast.clone(),
        fast.clone(),
        fast,
        lognormal(50.0, 10.0),
    ])
    .unwrap();
    let envoy = Envoy::start(EnvoyOptions::new("envoy.yaml", sim.ports())).unwrap();
    let client = load::client();
    let (fast_run, slow_run) = runtime().block_on(async {
        let (fast_url, slow_url) = (envoy.url("/"), envoy.url("/b/"));
        // one after the other, few callers: a 2 ms backend stays ~2 ms on 2 cores
        let f = load::closed_loop(&client, &fast_url, 2, 1500, Duration::from_secs(5)).await;
        let s = load::closed_loop(&client, &slow_url, 8, 400, Duration::from_secs(5)).await;
        (f, s)
    });
    // every request counted (each worker's first ones to a cluster, before
    // an upstream answered, as unconfirmed) and (but for the per-tick
    // sample cap) in the windows the delays come from
    envoy.wait_for_stats("both windows filled", |s| {
        let get = |m, c| s.get(&filter_stat_name(m, c)).copied().unwrap_or(0);
        let unconfirmed = s
            .get("wasmcustom.adaptive_hedge.unconfirmed_requests_total")
            .copied()
            .unwrap_or(0);
        get("requests_total", "backend") + get("requests_total", "backend-b") + unconfirmed >= 1900
            && ["backend", "backend-b"]
                .iter()
                .all(|c| get("window_samples", c) >= get("requests_total", c) * 9 / 10)
    });
    assert_eq!(fast_run.ok(), 1500, "{}", fast_run.summary());
    assert_eq!(slow_run.ok(), 400, "{}", slow_run.summary());
    let d_fast = common::learned_delay_ms(&envoy, "backend");
    let d_slow = common::learned_delay_ms(&envoy, "backend-b");
    assert!(
        d_slow >= 5.0 * d_fast,
        "delays {d_fast} ms and {d_slow} ms are not 5x apart; clients saw {} / {}",
        fast_run.summary(),
        slow_run.summary()
    );
    // each close to the p90 its clients saw (the filter times from the same
    // request headers the client's latency includes; loopback noise aside:
    // on a busy 2-core box the client's scheduling adds to its own p90
    // alone, so the lower bound is loose)
    for (name, delay, run) in [
        ("backend", d_fast, &fast_run),
        ("backend-b", d_slow, &slow_run),
    ] {
        let p90 = run.ms(0.9);
        assert!(
            delay >= 0.4 * p90 && delay <= 1.4 * p90 + 1.0,
            "{name}: learned {delay} ms, clients saw p90 {p90} ms ({})",
            run.summary()
        );
    }
    // backend-b's p90 of lognormal(50, 10) is about 63 ms
    // (upper bound with room for a noisy box's stalls)
    assert!((50.0..150.0).contains(&d_slow), "{d_slow}");
    envoy.assert_no_vm_failure();
}

/// Two named routes to the same cluster and hosts, one ten times slower
/// (the simulator scales paths under /x10/): each route arms its own delay,
/// near the p90 its clients saw, where one delay for the cluster would be
/// the mix's.
#[test]
fn each_route_learns_its_own_delay() {
    let m = lognormal(3.0, 0.7);
    let sim = Simulator::start(vec![m.clone(), m.clone(), m, lognormal(3.0, 0.7)]).unwrap();
    let envoy = Envoy::start(
        EnvoyOptions::new("envoy.yaml", sim.ports()).plugin_config(r#"{"debug_header": true}"#),
    )
    .unwrap();
    let client = load::client();
    let (cheap, expensive) = runtime().block_on(async {
        let c = load::closed_loop(&client, &envoy.url("/"), 2, 1000, Duration::from_secs(5)).await;
        let e =
            load::closed_loop(&client, &envoy.url("/x10/"), 8, 400, Duration::from_secs(5)).await;
        (c, e)
    });
    assert_eq!(cheap.ok(), 1000, "{}", cheap.summary());
    assert_eq!(expensive.ok(), 400, "{}", expensive.summary());
    let route = |name: &str| {
        filter_stat_name(
            "route_hedge_delay_microseconds",
            &format!("backend.route.{name}"),
        )
    };
    let stats = envoy.wait_for_stats("both routes learned", |s| {
        ["default", "expensive"]
            .iter()
            .all(|r| s.get(&route(r)).is_some_and(|us| *us > 0))
    });
    let ms = |name: &str| stats.get(&route(name)).copied().unwrap_or(0) as f64 / 1000.0;
    let (d_cheap, d_expensive) = (ms("default"), ms("expensive"));
    assert!(
        d_expensive >= 4.0 * d_cheap,
        "route delays {d_cheap} ms and {d_expensive} ms are not 4x apart; clients saw {} / {}",
        cheap.summary(),
        expensive.summary()
    );
    for (name, delay, run) in [
        ("default", d_cheap, &cheap),
        ("expensive", d_expensive, &expensive),
    ] {
        let p90 = run.ms(0.9);
        assert!(
            delay >= 0.4 * p90 && delay <= 1.4 * p90 + 1.0,
            "{name}: learned {delay} ms, clients saw p90 {p90} ms ({})",
            run.summary()
        );
    }
    // and the requests are armed with them: the cheap route's per-try
    // timeout is well below the cluster's (the mix's) delay
    let cluster_ms = common::learned_delay_ms(&envoy, "backend");
    runtime().block_on(async {
        for (path, route_ms) in [("/", d_cheap), ("/x10/", d_expensive)] {
            // A worker that has not served the route yet arms its first
            // request with the cluster's delay and takes the route's from
            // its next tick (it registers the route on the tick, as it
            // does clusters); a request may also find the worker's tokens
            // spent. So: the route's delay within seconds (a tick or two), on one
            // connection (one worker).
            let mut connection = load::Connection::open(envoy.listener_port).await.unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            let mut seen = Vec::new();
            loop {
                let reply = connection.get(path, &[]).await.unwrap();
                let armed = common::decision(&reply)
                    .strip_prefix("armed; delay_ms=")
                    .and_then(|rest| rest.split(';').next())
                    .and_then(|ms| ms.trim().parse::<f64>().ok());
                seen.push(common::decision(&reply).to_string());
                if armed.is_some_and(|ms| (ms - route_ms).abs() <= 0.3 * route_ms + 2.0) {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{path}: its route learned {route_ms} ms (cluster {cluster_ms} ms), armed: {seen:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    assert!(
        d_cheap < 0.5 * cluster_ms,
        "cheap route {d_cheap} ms vs cluster {cluster_ms} ms"
    );
    envoy.assert_no_vm_failure();
}

/// Warms a cluster of three 2 ms hosts up (`max_delay: 5ms`), turns every
/// host 40 ms slow and sends `requests` at `rate` req/s: every armed
/// request hedges. The run, the attempts the hosts counted since the
/// warm-up, the warm-up's requests, and the Envoy.
fn outage(rate: f64, requests: u64) -> (load::LoadResult, HostCounts, u64, Envoy) {
    let sim = Simulator::start(vec![
        lognormal(2.0, 0.3),
        lognormal(2.0, 0.3),
        lognormal(2.0, 0.3),
    ])
    .unwrap();
    let envoy = Envoy::start(
        EnvoyOptions::new("envoy.yaml", sim.ports())
            .plugin_config(r#"{"max_delay": "5ms", "debug_header": true}"#),
    )
    .unwrap();
    let client = load::client();
    let (run, warm_up) = runtime().block_on(async {
        let warm_up = common::warm_up(&client, &envoy, "/", 300, 4).await;
        sim.reset_counts();
        sim.set_all_models(Latency::fixed_ms(40));
        let run = load::open_loop(
            &client,
            &envoy.url("/"),
            rate,
            requests,
            Duration::from_secs(10),
        )
        .await;
        (run, warm_up)
    });
    let counts = sim.settle(Duration::from_secs(5));
    (run, counts, warm_up, envoy)
}

/// An outage: every request is slower than the delay (pinned by max_delay)
/// for the whole run. Extra upstream attempts stay within the budget + 1
/// point: 10% of the outage's requests and of the warm-up's, whose
/// savings (its reserve, in the workers and the pool) the outage spends.
#[test]
fn outage_extra_load_stays_within_budget() {
    let requests = 4000u64;
    let (run, t, warm_up, envoy) = outage(400.0, requests);
    assert_eq!(run.ok(), requests, "{}", run.summary());
    let extra = t.arrivals as f64 / requests as f64 - 1.0;
    println!(
        "outage: {} requests, {} upstream attempts, extra load {:.1}%",
        requests,
        t.arrivals,
        extra * 100.0
    );
    let bound = (requests + warm_up) as f64 * 0.10 / requests as f64 + 0.01;
    assert!(
        extra <= bound,
        "extra load {:.1}% > {:.1}%: the budget's 10% of {requests} requests and of the warm-up's {warm_up}, + 1 point ({t:?})",
        extra * 100.0,
        bound * 100.0
    );
    // and the budget was used: the outage was hedged up to it
    assert!(
        extra >= 0.07,
        "extra load {:.1}%: the budget was not used",
        extra * 100.0
    );
    assert!(envoy.flushed_filter_stat("budget_exhausted_total", "backend", 1001) > 1000);
    envoy.assert_no_vm_failure();
}

/// Workers learn together: warm-up needs min_samples in total (not per
/// worker), and both workers arm the same delay.
#[test]
fn two_workers_learn_together() {
    let m = lognormal(4.0, 1.0);
    let sim = Simulator::start(vec![m.clone(), m.clone(), m]).unwrap();
    // exact_balance: two connections land on the two different workers
    let envoy = Envoy::start(
        EnvoyOptions::new("envoy.yaml", sim.ports())
            .plugin_config(r#"{"min_samples": 100, "budget_percent": 50, "debug_header": true}"#)
            .edit(
                "    - name: ingress\n",
                "    - name: ingress\n      connection_balance_config: { exact_balance: {} }\n",
            ),
    )
    .unwrap();
    runtime().block_on(async {
        // two connections: exact_balance puts them on the two workers
        let mut a = load::Connection::open(envoy.listener_port).await.unwrap();
        let mut b = load::Connection::open(envoy.listener_port).await.unwrap();
        let decision = |r: load::Reply| common::decision(&r).to_string();
        let window_holds = |n: i64| {
            envoy.wait_for_stats(&format!("{n} samples in the window"), |s| {
                s.get(&filter_stat_name("window_samples", "backend"))
                    .is_some_and(|v| *v >= n)
            })
        };
        // the first worker's first request to a cluster comes before any
        // upstream of it answered: not tracked, no sample
        for _ in 0..61 {
            a.get("/", &[]).await.unwrap();
        }
        window_holds(60);
        // 60 samples: not enough on either worker
        assert_eq!(
            decision(a.get("/", &[]).await.unwrap()),
            "skipped; reason=warming_up"
        );
        // the second worker's first stream takes up the cluster the first
        // one registered (no request of it goes unconfirmed) and the
        // shared window: still 60 samples
        assert_eq!(
            decision(b.get("/", &[]).await.unwrap()),
            "skipped; reason=warming_up"
        );
        for _ in 0..61 {
            b.get("/", &[]).await.unwrap();
        }
        window_holds(122);
        // 61 + 61 samples, each worker below min_samples alone: both arm
        // (each from its next tick), with the same delay
        let (da, db) = (
            common::until_decided(&mut a).await,
            common::until_decided(&mut b).await,
        );
        let delay = |d: &str| -> f64 {
            let ms = d
                .strip_prefix("armed; delay_ms=")
                .and_then(|v| v.split(';').next());
            ms.and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("not armed: {d:?}; {}", envoy.filter_stats("backend")))
        };
        let (da, db) = (delay(&da), delay(&db));
        // the header shows the per-try timeout: the shared delay in whole
        // ms, plus each worker's own timer slack (a 1 ms step, when its
        // timers fired early), and the two answers may be a tick apart.
        // Without the shared window the delays would be each worker's own
        // 61 samples' quantile, and warm-up would not have ended at all.
        assert!(
            (da - db).abs() <= 1.0 + 0.02 * da.max(db),
            "worker delays {da} ms and {db} ms differ"
        );
    });
    // the two connections really were on two workers
    let stats = envoy.stats();
    let per_worker: Vec<i64> = (0..2)
        .map(|w| {
            stats
                .iter()
                .filter(|(k, _)| {
                    k.starts_with("listener.127.0.0.1_")
                        && k.ends_with(&format!("worker_{w}.downstream_cx_total"))
                })
                .map(|(_, v)| *v)
                .sum()
        })
        .collect();
    assert_eq!(per_worker, vec![1, 1], "connections per worker");
    envoy.assert_no_vm_failure();
}

/// `envoy --mode validate` accepts every config under envoy-configs/.
#[test]
fn every_shipped_config_validates() {
    let dir = integration_tests::harness::envoy::repo_root().join("envoy-configs");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        if !name.ends_with(".yaml") {
            continue;
        }
        // the upstream ports this config names (envoy-streaming.yaml has three)
        let text = std::fs::read_to_string(dir.join(&name)).unwrap();
        let ports: Vec<u16> = (8081..=8084)
            .filter(|p| text.contains(&format!("port_value: {p} ")))
            .collect();
        let (ok, output) = Envoy::validate(EnvoyOptions::new(&name, &ports)).unwrap();
        assert!(ok, "{name} does not validate:\n{output}");
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} configs found");
}

/// A cluster that answers in 3 ms, 4 callers: Envoy's timers fire early on
/// its busy event loop, and with a 4 ms per-try timeout hedges went out on
/// about 40% of armed requests (4% with one caller). The filter sees hedges
/// sent before their delay and sets the timeout later, with no `min_delay`
/// from the operator: measured here about 1%.
#[test]
fn small_delays_need_no_manual_floor() {
    let sim = Simulator::start(vec![Latency::fixed_ms(3); 3]).unwrap();
    let envoy = Envoy::start(
        EnvoyOptions::new("envoy.yaml", sim.ports())
            .plugin_config(r#"{"budget_percent": 50, "debug_header": true}"#),
    )
    .unwrap();
    let client = load::client();
    let rt = runtime();
    let warm = rt.block_on(common::warm_up(&client, &envoy, "/", 1000, 4));
    // before: every warm-up request is counted (each worker has flushed)
    envoy.requests_seen("backend", warm as i64);
    let stats = envoy.wait_for_stats("the warm-up counted", |_| true);
    let get = |s: &std::collections::HashMap<String, i64>, m| {
        s.get(&filter_stat_name(m, "backend")).copied().unwrap_or(0)
    };
    let (armed_before, sent_before) = (
        get(&stats, "hedges_armed_total"),
        get(&stats, "hedges_sent_total"),
    );
    // the hosts count the hedges too, not only the filter
    sim.settle(Duration::from_secs(3));
    sim.reset_counts();
    let run = rt.block_on(load::closed_loop(
        &client,
        &envoy.url("/"),
        4,
        3000,
        Duration::from_secs(5),
    ));
    assert_eq!(run.ok(), 3000, "{}", run.summary());
    let total = warm as i64 + 3000;
    envoy.requests_seen("backend", total);
    let stats = envoy.wait_for_stats("the run counted", |_| true);
    let armed = get(&stats, "hedges_armed_total") - armed_before;
    let sent = get(&stats, "hedges_sent_total") - sent_before;
    let extra = sim.settle(Duration::from_secs(3)).arrivals as i64 - 3000;
    println!(
        "armed {armed}, sent {sent} (the hosts saw {extra} extra), early so far {}; clients saw {}",
        get(&stats, "early_hedges_total"),
        run.summary()
    );
    // A hedge Envoy started may be cancelled before it reaches a host,
    // never the other way round: the filter's count is no undercount.
    assert!(
        extra <= sent + sent / 10 + 5,
        "the hosts saw {extra} extra attempts, the filter counted {sent} hedges"
    );
    assert!(
        armed > 2000,
        "armed {armed}: {}",
        envoy.filter_stats("backend")
    );
    // 20%: a 300 ms stall of the box alone adds about 10% in a 3 s run;
    // uncorrected, early timers sent about 40%
    assert!(
        sent.max(extra) * 5 <= armed,
        "{sent} hedges ({extra} extra attempts at the hosts) on {armed} armed requests to a 3 ms upstream: {}",
        envoy.filter_stats("backend")
    );
    envoy.assert_no_vm_failure();
}

/// Measurement, not a test (`--ignored`): the outage above at
/// `OUTAGE_RATE` req/s (default 2,000) for 10 s; prints the extra load.
#[test]
#[ignore = "a measurement at a rate this 2-core box barely sustains: run by hand"]
fn outage_extra_load_at_a_high_rate() {
    let rate: f64 = std::env::var("OUTAGE_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000.0);
    let requests = (rate * 10.0) as u64;
    let (run, t, _, envoy) = outage(rate, requests);
    println!(
        "outage at {rate} req/s: {} of {} requests ok, {} upstream attempts, extra load {:.1}%, {}",
        run.ok(),
        requests,
        t.arrivals,
        (t.arrivals as f64 / run.ok().max(1) as f64 - 1.0) * 100.0,
        run.summary()
    );
    envoy.assert_no_vm_failure();
}

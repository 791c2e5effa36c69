//! Shared steps of the real-Envoy tests.
#![allow(dead_code)]

pub mod deploy;

use std::time::{Duration, Instant};

use integration_tests::harness::envoy::Envoy;
use integration_tests::harness::load::{self, Client};
use integration_tests::harness::sim::Simulator;

/// Sends `n` GETs on `path` from `callers` concurrent callers, all expected
/// to succeed, then waits until every worker has learned the cluster: GETs
/// on `PRIMING_CONNECTIONS` new connections in a row must come back decided
/// (the debug header not `warming_up`); one that meets a worker still
/// warming up starts the count again. Returns the requests sent in all.
/// Needs `"debug_header": true` in the plugin config.
///
/// Why new connections: a worker arms a cluster only from the tick after an
/// upstream answered its first request for it (it tracks only clusters that
/// exist, and syncs those on the tick), and the
/// pooled warm-up connections may all sit on one worker. Each new
/// connection lands on a worker at random, so 32 of them in a row reach
/// both workers but once in 2^31.
pub async fn warm_up(client: &Client, envoy: &Envoy, path: &str, n: u64, callers: u64) -> u64 {
    let r = load::closed_loop(client, &envoy.url(path), callers, n, Duration::from_secs(5)).await;
    assert_eq!(r.ok(), n, "warm-up failed: {}", r.summary());
    n + until_learned(envoy, path).await
}

/// The second half of `warm_up` alone (for clusters whose warm-up cannot
/// all succeed): returns the requests it sent, whatever their status.
pub async fn until_learned(envoy: &Envoy, path: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut sent, mut decided_in_a_row) = (0, 0);
    while decided_in_a_row < PRIMING_CONNECTIONS {
        let mut connection = load::Connection::open(envoy.listener_port).await.unwrap();
        let reply = connection.get(path, &[]).await.unwrap();
        sent += 1;
        match decision(&reply) {
            "" => panic!("warm_up needs \"debug_header\": true: {reply:?}"),
            "skipped; reason=warming_up" | "skipped; reason=unconfirmed" => {
                decided_in_a_row = 0;
                assert!(
                    Instant::now() < deadline,
                    "still warming up after 10 s: {}",
                    envoy.filter_stats("")
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            _ => decided_in_a_row += 1,
        }
    }
    sent
}

/// The debug header of the first request on `connection` that its worker
/// decides (not `warming_up`), asking every 20 ms for up to 10 s.
pub async fn until_decided(connection: &mut load::Connection) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = connection.get("/", &[]).await.unwrap();
        let d = decision(&reply);
        let learning = ["skipped; reason=warming_up", "skipped; reason=unconfirmed"];
        if !learning.contains(&d) || Instant::now() > deadline {
            return d.to_string();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// New connections in a row that `warm_up` needs decided.
pub const PRIMING_CONNECTIONS: usize = 32;

/// The filter's debug header (`armed; delay_ms=..` or `skipped; reason=..`),
/// or "" when there is none.
pub fn decision(reply: &load::Reply) -> &str {
    let header = reply
        .headers
        .get("x-adaptive-hedge")
        .map_or("", String::as_str);
    // the host attribution that may follow is not the decision
    header
        .split("; hosts=")
        .next()
        .unwrap_or_default()
        .split("; answered=")
        .next()
        .unwrap_or_default()
}

/// A GET of `url` with `headers`, asked again (at most 10 times, on the
/// pooled client) while the filter held it back for the moment: its
/// worker's tokens spent by the warm-up's hedges (on a 2-3 ms upstream the
/// early timers of a busy loop can spend a whole budget), outlier pacing
/// not yet turned off on that worker, or a latched delay. Such a decision
/// says nothing of what the test asks.
pub async fn until_not_held_back(
    client: &Client,
    url: &str,
    headers: &[(&str, &str)],
) -> load::Reply {
    let mut tries = 0;
    loop {
        let reply = load::request(client, "GET", url, headers).await.unwrap();
        tries += 1;
        if !held_back(&reply) || tries >= 10 {
            return reply;
        }
    }
}

/// Whether the filter held the request back for the moment (its worker's
/// tokens spent, outlier pacing, a latched delay): a decision that says
/// nothing of what a test of an armed request asks.
fn held_back(reply: &load::Reply) -> bool {
    matches!(
        decision(reply),
        "skipped; reason=budget_exhausted"
            | "skipped; reason=paced"
            | "skipped; reason=stale_delay"
    )
}

/// The host attribution of the debug header: the hosts the filter named
/// (`primary[,hedge]`, if it chose) and the host that answered.
pub fn hosts_of(reply: &load::Reply) -> (Option<&str>, Option<&str>) {
    let header = reply
        .headers
        .get("x-adaptive-hedge")
        .map_or("", String::as_str);
    let field = |name: &str| header.split("; ").find_map(|part| part.strip_prefix(name));
    (field("hosts="), field("answered="))
}

/// The learned delay of a cluster in milliseconds (from the gauge, once a
/// worker has flushed one).
pub fn learned_delay_ms(envoy: &Envoy, cluster: &str) -> f64 {
    envoy.flushed_filter_stat("hedge_delay_microseconds", cluster, 1) as f64 / 1000.0
}

/// `first_attempt_a_second_late`, with the hosts' counts zeroed first,
/// asked again (at most 10 times) while the filter held it back for the
/// moment (see `until_not_held_back`): a test of what an armed request
/// does must not fail on a decision that says nothing of it.
pub async fn armed_first_attempt_a_second_late(
    client: &Client,
    envoy: &Envoy,
    sim: &Simulator,
    path: &str,
) -> load::Reply {
    let mut tries = 0;
    loop {
        sim.settle(Duration::from_secs(3));
        sim.reset_counts();
        let reply = first_attempt_a_second_late(client, envoy, path).await;
        tries += 1;
        if !held_back(&reply) || tries >= 10 {
            return reply;
        }
    }
}

/// A GET to `path` whose first attempt the simulator holds for 1 s (its
/// response, or its first byte when streamed); later attempts answer at once.
pub async fn first_attempt_a_second_late(
    client: &Client,
    envoy: &Envoy,
    path: &str,
) -> load::Reply {
    load::request(
        client,
        "GET",
        &envoy.url(path),
        &[("x-sim-first-delay-ms", "1000")],
    )
    .await
    .unwrap()
}

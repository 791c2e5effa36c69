//! Shared steps of the real-Envoy tests.
#![allow(dead_code)]

pub mod deploy;

use std::time::Duration;

use integration_tests::harness::envoy::Envoy;
use integration_tests::harness::load::{self, Client};

/// Sends `n` GETs on `path` from `callers` concurrent callers, all expected to
/// succeed, then one GET on each of `PRIMING_CONNECTIONS` new connections,
/// then waits for two sync ticks so every worker has merged its samples and
/// refreshed its delay.
///
/// Why the new connections: a worker arms a cluster only from the tick after
/// its own first request for it (it syncs the clusters it has seen), and the
/// pooled warm-up connections may all sit on one worker. Each new
/// connection lands on a worker at random, so 32 of them reach both
/// workers but once in 2^31.
pub async fn warm_up(client: &Client, envoy: &Envoy, path: &str, n: u64, callers: u64) {
    let r = load::closed_loop(client, &envoy.url(path), callers, n, Duration::from_secs(5)).await;
    assert_eq!(r.ok(), n, "warm-up failed: {}", r.summary());
    for _ in 0..PRIMING_CONNECTIONS {
        let mut connection = load::Connection::open(envoy.listener_port).await.unwrap();
        let reply = connection.get(path, &[]).await.unwrap();
        assert_eq!(reply.status, 200, "warm-up failed: {reply:?}");
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
}

/// The requests `warm_up` adds to its `n`, one per new connection.
pub const PRIMING_CONNECTIONS: usize = 32;

/// The filter's debug header (`armed; delay_ms=..` or `skipped; reason=..`),
/// or "" when there is none.
pub fn decision(reply: &load::Reply) -> &str {
    reply
        .headers
        .get("x-adaptive-hedge")
        .map_or("", String::as_str)
}

/// The learned delay of a cluster in milliseconds (from the gauge).
pub fn learned_delay_ms(envoy: &Envoy, cluster: &str) -> f64 {
    envoy.filter_stat("hedge_delay_us", cluster) as f64 / 1000.0
}

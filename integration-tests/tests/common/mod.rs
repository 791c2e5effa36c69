//! Shared steps of the real-Envoy tests.
#![allow(dead_code)]

use std::time::Duration;

use integration_tests::envoy::Envoy;
use integration_tests::load::{self, Client};

/// Sends `n` GETs on `path` from `callers` concurrent callers, all expected to
/// succeed, then waits for two sync ticks so every worker has merged its
/// samples and refreshed its delay.
pub async fn warm_up(client: &Client, envoy: &Envoy, path: &str, n: u64, callers: u64) {
    let r = load::closed_loop(client, &envoy.url(path), callers, n, Duration::from_secs(5)).await;
    assert_eq!(r.ok(), n, "warm-up failed: {}", r.summary());
    tokio::time::sleep(Duration::from_millis(600)).await;
}

/// The learned delay of a cluster in milliseconds (from the gauge).
pub fn learned_delay_ms(envoy: &Envoy, cluster: &str) -> f64 {
    envoy.filter_stat("hedge_delay_us", cluster) as f64 / 1000.0
}

//! `make soak`: a sustained load over many clusters, with and without the
//! filter: errors, Envoy's memory over time, and the filter's shared memory
//! against its cluster limit.
//!
//! `SOAK_SECONDS` (60), `SOAK_RATE` (1500 req/s, open loop), `SOAK_CLUSTERS`
//! (200). Envoy runs with 2 workers; three simulated hosts (the reference
//! latency model) serve every cluster.

use std::time::{Duration, Instant};

use integration_tests::harness::envoy::{Envoy, EnvoyOptions};
use integration_tests::harness::load::{self, LoadResult};
use integration_tests::harness::sim::{Latency, Simulator};
use integration_tests::tools::scenario;

struct Outcome {
    name: String,
    result: LoadResult,
    /// (seconds since the measured load began, Envoy RSS in KiB)
    rss: Vec<(f64, u64)>,
    shared_bytes: i64,
    tracked: usize,
    untracked: i64,
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Routes `/c/<i>/` to clusters `c<i>`, each over the three hosts.
fn many_clusters(options: EnvoyOptions, n: usize, ports: &[u16]) -> EnvoyOptions {
    let mut routes = String::new();
    let mut clusters = String::new();
    for i in 0..n {
        routes.push_str(&format!(
            "                        - match: {{ prefix: \"/c/{i}/\" }}\n                          route: {{ cluster: c{i} }}\n"
        ));
        clusters.push_str(&format!(
            "    - name: c{i}\n      type: STATIC\n      connect_timeout: 1s\n      circuit_breakers: {{ thresholds: [ {{ max_retries: 1000 }} ] }}\n      load_assignment:\n        cluster_name: c{i}\n        endpoints:\n          - lb_endpoints:\n"
        ));
        for p in ports {
            clusters.push_str(&format!(
                "              - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {p} }} }} }}\n"
            ));
        }
    }
    // before the shipped configs' first route (`/b/`), which is named
    let first_route = "                        - name: b\n";
    options
        .edit(first_route, &format!("{routes}{first_route}"))
        .edit("  clusters:\n", &format!("  clusters:\n{clusters}"))
}

fn run(name: &str, options: EnvoyOptions, clusters: usize, rate: f64, seconds: u64) -> Outcome {
    let envoy = Envoy::start(options).unwrap_or_else(|e| panic!("{name}: {e}"));
    let urls: Vec<String> = (0..clusters)
        .map(|i| envoy.url(&format!("/c/{i}/")))
        .collect();
    let client = load::client();
    let rt = integration_tests::runtime();
    let timeout = Duration::from_secs(10);
    println!("{name}: warm-up 10 s");
    let warm_up = rt.block_on(load::open_loop_mixed(
        &client,
        &urls,
        rate,
        (rate * 10.0) as u64,
        timeout,
    ));
    let warm_up_answered: u64 = warm_up
        .iter()
        .map(|r| r.statuses.values().sum::<u64>())
        .sum();
    let mut result = LoadResult::new();
    let mut rss = vec![(0.0, rss_kib(envoy.pid()))];
    let started = Instant::now();
    let chunk = 5u64;
    for _ in 0..seconds.div_ceil(chunk) {
        let runs = rt.block_on(load::open_loop_mixed(
            &client,
            &urls,
            rate,
            (rate * chunk as f64) as u64,
            timeout,
        ));
        for r in &runs {
            result.merge(r);
        }
        rss.push((started.elapsed().as_secs_f64(), rss_kib(envoy.pid())));
        println!(
            "  {:.0} s: {} requests, {} errors, RSS {} KiB",
            started.elapsed().as_secs_f64(),
            result.sent,
            result.sent - result.ok(),
            rss.last().map_or(0, |r| r.1)
        );
    }
    // the filter's counters are pushed on its ticks
    if envoy.has_filter() {
        let answered = warm_up_answered + result.statuses.values().sum::<u64>();
        scenario::wait_for_filter_counters(&envoy, answered, &|line| println!("{line}"));
    }
    let stats = envoy.stats();
    let tracked = (0..clusters)
        .filter(|i| stats.contains_key(&format!("wasmcustom.adaptive_hedge.requests_total.c{i}")))
        .count();
    if std::env::var_os("SOAK_VERBOSE").is_some() {
        println!("  c0: {}", envoy.filter_stats("c0"));
        for (k, v) in &stats {
            if k.starts_with("wasmcustom.adaptive_hedge.") && !k.contains(".c") {
                println!("  {k} = {v}");
            }
        }
    }
    envoy.assert_no_vm_failure();
    Outcome {
        name: name.to_string(),
        result,
        rss,
        shared_bytes: stats
            .get("wasmcustom.adaptive_hedge.shared_data_bytes")
            .copied()
            .unwrap_or(0),
        tracked,
        untracked: stats
            .get("wasmcustom.adaptive_hedge.untracked_requests_total")
            .copied()
            .unwrap_or(0),
    }
}

fn main() {
    let env = |k: &str, d: f64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (seconds, rate, clusters) = (
        env("SOAK_SECONDS", 60.0) as u64,
        env("SOAK_RATE", 1500.0),
        env("SOAK_CLUSTERS", 200.0) as usize,
    );
    let sim = Simulator::start(vec![Latency::reference(); 3]).unwrap_or_else(|e| panic!("{e}"));
    let ports = sim.ports().to_vec();
    let limit = clusters / 2;
    let configs = [
        (
            "Envoy, no filter",
            EnvoyOptions::new("envoy-baseline.yaml", &ports),
        ),
        (
            "adaptive-hedge (defaults)",
            EnvoyOptions::new("envoy.yaml", &ports),
        ),
        (
            "adaptive-hedge, max_clusters = half",
            EnvoyOptions::new("envoy.yaml", &ports)
                .plugin_config(&format!(r#"{{"max_clusters": {limit}}}"#)),
        ),
    ];
    let mut outcomes = Vec::new();
    for (name, options) in configs {
        let options = many_clusters(options.concurrency(2), clusters, &ports);
        outcomes.push(run(name, options, clusters, rate, seconds));
    }
    println!(
        "\n## Soak: {seconds} s at {rate} req/s over {clusters} clusters (Envoy --concurrency 2)\n"
    );
    println!("| configuration | requests | errors (non-200 or failed) | p50 | p99 | p999 | Envoy RSS after warm-up → end | clusters tracked | shared data | per tracked cluster | untracked requests |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for o in &outcomes {
        let first = o.rss.first().map_or(0, |r| r.1);
        let last = o.rss.last().map_or(0, |r| r.1);
        let errors = o.result.sent - o.result.statuses.get(&200).copied().unwrap_or(0);
        let per = if o.tracked > 0 {
            format!("{} B", o.shared_bytes / o.tracked as i64)
        } else {
            "-".into()
        };
        println!(
            "| {} | {} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} → {:.1} MiB | {} | {} B | {per} | {} |",
            o.name,
            o.result.sent,
            errors,
            o.result.ms(0.5),
            o.result.ms(0.99),
            o.result.ms(0.999),
            first as f64 / 1024.0,
            last as f64 / 1024.0,
            o.tracked,
            o.shared_bytes,
            o.untracked
        );
    }
    let baseline_errors = outcomes.first().map_or(0, |o| {
        o.result.sent - o.result.statuses.get(&200).copied().unwrap_or(0)
    });
    let mut failed = false;
    for o in outcomes.iter().skip(1) {
        let errors = o.result.sent - o.result.statuses.get(&200).copied().unwrap_or(0);
        if errors > baseline_errors {
            println!(
                "FAIL: {}: {errors} errors, the baseline had {baseline_errors}",
                o.name
            );
            failed = true;
        }
        let first = o.rss.get(1).map_or(0, |r| r.1) as f64;
        let last = o.rss.last().map_or(0, |r| r.1) as f64;
        if last > first * 1.10 + 4096.0 {
            println!(
                "FAIL: {}: RSS grew from {first} to {last} KiB after warm-up",
                o.name
            );
            failed = true;
        }
    }
    if let Some(limited) = outcomes.get(2) {
        if limited.tracked > limit || limited.untracked == 0 {
            println!(
                "FAIL: max_clusters {limit}: {} tracked, {} untracked requests",
                limited.tracked, limited.untracked
            );
            failed = true;
        }
    }
    drop(sim);
    if failed {
        std::process::exit(1);
    }
    println!("\nno error beyond the baseline's; memory flat after warm-up; shared data bounded by max_clusters");
}

//! One measured run: simulated hosts, a proxy configuration, a warm-up, then a
//! workload whose latencies (client side) and upstream attempts (simulator
//! side) are reported. Used by the tail test, `make demo` and the benchmarks.

use std::time::Duration;

use crate::envoy::{Envoy, EnvoyOptions};
use crate::load::{self, LoadResult};
use crate::sim::{Latency, Simulator};

/// What sits between the load generator and the hosts.
#[derive(Clone, Debug)]
pub enum Proxy {
    /// Envoy without the filter (`envoy-baseline.yaml`).
    Baseline,
    /// Envoy's own hedging with a fixed per-try timeout (`envoy-static-hedge.yaml`).
    StaticHedge { delay_ms: u64 },
    /// Envoy with adaptive-hedge (`envoy.yaml`) and this plugin config.
    Adaptive { plugin_config: String },
}

impl Proxy {
    pub fn name(&self) -> String {
        match self {
            Proxy::Baseline => "Envoy, no hedging".into(),
            Proxy::StaticHedge { delay_ms } => format!("Envoy static hedge {delay_ms} ms"),
            Proxy::Adaptive { plugin_config } if plugin_config.trim() == "{}" => {
                "Envoy + adaptive-hedge (defaults)".into()
            }
            Proxy::Adaptive { plugin_config } => format!("Envoy + adaptive-hedge {plugin_config}"),
        }
    }

    fn options(&self, ports: &[u16]) -> EnvoyOptions {
        match self {
            Proxy::Baseline => EnvoyOptions::new("envoy-baseline.yaml", ports),
            Proxy::StaticHedge { delay_ms } => EnvoyOptions::new("envoy-static-hedge.yaml", ports)
                .edit(
                    "per_try_timeout: 0.010s",
                    &format!("per_try_timeout: {:.3}s", *delay_ms as f64 / 1000.0),
                ),
            Proxy::Adaptive { plugin_config } => {
                EnvoyOptions::new("envoy.yaml", ports).plugin_config(plugin_config)
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Workload {
    /// `callers` concurrent callers, `requests` in all.
    Closed { callers: u64, requests: u64 },
    /// `rate` requests per second, `requests` in all.
    Open { rate: f64, requests: u64 },
}

pub struct Report {
    pub name: String,
    pub latency: LoadResult,
    pub requests: u64,
    pub upstream_attempts: u64,
    /// Upstream attempts / client requests - 1 (counted by the simulator).
    pub extra_load: f64,
    pub hedges_sent: i64,
    /// The filter's learned delay for `backend`, in ms.
    pub learned_delay_ms: Option<f64>,
    /// Envoy's log shows no VM failure (checked, not assumed).
    pub envoy: Option<Envoy>,
}

/// Runs `workload` through `proxy` in front of hosts following `models`,
/// after `warmup` requests (20 callers) that are not measured.
pub fn run(
    proxy: &Proxy,
    models: &[Latency],
    warmup: u64,
    workload: Workload,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Report, String> {
    let sim = Simulator::start(models.to_vec()).map_err(|e| e.to_string())?;
    let mut ports = sim.ports().to_vec();
    while ports.len() < 4 {
        ports.push(ports[0]); // configs name four upstream hosts
    }
    let envoy = Envoy::start(proxy.options(&ports))?;
    let client = load::client();
    let rt = crate::runtime();
    let url = envoy.url("/");
    if warmup > 0 {
        progress(&format!("  warm-up: {warmup} requests"));
        let w = rt.block_on(load::closed_loop(
            &client,
            &url,
            20,
            warmup,
            Duration::from_secs(10),
        ));
        if w.ok() != warmup {
            return Err(format!("warm-up failed: {}", w.summary()));
        }
        std::thread::sleep(Duration::from_millis(600));
    }
    sim.settle(Duration::from_secs(5));
    sim.reset_counts();
    let hedges_before = hedge_count(proxy, &envoy);
    progress(&format!("  measuring: {workload:?}"));
    let (latency, requests) = with_progress(progress, || match workload {
        Workload::Closed { callers, requests } => (
            rt.block_on(load::closed_loop(
                &client,
                &url,
                callers,
                requests,
                Duration::from_secs(10),
            )),
            requests,
        ),
        Workload::Open { rate, requests } => (
            rt.block_on(load::open_loop(
                &client,
                &url,
                rate,
                requests,
                Duration::from_secs(10),
            )),
            requests,
        ),
    });
    std::thread::sleep(Duration::from_millis(600)); // one more tick flushes the filter's counters
    let counts = sim.settle(Duration::from_secs(5));
    let hedges_sent = hedge_count(proxy, &envoy) - hedges_before;
    let learned_delay_ms = match proxy {
        Proxy::Adaptive { .. } => {
            Some(envoy.filter_stat("hedge_delay_us", "backend") as f64 / 1000.0)
        }
        _ => None,
    };
    Ok(Report {
        name: proxy.name(),
        requests,
        upstream_attempts: counts.arrivals,
        extra_load: counts.arrivals as f64 / requests as f64 - 1.0,
        hedges_sent,
        learned_delay_ms,
        latency,
        envoy: Some(envoy),
    })
}

/// Extra attempts Envoy started: the filter's counter, or Envoy's retry
/// counter for its own hedging.
fn hedge_count(proxy: &Proxy, envoy: &Envoy) -> i64 {
    match proxy {
        Proxy::Baseline => 0,
        Proxy::StaticHedge { .. } => envoy.stat("cluster.backend.upstream_rq_retry"),
        Proxy::Adaptive { .. } => envoy.filter_stat("hedges_sent_total", "backend"),
    }
}

/// A markdown table of reports.
pub fn table<'a>(reports: impl IntoIterator<Item = &'a Report>) -> String {
    let mut out = String::from(
        "| configuration | p50 | p90 | p95 | p99 | p999 | extra load | hedges sent | learned delay |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        out.push_str(&format!(
            "| {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1}% | {} | {} |\n",
            r.name,
            r.latency.ms(0.5),
            r.latency.ms(0.9),
            r.latency.ms(0.95),
            r.latency.ms(0.99),
            r.latency.ms(0.999),
            r.extra_load * 100.0,
            r.hedges_sent,
            r.learned_delay_ms
                .map_or("-".into(), |d| format!("{d:.1} ms")),
        ));
    }
    out
}

/// Runs `f`, reporting how many requests have completed every 5 s meanwhile.
fn with_progress<T>(progress: &(dyn Fn(&str) + Sync), f: impl FnOnce() -> T) -> T {
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = AtomicBool::new(false);
    let start = load::COMPLETED.load(Ordering::Relaxed);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut ticks = 0u32;
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                ticks += 1;
                if ticks.is_multiple_of(50) {
                    let n = load::COMPLETED.load(Ordering::Relaxed) - start;
                    progress(&format!("    ... {n} requests done"));
                }
            }
        });
        let out = f();
        done.store(true, Ordering::Relaxed);
        out
    })
}

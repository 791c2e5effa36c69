//! One measured run: simulated hosts, a proxy configuration, a warm-up, then a
//! workload whose latencies (client side) and upstream attempts (simulator
//! side) are reported, with scheduled latency changes during the run and a
//! timeline of the learned delay and hedge rate. Used by the tail test,
//! `make demo` and `make bench`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::harness::envoy::{Envoy, EnvoyOptions};
use crate::harness::load::{self, LoadResult};
use crate::harness::sim::{Latency, Simulator, Stream};

/// What sits between the load generator and the hosts.
#[derive(Clone, Debug, PartialEq)]
pub enum Proxy {
    /// No Envoy: the load generator calls the hosts in turn.
    Direct,
    /// Envoy without the filter (`envoy-baseline.yaml`).
    Baseline,
    /// Envoy's own hedging with a fixed per-try timeout (`envoy-static-hedge.yaml`).
    StaticHedge { delay_ms: u64 },
    /// Envoy with adaptive-hedge (`envoy.yaml`) and this plugin config.
    Adaptive { plugin_config: String },
    /// Envoy with adaptive-hedge in first-byte mode, both roles
    /// (`envoy-streaming.yaml`); `plugin_config` is the downstream role's,
    /// `latency_signal` is set to `first_byte` over it.
    AdaptiveFirstByte { plugin_config: String },
}

/// The downstream plugin config `envoy-streaming.yaml` ships with.
const STREAMING_DOWNSTREAM: &str =
    r#"value: "{\"latency_signal\": \"first_byte\", \"host_choice\": false}""#;

impl Proxy {
    pub fn adaptive_defaults() -> Self {
        Proxy::Adaptive {
            plugin_config: "{}".into(),
        }
    }

    pub fn name(&self) -> String {
        match self {
            Proxy::Direct => "no Envoy (direct)".into(),
            Proxy::Baseline => "Envoy, no hedging".into(),
            Proxy::StaticHedge { delay_ms } => format!("Envoy static hedge {delay_ms} ms"),
            Proxy::Adaptive { plugin_config } if plugin_config.trim() == "{}" => {
                "Envoy + adaptive-hedge (defaults)".into()
            }
            Proxy::Adaptive { plugin_config } => format!("Envoy + adaptive-hedge {plugin_config}"),
            Proxy::AdaptiveFirstByte { plugin_config } if plugin_config.trim() == "{}" => {
                "Envoy + adaptive-hedge, first byte (defaults)".into()
            }
            Proxy::AdaptiveFirstByte { plugin_config } => {
                format!("Envoy + adaptive-hedge, first byte {plugin_config}")
            }
        }
    }

    fn options(&self, ports: &[u16]) -> Option<EnvoyOptions> {
        match self {
            Proxy::Direct => None,
            Proxy::Baseline => Some(EnvoyOptions::new("envoy-baseline.yaml", ports)),
            Proxy::StaticHedge { delay_ms } => {
                Some(EnvoyOptions::new("envoy-static-hedge.yaml", ports).edit(
                    "per_try_timeout: 0.010s",
                    &format!("per_try_timeout: {:.3}s", *delay_ms as f64 / 1000.0),
                ))
            }
            Proxy::Adaptive { plugin_config } => {
                Some(EnvoyOptions::new("envoy.yaml", ports).plugin_config(plugin_config))
            }
            Proxy::AdaptiveFirstByte { plugin_config } => {
                let mut json: serde_json::Value =
                    serde_json::from_str(plugin_config).unwrap_or_else(|_| serde_json::json!({}));
                json["latency_signal"] = "first_byte".into();
                let value = serde_json::to_string(&json.to_string()).unwrap_or_default();
                Some(
                    // its one cluster has three hosts
                    EnvoyOptions::new("envoy-streaming.yaml", ports.get(..3).unwrap_or(ports))
                        .edit(STREAMING_DOWNSTREAM, &format!("value: {value}")),
                )
            }
        }
    }

    /// Runs adaptive-hedge (either signal).
    pub fn is_adaptive(&self) -> bool {
        matches!(
            self,
            Proxy::Adaptive { .. } | Proxy::AdaptiveFirstByte { .. }
        )
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Workload {
    /// `callers` concurrent callers, `requests` in all.
    Closed { callers: u64, requests: u64 },
    /// `rate` requests per second, `requests` in all.
    Open { rate: f64, requests: u64 },
    /// `requests` front-end requests at `rate` per second, each calling the
    /// first target `fanout` times in parallel and waiting for all
    /// (`load::fan_out`).
    FanOut {
        fanout: u64,
        rate: f64,
        requests: u64,
    },
}

impl Workload {
    /// Warm-up arrivals per second for this workload: its own rate (500
    /// req/s before a closed loop). A faster burst makes a slow machine
    /// queue, the window (30 s, longer than most runs) keeps those samples,
    /// and the filter then starts the measurement with a delay learned from
    /// the box's overload, not from the hosts (CI once saw 137 ms against a
    /// 39 ms p90, and no hedge).
    pub fn warmup_rate(&self) -> f64 {
        match self {
            Workload::Open { rate, .. } => *rate,
            Workload::FanOut { fanout, rate, .. } => rate * *fanout as f64,
            Workload::Closed { .. } => 500.0,
        }
    }
}

/// A route of the Envoy configs and the simulated hosts behind it.
#[derive(Clone, Debug)]
pub struct Target {
    pub path: &'static str,
    /// The route's name in the configs (a named route learns its own delay).
    pub route: &'static str,
    pub cluster: &'static str,
    /// Indexes into the plan's hosts.
    pub hosts: Vec<usize>,
}

/// What to run: hosts (the configs' 8081..8084), the routes to load, and
/// latency changes at fractions of the measured run.
#[derive(Clone, Debug)]
pub struct Plan {
    pub hosts: Vec<Latency>,
    pub targets: Vec<Target>,
    /// (fraction of the run, host or None for every host, new model)
    pub changes: Vec<(f64, Option<usize>, Latency)>,
    pub warmup: u64,
    /// Warm-up arrivals per second (open loop).
    pub warmup_rate: f64,
    pub workload: Workload,
    /// Every response streams (SSE / LLM tokens): the hosts' model is then
    /// the time to first byte.
    pub stream: Option<Stream>,
}

impl Plan {
    /// Three hosts behind `backend` (route `/`), all following `model`,
    /// warmed up at `workload.warmup_rate()`.
    pub fn three_hosts(model: Latency, warmup: u64, workload: Workload) -> Plan {
        Plan {
            hosts: vec![model; 3],
            targets: vec![Target {
                path: "/",
                route: "default",
                cluster: "backend",
                hosts: vec![0, 1, 2],
            }],
            changes: Vec::new(),
            warmup,
            warmup_rate: workload.warmup_rate(),
            workload,
            stream: None,
        }
    }
}

/// The filter's (or Envoy's) view of `backend` every 500 ms.
#[derive(Clone, Copy, Debug, Default)]
pub struct TimelinePoint {
    pub t_s: f64,
    /// The learned delay (adaptive only), ms.
    pub delay_ms: f64,
    /// Extra attempts / requests over the last interval.
    pub hedge_rate: f64,
}

pub struct Report {
    pub name: String,
    /// Latency per target, in the plan's order.
    pub latency: Vec<LoadResult>,
    pub requests: u64,
    pub upstream_attempts: u64,
    /// Upstream attempts / client requests - 1 (counted by the simulator).
    pub extra_load: f64,
    pub hedges_sent: i64,
    /// Upstream attempts per simulated host (the plan's order).
    pub host_arrivals: Vec<u64>,
    /// The learned delay per target's cluster at the end, ms (adaptive only).
    pub learned_delay_ms: Vec<Option<f64>>,
    pub timeline: Vec<TimelinePoint>,
    pub envoy: Option<Envoy>,
}

impl Report {
    /// Latency of the first (or only) target.
    pub fn main(&self) -> &LoadResult {
        &self.latency[0]
    }
}

/// Runs `plan` through `proxy`.
pub fn run(proxy: &Proxy, plan: &Plan, progress: &(dyn Fn(&str) + Sync)) -> Result<Report, String> {
    let sim = Simulator::start(plan.hosts.clone()).map_err(|e| e.to_string())?;
    sim.set_stream(plan.stream);
    let mut ports = sim.ports().to_vec();
    while ports.len() < 4 {
        ports.push(ports[0]); // the configs name four upstream hosts
    }
    // a plan whose `/` reaches the fourth host: four hosts behind backend
    let four = plan
        .targets
        .iter()
        .any(|t| t.cluster == "backend" && t.hosts.contains(&3));
    let envoy = match proxy.options(&ports) {
        Some(options) if four => Some(Envoy::start(options.four_backend_hosts())?),
        Some(options) => Some(Envoy::start(options)?),
        None => None,
    };
    // one URL per (target, host) for Direct, one per target through Envoy
    let mut urls = Vec::new();
    let mut url_target = Vec::new();
    for (k, target) in plan.targets.iter().enumerate() {
        match &envoy {
            Some(e) => {
                urls.push(e.url(target.path));
                url_target.push(k);
            }
            None => {
                for &h in &target.hosts {
                    urls.push(format!("http://127.0.0.1:{}{}", ports[h], target.path));
                    url_target.push(k);
                }
            }
        }
    }
    let client = load::client();
    let rt = crate::runtime();
    if plan.warmup > 0 {
        progress(&format!("  warm-up: {} requests", plan.warmup));
        let w = rt.block_on(load::open_loop_mixed(
            &client,
            &urls,
            plan.warmup_rate,
            plan.warmup,
            Duration::from_secs(10),
        ));
        let ok: u64 = w.iter().map(LoadResult::ok).sum();
        if ok != plan.warmup {
            // Envoy's log goes with the error: Envoy is stopped (and its
            // directory removed) when this returns
            return Err(format!(
                "warm-up failed: {:?}; Envoy's log ends:\n{}",
                w.iter().map(LoadResult::summary).collect::<Vec<_>>(),
                envoy.as_ref().map_or_else(String::new, |e| e.log_tail(60))
            ));
        }
        if let (true, Some(envoy)) = (proxy.is_adaptive(), envoy.as_ref()) {
            if !warm_up_learned(envoy, plan.warmup) {
                progress("  the warm-up's samples were not all in the windows after 10 s");
            }
        }
    }
    sim.settle(Duration::from_secs(5));
    sim.reset_counts();
    // the warm-up's requests answered: the filter's counters must hold them
    // (pushed on its ticks) before the count the run is measured from
    let mut answered = plan.warmup;
    if let (true, Some(e)) = (proxy.is_adaptive(), envoy.as_ref()) {
        wait_for_filter_counters(e, answered, progress);
    }
    let hedges_before = envoy.as_ref().map_or(0, |e| hedge_count(proxy, e));
    progress(&format!("  measuring: {:?}", plan.workload));
    let duration = match plan.workload {
        Workload::Open { rate, requests } | Workload::FanOut { rate, requests, .. } => {
            Duration::from_secs_f64(requests as f64 / rate)
        }
        Workload::Closed { .. } => Duration::ZERO,
    };
    let done = AtomicBool::new(false);
    // set however the load ends (a panic too), so the threads watching it
    // stop and the scope can end
    struct SetOnDrop<'a>(&'a AtomicBool);
    impl Drop for SetOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let (results, timeline) = std::thread::scope(|scope| {
        // scheduled latency changes
        scope.spawn(|| {
            let start = Instant::now();
            let mut changes = plan.changes.clone();
            changes.sort_by(|a, b| a.0.total_cmp(&b.0));
            for (fraction, host, model) in changes {
                let due = start + duration.mul_f64(fraction);
                while Instant::now() < due {
                    if done.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                match host {
                    Some(h) => sim.set_model(h, model),
                    None => sim.set_all_models(model),
                }
            }
        });
        let timeline = scope.spawn(|| sample_timeline(proxy, envoy.as_ref(), &done, progress));
        let finished = SetOnDrop(&done);
        let results = match plan.workload {
            Workload::Closed { callers, requests } => {
                vec![rt.block_on(load::closed_loop(
                    &client,
                    &urls[0],
                    callers,
                    requests,
                    Duration::from_secs(10),
                ))]
            }
            Workload::Open { rate, requests } => rt.block_on(load::open_loop_mixed(
                &client,
                &urls,
                rate,
                requests,
                Duration::from_secs(10),
            )),
            Workload::FanOut {
                fanout,
                rate,
                requests,
            } => vec![rt.block_on(load::fan_out(
                &client,
                &urls[0],
                fanout,
                rate,
                requests,
                Duration::from_secs(10),
            ))],
        };
        drop(finished);
        (results, timeline.join().unwrap_or_default())
    });
    // the filter counts each of a fan-out's calls
    let calls_per_request = match plan.workload {
        Workload::FanOut { fanout, .. } => fanout,
        _ => 1,
    };
    answered += calls_per_request
        * results
            .iter()
            .map(|r| r.statuses.values().sum::<u64>())
            .sum::<u64>();
    if let (true, Some(e)) = (proxy.is_adaptive(), envoy.as_ref()) {
        wait_for_filter_counters(e, answered, progress);
    }
    let counts = sim.settle(Duration::from_secs(5));
    // per target: merge the URLs that belong to it
    let mut latency: Vec<LoadResult> = plan.targets.iter().map(|_| LoadResult::new()).collect();
    for (r, &k) in results.iter().zip(url_target.iter()) {
        if let Some(l) = latency.get_mut(k) {
            l.merge(r);
        }
    }
    let requests: u64 = latency.iter().map(|l| l.sent).sum();
    // what the hosts were asked for: every leaf of a fan-out
    let leaves = match plan.workload {
        Workload::FanOut { fanout, .. } => requests * fanout,
        _ => requests,
    };
    let hedges_sent = envoy
        .as_ref()
        .map_or(0, |e| hedge_count(proxy, e) - hedges_before);
    let learned_delay_ms = plan
        .targets
        .iter()
        .map(|t| match (proxy.is_adaptive(), &envoy) {
            // the route's own delay once it has one, else the cluster's
            (true, Some(e)) => e
                .filter_stat(
                    "route_hedge_delay_microseconds",
                    &format!("{}.route.{}", t.cluster, t.route),
                )
                .filter(|us| *us > 0)
                .or_else(|| e.filter_stat("hedge_delay_microseconds", t.cluster))
                .map(|us| us as f64 / 1000.0),
            _ => None,
        })
        .collect();
    Ok(Report {
        name: proxy.name(),
        requests,
        upstream_attempts: counts.arrivals,
        extra_load: counts.arrivals as f64 / leaves.max(1) as f64 - 1.0,
        hedges_sent,
        host_arrivals: sim.counts().iter().map(|c| c.arrivals).collect(),
        learned_delay_ms,
        timeline,
        latency,
        envoy,
    })
}

/// Every 500 ms: the learned delay and the hedge rate of `backend`; every
/// 5 s a progress line.
fn sample_timeline(
    proxy: &Proxy,
    envoy: Option<&Envoy>,
    done: &AtomicBool,
    progress: &(dyn Fn(&str) + Sync),
) -> Vec<TimelinePoint> {
    let start = Instant::now();
    let first = load::COMPLETED.load(Ordering::Relaxed);
    let mut points = Vec::new();
    let mut last: Option<(i64, i64)> = None;
    let mut ticks = 0u32;
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(500));
        ticks += 1;
        if ticks.is_multiple_of(10) {
            progress(&format!(
                "    ... {} requests done",
                load::COMPLETED.load(Ordering::Relaxed) - first
            ));
        }
        let Some(envoy) = envoy else { continue };
        let stats = envoy.stats();
        let get = |k: &str| stats.get(k).copied().unwrap_or(0);
        let (extra, requests) = match proxy {
            Proxy::Adaptive { .. } | Proxy::AdaptiveFirstByte { .. } => (
                get("wasmcustom.adaptive_hedge.hedges_sent_total.backend"),
                get("wasmcustom.adaptive_hedge.requests_total.backend"),
            ),
            _ => {
                let retries = get("cluster.backend.upstream_rq_retry");
                (retries, get("cluster.backend.upstream_rq_total") - retries)
            }
        };
        let hedge_rate = match last {
            Some((e0, r0)) if requests > r0 => (extra - e0) as f64 / (requests - r0) as f64,
            _ => 0.0,
        };
        last = Some((extra, requests));
        points.push(TimelinePoint {
            t_s: start.elapsed().as_secs_f64(),
            delay_ms: get("wasmcustom.adaptive_hedge.hedge_delay_microseconds.backend") as f64
                / 1000.0,
            hedge_rate,
        });
    }
    points
}

/// Waits (at most 10 s) until the filter's ticks have counted the warm-up's
/// requests and merged their samples into every cluster's window (all
/// workers). False if they have not by then, e.g. under a window shorter than
/// the warm-up.
fn warm_up_learned(envoy: &Envoy, warmup: u64) -> bool {
    const REQUESTS: &str = "wasmcustom.adaptive_hedge.requests_total.";
    const SAMPLES: &str = "wasmcustom.adaptive_hedge.window_samples.";
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = envoy.stats();
        let unconfirmed = stats
            .get("wasmcustom.adaptive_hedge.unconfirmed_requests_total")
            .copied()
            .unwrap_or(0);
        let clusters: Vec<(&str, i64)> = stats
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(REQUESTS)?, *v)))
            .collect();
        let counted: i64 = clusters.iter().map(|(_, v)| v).sum::<i64>() + unconfirmed;
        let merged = clusters.iter().all(|(cluster, requests)| {
            let samples = stats.get(&format!("{SAMPLES}{cluster}")).copied();
            samples.unwrap_or(0) >= requests * 9 / 10
        });
        if counted >= (warmup * 9 / 10) as i64 && merged {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (at most 5 s) until the filter's counters, pushed on its workers'
/// ticks, hold the `answered` requests and every armed request settled
/// (hedges sent or refunded): until then `hedges_sent_total` misses the
/// last tick's. Reported, not fatal: a run is still worth its table.
pub fn wait_for_filter_counters(envoy: &Envoy, answered: u64, progress: &(dyn Fn(&str) + Sync)) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = envoy.stats();
        let all = |metric: &str| -> i64 {
            let prefix = format!("wasmcustom.adaptive_hedge.{metric}");
            stats
                .iter()
                .filter(|(k, _)| k.starts_with(&prefix))
                .map(|(_, v)| *v)
                .sum()
        };
        let counted = all("requests_total.")
            + all("unconfirmed_requests_total")
            + all("untracked_requests_total");
        let settled = all("hedges_sent_total.") + all("hedges_refunded_total.");
        if counted >= answered as i64 && settled >= all("hedges_armed_total.") {
            return;
        }
        if Instant::now() > deadline {
            progress(&format!(
                "  the filter's counters still lag after 5 s: {counted} of {answered} requests, {settled} armed settled of {}",
                all("hedges_armed_total.")
            ));
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Extra attempts Envoy started: the filter's counter, or Envoy's retry
/// counter for its own hedging.
fn hedge_count(proxy: &Proxy, envoy: &Envoy) -> i64 {
    let all = |metric: &str| -> i64 {
        envoy
            .stats()
            .iter()
            .filter(|(k, _)| k.starts_with(metric))
            .map(|(_, v)| *v)
            .sum()
    };
    match proxy {
        Proxy::Direct | Proxy::Baseline => 0,
        Proxy::StaticHedge { .. } => {
            envoy.stat("cluster.backend.upstream_rq_retry").unwrap_or(0)
                + envoy
                    .stat("cluster.backend-b.upstream_rq_retry")
                    .unwrap_or(0)
        }
        Proxy::Adaptive { .. } | Proxy::AdaptiveFirstByte { .. } => {
            all("wasmcustom.adaptive_hedge.hedges_sent_total.")
        }
    }
}

/// A markdown table of reports (their first target).
pub fn table<'a>(reports: impl IntoIterator<Item = &'a Report>) -> String {
    target_table(reports, 0)
}

/// A latency column of a table: its heading and its value (ms).
type Column = (&'static str, fn(&LoadResult) -> f64);

/// A markdown table of reports, for target `k` of their plan.
pub fn target_table<'a>(reports: impl IntoIterator<Item = &'a Report>, k: usize) -> String {
    latency_table(reports, k, &LATENCY_COLUMNS)
}

/// A markdown table of streaming runs: time to first byte and to the end of
/// the stream, for target `k`.
pub fn streaming_table<'a>(reports: impl IntoIterator<Item = &'a Report>, k: usize) -> String {
    latency_table(
        reports,
        k,
        &[
            ("first byte p50", |l| l.first_byte_ms(0.5)),
            ("p90", |l| l.first_byte_ms(0.9)),
            ("p99", |l| l.first_byte_ms(0.99)),
            ("p999", |l| l.first_byte_ms(0.999)),
            ("whole stream p50", |l| l.ms(0.5)),
            ("p90", |l| l.ms(0.9)),
            ("p99", |l| l.ms(0.99)),
            ("p999", |l| l.ms(0.999)),
        ],
    )
}

/// The latency columns of the plain tables.
const LATENCY_COLUMNS: [Column; 5] = [
    ("p50", |l| l.ms(0.5)),
    ("p90", |l| l.ms(0.9)),
    ("p95", |l| l.ms(0.95)),
    ("p99", |l| l.ms(0.99)),
    ("p999", |l| l.ms(0.999)),
];

/// Configuration, the latency `columns`, extra load, hedges sent, learned delay.
fn latency_table<'a>(
    reports: impl IntoIterator<Item = &'a Report>,
    k: usize,
    columns: &[Column],
) -> String {
    let rows = reports
        .into_iter()
        .filter_map(|r| Some((r.name.clone(), row(r, k, columns)?)));
    format_table(columns, rows)
}

/// The values of a row: each latency column (ms), extra load (a fraction),
/// hedges sent, learned delay (ms, if any); `None` without target `k`.
fn row(r: &Report, k: usize, columns: &[Column]) -> Option<Vec<Option<f64>>> {
    let l = r.latency.get(k)?;
    Some(
        columns
            .iter()
            .map(|(_, value)| Some(value(l)))
            .chain([
                Some(r.extra_load),
                Some(r.hedges_sent as f64),
                r.learned_delay_ms.get(k).copied().flatten(),
            ])
            .collect(),
    )
}

fn format_table(
    columns: &[Column],
    rows: impl Iterator<Item = (String, Vec<Option<f64>>)>,
) -> String {
    let headings: Vec<&str> = std::iter::once("configuration")
        .chain(columns.iter().map(|(h, _)| *h))
        .chain(["extra load", "hedges sent", "learned delay"])
        .collect();
    let mut out = format!(
        "| {} |\n|{}\n",
        headings.join(" | "),
        "---|".repeat(headings.len())
    );
    for (name, values) in rows {
        let n = columns.len();
        let cells: Vec<String> = std::iter::once(name)
            .chain(values.iter().enumerate().map(|(i, v)| match (i, v) {
                (_, None) => "-".into(),
                (i, Some(v)) if i < n => format!("{v:.1} ms"),
                (i, Some(v)) if i == n => format!("{:.1}%", v * 100.0),
                (i, Some(v)) if i == n + 1 => format!("{v:.0}"),
                (_, Some(v)) => format!("{v:.1} ms"),
            }))
            .collect();
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    out
}

/// The plain table of several runs of the same configurations, each cell
/// the median of its runs (`runs[i][j]`: run `i`, configuration `j`).
pub fn median_table(runs: &[Vec<Report>]) -> String {
    let configurations = runs.first().map_or(0, Vec::len);
    let rows = (0..configurations).filter_map(|j| {
        let name = runs.first()?.get(j)?.name.clone();
        let values: Vec<Vec<Option<f64>>> = runs
            .iter()
            .filter_map(|run| row(run.get(j)?, 0, &LATENCY_COLUMNS))
            .collect();
        let width = values.first()?.len();
        let medians = (0..width)
            .map(|c| {
                let mut column: Vec<f64> = values
                    .iter()
                    .filter_map(|v| v.get(c).copied().flatten())
                    .collect();
                column.sort_by(f64::total_cmp);
                column.get(column.len() / 2).copied()
            })
            .collect();
        Some((name, medians))
    });
    format_table(&LATENCY_COLUMNS, rows)
}

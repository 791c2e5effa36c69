//! `make demo`: the reference workload through Envoy without hedging, with
//! Envoy's own hedging at two fixed delays, and with adaptive-hedge, on
//! loopback, with a table at the end. `DEMO_RUNS=3` runs the set three times
//! and adds a table of the medians. Every process it starts is stopped when
//! it ends, also on Ctrl-C.

use integration_tests::harness::sim::Latency;
use integration_tests::tools::scenario::{self, Plan, Proxy, Workload};
use integration_tests::tools::workloads;

fn main() {
    // Ctrl-C: Envoy children get the same SIGINT from the terminal; exiting
    // here runs no destructors, so stop them explicitly via the handler.
    let _ = ctrlc_stop();
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<f64>().ok());
    let requests = env("DEMO_REQUESTS").map_or(10_000, |v| v as u64);
    // Open loop at a modest rate by default: on a 2-core box, 20 closed-loop
    // callers saturate the CPUs that the client, Envoy and the hosts share,
    // and the numbers then measure queueing more than the backend's tail.
    // DEMO_CALLERS=20 runs the closed-loop form of the reference workload.
    let workload = match env("DEMO_CALLERS") {
        Some(callers) => Workload::Closed {
            callers: callers as u64,
            requests,
        },
        None => Workload::Open {
            rate: env("DEMO_RATE").unwrap_or(500.0),
            requests,
        },
    };
    let warmup = 2_000;
    if std::env::var("DEMO").as_deref() == Ok("fanout") {
        fan_out_demo(warmup);
        return;
    }
    println!("adaptive-hedge demo");
    println!("  3 simulated hosts on 127.0.0.1: lognormal latency (mean 5 ms, sd 2 ms), 5% stragglers at 10x");
    println!("  workload: {workload:?}, after {warmup} warm-up requests");
    println!(
        "  Envoy {} with --concurrency 2\n",
        integration_tests::harness::envoy::envoy_binary().display()
    );
    let progress = |s: &str| println!("{s}");
    let runs = env("DEMO_RUNS").map_or(1, |v| v.max(1.0) as usize);
    let plan = Plan::three_hosts(Latency::reference(), warmup, workload);
    let configurations = [
        Proxy::Baseline,
        Proxy::StaticHedge { delay_ms: 10 },
        Proxy::StaticHedge { delay_ms: 30 },
        Proxy::adaptive_defaults(),
    ];
    let mut all = Vec::new();
    for run in 1..=runs {
        let mut reports = Vec::new();
        for (step, proxy) in configurations.iter().enumerate() {
            println!(
                "[run {run}/{runs}, {}/{}] {}",
                step + 1,
                configurations.len(),
                proxy.name()
            );
            match scenario::run(proxy, &plan, &progress) {
                Ok(mut report) => {
                    if let Some(envoy) = report.envoy.take() {
                        envoy.assert_no_vm_failure();
                        if std::env::var_os("DEMO_VERBOSE").is_some() {
                            println!("  {}", envoy.filter_stats("backend"));
                            for stat in ["upstream_rq_retry", "upstream_rq_retry_overflow"] {
                                let name = format!("cluster.backend.{stat}");
                                println!("  {name}: {:?}", envoy.stat(&name));
                            }
                        }
                    }
                    println!("  {}", report.main().summary());
                    reports.push(report);
                }
                Err(e) => {
                    eprintln!("demo failed: {e}");
                    std::process::exit(1);
                }
            }
        }
        println!("\nrun {run}:\n{}", scenario::table(&reports));
        if let (Some(base), Some(adaptive)) = (reports.first(), reports.last()) {
            println!(
                "p99 {:.1} ms -> {:.1} ms ({:.1}x lower) for {:.1}% extra upstream load",
                base.main().ms(0.99),
                adaptive.main().ms(0.99),
                base.main().ms(0.99) / adaptive.main().ms(0.99),
                adaptive.extra_load * 100.0
            );
        }
        all.push(reports);
    }
    if runs > 1 {
        println!(
            "\nmedian of {runs} runs, each cell on its own:\n{}",
            scenario::median_table(&all)
        );
    }
}

/// `DEMO=fanout`: a front end that calls N backends in parallel and answers
/// when all have (straggler amplification: with 5% stragglers, one call in
/// 10 leaves meets one 40% of the time, one in 100 almost always), for N =
/// 1, 10, 50, 100 (`DEMO_FANOUT=1,10` to choose), without hedging, with
/// fixed delays of 5, 10 and 20 ms and with the filter, at the same rate of
/// backend calls (`DEMO_RATE`, default 500/s). `DEMO_RUNS=3` runs every N's
/// configurations three times, interleaved, and reports each cell's median.
/// The last column is the filter's p99 over the frontier at its extra
/// load (no hedging and the fixed delays, linear between their points:
/// `workloads::frontier_at`, as in `make bench`).
/// Prints a table; writes `$DEMO_OUT/fanout.json` (default `results-demo`)
/// for the chart.
fn fan_out_demo(warmup: u64) {
    let env = |name: &str| std::env::var(name).ok();
    let leaf_rate: f64 = env("DEMO_RATE")
        .and_then(|v| v.parse().ok())
        .unwrap_or(500.0);
    let fanouts: Vec<u64> = env("DEMO_FANOUT")
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 10, 50, 100]);
    let runs = env("DEMO_RUNS")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    let out = std::path::PathBuf::from(env("DEMO_OUT").unwrap_or_else(|| "results-demo".into()));
    println!("adaptive-hedge fan-out demo");
    println!("  3 simulated hosts on 127.0.0.1: lognormal latency (mean 5 ms, sd 2 ms), 5% stragglers at 10x");
    println!("  a front end calls N backends in parallel through Envoy and waits for all; {leaf_rate} backend calls/s; {runs} run(s)\n");
    let configurations = [
        Proxy::Baseline,
        Proxy::StaticHedge { delay_ms: 5 },
        Proxy::StaticHedge { delay_ms: 10 },
        Proxy::StaticHedge { delay_ms: 20 },
        Proxy::adaptive_defaults(),
    ];
    let mut rows = Vec::new();
    let mut table = String::from(
        "| N | P(a straggler) | configuration | p50 | p90 | p99 | extra load | p99 / frontier |\n|---|---|---|---|---|---|---|---|\n",
    );
    for &fanout in &fanouts {
        // enough front-end requests for a p99 at every N, in about 20-40 s
        let requests = if fanout >= 50 { 200 } else { 1000 };
        let workload = Workload::FanOut {
            fanout: fanout.max(1),
            rate: leaf_rate / fanout.max(1) as f64,
            requests,
        };
        let plan = Plan::three_hosts(Latency::reference(), warmup, workload);
        let meets = 1.0 - 0.95f64.powi(fanout as i32);
        // cells[configuration][run]: p50, p90, p99 (ms), extra load
        let mut cells: Vec<Vec<[f64; 4]>> = vec![Vec::new(); configurations.len()];
        for run in 1..=runs {
            for (proxy, cell) in configurations.iter().zip(cells.iter_mut()) {
                println!(
                    "[N = {fanout}, run {run}/{runs}] {}: {requests} front-end requests",
                    proxy.name()
                );
                let report = match scenario::run(proxy, &plan, &|s: &str| println!("{s}")) {
                    Ok(report) => report,
                    Err(e) => {
                        eprintln!("demo failed: {e}");
                        std::process::exit(1);
                    }
                };
                if let Some(envoy) = &report.envoy {
                    envoy.assert_no_vm_failure();
                    if std::env::var_os("DEMO_VERBOSE").is_some() {
                        println!("  {}", envoy.filter_stats("backend"));
                    }
                }
                let l = report.main();
                println!(
                    "  {}; extra load {:.1}%",
                    l.summary(),
                    report.extra_load * 100.0
                );
                cell.push([l.ms(0.5), l.ms(0.9), l.ms(0.99), report.extra_load]);
            }
        }
        let medians: Vec<[f64; 4]> = cells.iter().map(|c| median_cells(c)).collect();
        // the fixed delays' points, no hedging at zero extra load
        let fixed: Vec<(f64, f64)> = configurations
            .iter()
            .zip(&medians)
            .filter(|(proxy, _)| !proxy.is_adaptive())
            .map(|(_, m)| (m[3], m[2]))
            .collect();
        for (proxy, m) in configurations.iter().zip(&medians) {
            let ratio = proxy
                .is_adaptive()
                .then(|| m[2] / workloads::frontier_at(&fixed, m[3]));
            table.push_str(&format!(
                "| {fanout} | {:.0}% | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1}% | {} |\n",
                meets * 100.0,
                proxy.name(),
                m[0],
                m[1],
                m[2],
                m[3] * 100.0,
                ratio.map_or("-".into(), |r| format!("{r:.2}"))
            ));
            rows.push(serde_json::json!({
                "fanout": fanout,
                "configuration": proxy.name(),
                "p50_ms": m[0],
                "p90_ms": m[1],
                "p99_ms": m[2],
                "extra_load": m[3],
                "runs": runs,
            }));
        }
    }
    let what = if runs > 1 {
        format!("each cell the median of {runs} runs")
    } else {
        "one run".into()
    };
    println!("\nfan-out: latency of the front end (all N answers), and the backends' extra load; {what}\n{table}");
    let json = serde_json::json!({ "leaf_rate": leaf_rate, "runs": runs, "rows": rows });
    if std::fs::create_dir_all(&out).is_ok()
        && std::fs::write(out.join("fanout.json"), json.to_string()).is_ok()
    {
        println!("wrote {}", out.join("fanout.json").display());
    }
}

/// Each measure's median over the runs, on its own (the upper of the two
/// middle values when the count is even).
fn median_cells(runs: &[[f64; 4]]) -> [f64; 4] {
    let mut out = [f64::NAN; 4];
    for (k, slot) in out.iter_mut().enumerate() {
        let mut column: Vec<f64> = runs.iter().map(|r| r[k]).collect();
        column.sort_by(f64::total_cmp);
        if let Some(m) = column.get(column.len() / 2) {
            *slot = *m;
        }
    }
    out
}

/// On SIGINT/SIGTERM, kill our process group's Envoy children and exit.
fn ctrlc_stop() -> std::io::Result<()> {
    std::thread::spawn(|| {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(_) => return,
        };
        rt.block_on(async {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => return,
                };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            eprintln!("\ninterrupted: stopping Envoy and the simulated hosts");
            integration_tests::harness::envoy::kill_all();
            std::process::exit(130);
        });
    });
    Ok(())
}

//! The filter's cost in instructions: Envoy (1 worker) under valgrind's
//! callgrind, which counts the instructions it executes. Unlike CPU time on
//! a shared VM, the count is repeatable, so differences of a few percent
//! between configurations are real.
//!
//! Per configuration: warm up, zero the counters, send `requests` at a low
//! rate, dump; zero, send half as many at half the rate (as long), dump;
//! per request = the difference over the requests' difference, so the
//! timer work of a busy cluster (ticks, stats flushes), in both, is not
//! charged to requests; three such pairs, the median's figures; then,
//! the cluster quiet, an idle period as long.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::envoy::{envoy_executable, Envoy, EnvoyOptions, Launcher};
use crate::harness::load;
use crate::harness::sim::{Latency, Simulator};
use crate::harness::RemoveOnDrop;

/// Instructions per request; per second of a busy cluster's background
/// (its ticks, stats) beside the requests; per idle second.
#[derive(Clone, Copy, Debug)]
pub struct Count {
    pub per_request: f64,
    pub busy_per_second: f64,
    pub idle_per_second: f64,
}

pub fn available() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn control(pid: u32, what: &str) -> Result<(), String> {
    let out = Command::new("callgrind_control")
        .args([what, &pid.to_string()])
        .output()
        .map_err(|e| format!("callgrind_control: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("callgrind_control {what} failed"))
    }
}

/// The `totals:` of the dump file `path`, waiting for it to appear.
fn totals(path: &Path) -> Result<f64, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Some(n) = text
                .lines()
                .find_map(|l| l.strip_prefix("totals:"))
                .and_then(|n| n.trim().parse::<f64>().ok())
            {
                return Ok(n);
            }
        }
        if Instant::now() > deadline {
            return Err(format!("no callgrind totals in {}", path.display()));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Counts one configuration (each of its upstream ports replaced by an
/// instant host of its own: the backend cluster's three hosts are three,
/// so the filter chooses among them as it would in a real cluster).
pub fn count(options: EnvoyOptions, requests: u64, rate: f64) -> Result<Count, String> {
    let hosts = options.upstream_ports.len().max(1);
    let sim = Simulator::start(vec![Latency::fixed_ms(0); hosts]).map_err(|e| e.to_string())?;
    let dir = std::env::temp_dir().join(format!(
        "adaptive-hedge-callgrind-{}-{}",
        std::process::id(),
        crate::harness::envoy::free_port()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    // removed on every return, a failed run's included
    let _dir = RemoveOnDrop(dir.clone());
    let out = dir.join("callgrind.out");
    let mut options = options
        .concurrency(1)
        .ready_timeout(Duration::from_secs(180));
    options.upstream_ports = sim.ports().to_vec();
    let envoy = Envoy::start(options.launcher(Launcher {
        program: "valgrind".into(),
        args: vec![
            "--tool=callgrind".into(),
            "--smc-check=all-non-file".into(), // V8 writes the wasm code it runs
            format!("--callgrind-out-file={}", out.display()),
            envoy_executable().display().to_string(),
        ],
        env: Vec::new(),
    }))?;
    let rt = crate::runtime();
    let client = load::client();
    let url = envoy.url("/");
    let timeout = Duration::from_secs(30);
    // Under valgrind the first requests wait seconds (V8 compiles the
    // module under the instrumentation) and some fail: warm up until a
    // round of 300 passes whole, at most three rounds.
    let mut warm = rt.block_on(load::open_loop(&client, &url, rate, 300, timeout));
    for _ in 1..3 {
        if warm.ok() == 300 {
            break;
        }
        warm = rt.block_on(load::open_loop(&client, &url, rate, 300, timeout));
    }
    if warm.ok() < 300 {
        return Err(format!("warm-up failed (3 rounds): {}", warm.summary()));
    }
    std::thread::sleep(Duration::from_secs(1));
    let pid = envoy.pid();
    // Two loads of one length, the second at half the rate, and their
    // difference per request: the ticks of a busy cluster are in both.
    // Until 2026-11-29 the load less an idle period was taken; since a
    // quiet cluster's ticks cost less than a busy one's (design.md,
    // "Quiet clusters are read in turn"), that put the busy ticks (22k a
    // request at 50 a second) on the requests.
    // (instructions, seconds) of each load, in `PAIRS` pairs; the pair
    // whose per-request figure is the median is taken: a one-off in one
    // load (V8 compiling a hot function again, a collection) moved a
    // single pair's figure by up to 15% between runs
    let mut dumps = 0;
    let mut pairs = Vec::new();
    for _ in 0..PAIRS {
        let mut pair = Vec::new();
        for (n, r) in [(requests, rate), (requests / 2, rate / 2.0)] {
            control(pid, "-z")?;
            let started = Instant::now();
            let run = rt.block_on(load::open_loop(&client, &url, r, n, timeout));
            let took = started.elapsed();
            control(pid, "-d")?;
            dumps += 1;
            if run.ok() < n {
                return Err(format!("load failed: {}", run.summary()));
            }
            pair.push((totals(&dir.join(format!("callgrind.out.{dumps}")))?, took));
        }
        if let [(full, busy), (half, _)] = pair.as_slice() {
            let per_request = (full - half) / (requests - requests / 2).max(1) as f64;
            pairs.push((per_request, *full, *busy));
        }
    }
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let Some(&(per_request, full, busy)) = pairs.get(pairs.len() / 2) else {
        return Err("no counts".into());
    };
    // then as long without requests, once the cluster is quiet (a slice,
    // 5 s, after its last request: design.md, "Quiet clusters are read in
    // turn")
    std::thread::sleep(Duration::from_secs(6));
    control(pid, "-z")?;
    std::thread::sleep(busy);
    control(pid, "-d")?;
    let idle = totals(&dir.join(format!("callgrind.out.{}", dumps + 1)))?;
    drop(envoy);
    Ok(Count {
        per_request,
        busy_per_second: (full - per_request * requests as f64) / busy.as_secs_f64(),
        idle_per_second: idle / busy.as_secs_f64(),
    })
}

/// Pairs of loads (full rate, half rate) per configuration; the median
/// pair's figures are taken.
const PAIRS: usize = 3;

/// The committed instruction counts `make bench` holds the filter to
/// (relative to the repository root).
pub const BASELINE_FILE: &str = "bench/instructions-baseline.json";
/// How much more than its baseline a row's own instructions may be.
pub const SLACK: f64 = 0.10;

/// One measured row against its baseline.
#[derive(Clone, Debug, PartialEq)]
pub struct Checked {
    pub name: String,
    pub measured: f64,
    pub allowed: f64,
    pub regressed: bool,
}

impl Checked {
    /// The change against the baseline, as a fraction (+0.05 is 5% more).
    pub fn change(&self) -> f64 {
        self.measured / self.allowed - 1.0
    }
}

/// The rows of `own` (name, the filter's own instructions per request) that
/// `baseline` (the JSON of `BASELINE_FILE`) names, each checked against
/// `SLACK`; rows it does not name are not checked.
pub fn check_against_baseline(own: &[(&str, f64)], baseline: &serde_json::Value) -> Vec<Checked> {
    own.iter()
        .filter_map(|(name, measured)| {
            let allowed = baseline["own_instructions_per_request"][*name].as_f64()?;
            Some(Checked {
                name: (*name).to_string(),
                measured: *measured,
                allowed,
                regressed: *measured > allowed * (1.0 + SLACK),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_more_than_ten_percent_above_its_baseline_regressed() {
        let baseline =
            serde_json::json!({"own_instructions_per_request": {"a": 100_000.0, "b": 50_000.0}});
        let checked = check_against_baseline(
            &[("a", 109_000.0), ("b", 56_000.0), ("not named", 1e9)],
            &baseline,
        );
        let verdicts: Vec<(&str, bool)> = checked
            .iter()
            .map(|c| (c.name.as_str(), c.regressed))
            .collect();
        assert_eq!(verdicts, [("a", false), ("b", true)]);
        assert!((checked[1].change() - 0.12).abs() < 1e-9);
    }

    /// The committed file parses, and names the rows the bench measures
    /// with a figure each.
    #[test]
    fn the_committed_baseline_names_its_rows() {
        let path = crate::harness::envoy::repo_root().join(BASELINE_FILE);
        let text = std::fs::read_to_string(&path).unwrap();
        let baseline: serde_json::Value = serde_json::from_str(&text).unwrap();
        let rows = baseline["own_instructions_per_request"]
            .as_object()
            .unwrap();
        for name in [
            "adaptive-hedge",
            "adaptive-hedge, not arming (`disabled: true`)",
            "adaptive-hedge in first-byte mode (both roles)",
        ] {
            assert!(rows[name].as_f64().is_some_and(|n| n > 0.0), "{name}");
        }
    }
}

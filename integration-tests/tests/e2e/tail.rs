//! The point of the filter: stragglers are answered by hedges. The reference
//! workload's shape (docs/reference-workload.md) at a modest rate, without
//! and with adaptive-hedge at zero configuration.

use integration_tests::harness::sim::Latency;
use integration_tests::tools::scenario::{self, Plan, Proxy, Report, Workload};

/// The filter beats the stragglers: of the requests whose answer came from
/// a straggler attempt (the simulator marks them), at most half as many
/// remain with the filter as without. This counts what hedging does, not
/// what it does to p99: this VM's CPU is sometimes slowed from outside for
/// seconds at a time, which inflates every latency and can hide the tail cut
/// in the percentiles (the p99 is `make demo`'s and `make bench`'s to
/// report). One run decides: measured here 5.5% -> 0.3% (a ratio of 0.05),
/// and 4.9% -> 0.4% (0.08) with six busy-looping processes beside it, so
/// the bound of 0.5 leaves a margin of six times.
#[test]
fn stragglers_are_beaten_by_hedges() {
    // The reference body (lognormal 5/2 ms, 5% stragglers), but stragglers
    // 40x instead of 10x. A slowed CI machine inflated the body's p90 from
    // ~10 ms to 31-43 ms, and the delay learned from it (46 ms) then sat on
    // top of the reference's 50 ms stragglers, so a hedge could not beat
    // them. 200 ms stragglers stay stragglers on such a box; the reference
    // workload's own numbers are `make demo`'s and `make bench`'s.
    let stragglers_far_out = Latency::LogNormal {
        mean_ms: 5.0,
        sd_ms: 2.0,
        straggler_prob: 0.05,
        straggler_mult: 40.0,
    };
    // 500 req/s open loop, 12 s per configuration: below saturation, yet busy
    // enough that the VM's idle CPUs do not add wake-up latency (the warm-up
    // runs at the same rate: see `Workload::warmup_rate`)
    let plan = Plan::three_hosts(
        stragglers_far_out,
        1_000,
        Workload::Open {
            rate: 500.0,
            requests: 6_000,
        },
    );
    let quiet = |_: &str| {};
    let base = scenario::run(&Proxy::Baseline, &plan, &quiet).unwrap();
    let hedged = scenario::run(&Proxy::adaptive_defaults(), &plan, &quiet).unwrap();
    println!("{}", scenario::table([&base, &hedged]));
    assert_eq!(base.main().ok(), 6_000, "{}", base.main().summary());
    assert_eq!(hedged.main().ok(), 6_000, "{}", hedged.main().summary());
    assert!(
        hedged.extra_load <= 0.12,
        "extra load {:.1}%",
        hedged.extra_load * 100.0
    );
    assert!(hedged.hedges_sent > 0);
    assert!(base.extra_load.abs() < 0.001, "the baseline hedges nothing");
    if let Some(envoy) = &hedged.envoy {
        envoy.assert_no_vm_failure();
    }
    let share = |r: &Report| r.main().stragglers_served as f64 / r.main().ok().max(1) as f64;
    let (without, with) = (share(&base), share(&hedged));
    assert!(
        without > 0.03,
        "the workload should serve ~5% stragglers without hedging: {without:.3}"
    );
    let p99_ratio = hedged.main().ms(0.99) / base.main().ms(0.99);
    println!(
        "stragglers served: {:.1}% without, {:.1}% with the filter; p99 ratio {p99_ratio:.2}",
        without * 100.0,
        with * 100.0
    );
    assert!(
        with <= 0.5 * without,
        "stragglers served: {:.1}% without, {:.1}% with the filter: not halved",
        without * 100.0,
        with * 100.0
    );
}

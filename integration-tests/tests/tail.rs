//! The point of the filter: the reference workload (shared/ANCHORS.md) at a
//! modest rate, without and with adaptive-hedge at zero configuration.

use integration_tests::scenario::{self, Plan, Proxy, Report, Workload};
use integration_tests::sim::Latency;

/// Baseline then adaptive, one attempt.
fn attempt() -> (Report, Report) {
    // 500 req/s open loop, 12 s per configuration: below saturation, yet busy
    // enough that the VM's idle CPUs do not add wake-up latency
    let plan = Plan::three_hosts(
        Latency::reference(),
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
    (base, hedged)
}

/// p99 with the filter at most half of p99 without. This VM's CPU is
/// sometimes slowed from outside for seconds at a time (its p90 doubles),
/// which inflates both tails and squeezes their ratio: up to three attempts
/// (ratios seen: 0.30-0.45 when quiet, 0.6-1.1 while slowed). A real
/// regression fails all three; every other assertion holds in each.
#[test]
fn the_tail_is_cut() {
    let mut ratios = Vec::new();
    for _ in 0..3 {
        let (base, hedged) = attempt();
        let ratio = hedged.main().ms(0.99) / base.main().ms(0.99);
        ratios.push(ratio);
        if ratio <= 0.5 {
            return;
        }
    }
    panic!("p99 with the filter / p99 without = {ratios:.2?}: not halved in any attempt");
}

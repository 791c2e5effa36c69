//! The point of the filter: the reference workload (shared/ANCHORS.md) at a
//! modest rate, without and with adaptive-hedge at zero configuration.

use integration_tests::scenario::{self, Plan, Proxy, Workload};
use integration_tests::sim::Latency;

#[test]
fn the_tail_is_cut() {
    // 500 req/s open loop, 12 s per configuration: below saturation on 2 cores
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
    let (p99_base, p99_hedged) = (base.main().ms(0.99), hedged.main().ms(0.99));
    assert_eq!(base.main().ok(), 6_000, "{}", base.main().summary());
    assert_eq!(hedged.main().ok(), 6_000, "{}", hedged.main().summary());
    assert!(
        p99_hedged <= 0.5 * p99_base,
        "p99 {p99_hedged:.1} ms with the filter vs {p99_base:.1} ms without: not halved"
    );
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
}

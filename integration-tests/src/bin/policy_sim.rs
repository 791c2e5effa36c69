//! The policy in virtual time (no Envoy): `cargo run --profile e2e -p integration-tests --bin policy_sim`.
use integration_tests::virtual_time::{
    self, BadHost, Length, Outage, Policy, Scenario, Shift, Steady,
};

fn main() {
    let seconds = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(120.0f64);
    let scenarios: Vec<Box<dyn Scenario>> = vec![
        Box::new(Steady),
        Box::new(Shift(3.0)),
        Box::new(Shift(1.0 / 3.0)),
        Box::new(Outage),
        Box::new(BadHost),
    ];
    println!("| scenario | policy | p50 | p90 | p95 | p99 | p999 | extra load |\n|---|---|---|---|---|---|---|---|");
    for s in &scenarios {
        for p in [
            Policy::None,
            Policy::Static { delay_ms: 10.0 },
            Policy::Static { delay_ms: 50.0 },
            Policy::Adaptive {
                plugin_config: "{}".into(),
            },
        ] {
            let o =
                virtual_time::run(s.as_ref(), &p, 20, Length::Seconds(seconds), 42).expect("run");
            println!(
                "| {} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1}% |",
                o.scenario,
                o.policy,
                o.ms(0.5),
                o.ms(0.9),
                o.ms(0.95),
                o.ms(0.99),
                o.ms(0.999),
                o.extra_load() * 100.0
            );
        }
    }
}

use integration_tests::tools::virtual_time::{self, Length, Load, Policy};
use integration_tests::tools::workloads::Workload;
fn main() {
    let id: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(88);
    let cfg = std::env::args().nth(2).unwrap_or_else(|| "{}".into());
    let w = Workload::generate(2026, id);
    println!("{}", w.describe());
    let o = virtual_time::run(&w, &Policy::Adaptive { plugin_config: cfg }, Load::Open { rate: w.rate }, Length::Requests(w.requests), id as u64 + 1).unwrap();
    println!("p99 {:.1} p999 {:.1} load {:.3} refused {}", o.ms(0.99), o.ms(0.999), o.extra_load(), o.budget_exhausted);
    for (t, d) in o.delay_timeline.iter().step_by((o.delay_timeline.len() / 30).max(1)) {
        println!("t {t:.1}s delay {d:.1} ms");
    }
}

//! Checks configs that load adaptive-hedge (Envoy YAML, Istio and Envoy
//! Gateway manifests) for mistakes Envoy itself accepts silently, such as an
//! upstream-role filter without `allow_on_headers_stop_iteration: true`.
//!
//!     check-configs FILE...
//!
//! Exits 1 if any file has a problem; warnings are printed, not fatal.

use integration_tests::tools::config_check::check;

fn main() {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        eprintln!("usage: check-configs FILE...");
        std::process::exit(2);
    }
    let mut failed = false;
    for file in &files {
        let text = match std::fs::read_to_string(file) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{file}: {e}");
                failed = true;
                continue;
            }
        };
        let report = check(&text);
        for p in &report.problems {
            println!("{file}: error: {p}");
        }
        for w in &report.warnings {
            println!("{file}: warning: {w}");
        }
        failed |= !report.problems.is_empty();
        if report.problems.is_empty() {
            println!(
                "{file}: ok ({} downstream, {} upstream instance(s) of adaptive-hedge)",
                report.downstream, report.upstream
            );
        }
    }
    std::process::exit(i32::from(failed));
}

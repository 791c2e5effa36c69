//! Checks configs that load adaptive-hedge (Envoy YAML, Istio and Envoy
//! Gateway manifests) for mistakes Envoy itself accepts silently, such as an
//! upstream-role filter without `allow_on_headers_stop_iteration: true`;
//! with `--crds DIR`, also every Kubernetes object in them against the
//! OpenAPI schema of its CRD in DIR (`make crds` fetches them into
//! build/crds; `make check-configs` passes them), unknown fields included.
//!
//!     check-configs [--crds DIR] FILE...
//!
//! Exits 1 if any file has a problem; warnings are printed, not fatal.

use integration_tests::tools::config_check::check;
use integration_tests::tools::manifest_schema::Schemas;

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut schemas = None;
    if let Some(at) = args.iter().position(|a| a == "--crds") {
        let Some(dir) = args.get(at + 1).cloned() else {
            eprintln!("usage: check-configs [--crds DIR] FILE...");
            std::process::exit(2);
        };
        args.drain(at..at + 2);
        match Schemas::load(std::path::Path::new(&dir)) {
            Ok(s) => {
                println!("schemas: {} kinds from the CRDs in {dir}", s.kinds());
                schemas = Some(s);
            }
            Err(e) => {
                eprintln!("check-configs: {e}");
                std::process::exit(2);
            }
        }
    } else {
        println!(
            "schemas: not checked (no --crds DIR): `make check-configs` checks the manifests against their CRDs"
        );
    }
    let files = args;
    if files.is_empty() {
        eprintln!("usage: check-configs [--crds DIR] FILE...");
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
        let mut report = check(&text);
        let mut schema_note = String::new();
        if let Some(schemas) = schemas.as_mut() {
            let checked = schemas.check(&text);
            report.problems.extend(checked.report.problems);
            report.warnings.extend(checked.report.warnings);
            if checked.valid > 0 {
                schema_note = format!(
                    "; {} Kubernetes object(s) valid against their schemas",
                    checked.valid
                );
            }
            if checked.local > 0 {
                schema_note.push_str(&format!(
                    "; {} kustomize-only object(s), never applied, not checked",
                    checked.local
                ));
            }
        }
        for p in &report.problems {
            println!("{file}: error: {p}");
        }
        for w in &report.warnings {
            println!("{file}: warning: {w}");
        }
        failed |= !report.problems.is_empty();
        if report.problems.is_empty() {
            println!(
                "{file}: ok ({} downstream, {} upstream instance(s) of adaptive-hedge{schema_note})",
                report.downstream, report.upstream
            );
        }
    }
    std::process::exit(i32::from(failed));
}

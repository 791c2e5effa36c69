//! The deploy checks that need tools only a root install gives (Debian's
//! docker-compose, skopeo, umoci), func-e and promtool: `make setup-deploy` installs
//! them, `make test-deploy` runs these (CI does both). `make test` runs the
//! rest of the deploy checks (`deploy.rs`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::deploy::{build_image, run, ENVOY_VERSION, IMAGE_TAG};
use integration_tests::harness::envoy::{self, repo_root, Envoy, EnvoyOptions, Launcher};

/// A tool this test needs; CI installs them (`make setup-deploy`). `go
/// install` puts func-e in ~/go/bin, which need not be on `PATH`.
fn tool(name: &str) -> PathBuf {
    let go_bin = Path::new(&std::env::var("HOME").unwrap_or_default())
        .join("go/bin")
        .join(name);
    let unpacked = repo_root().join("build/tools").join(name);
    envoy::on_path(name)
        .or_else(|| go_bin.is_file().then_some(go_bin))
        .or_else(|| unpacked.is_file().then_some(unpacked))
        .unwrap_or_else(|| {
            panic!("{name} not found: run `make setup-deploy` (docker-compose, skopeo, umoci from Debian; func-e by go install; promtool unpacked from Debian's prometheus)")
        })
}

/// `docker-compose config` accepts the file, with and without the
/// streaming profile.
#[test]
fn docker_compose_accepts_the_compose_file() {
    let compose = tool("docker-compose");
    for profile in [&[][..], &["--profile", "streaming"]] {
        run(Command::new(&compose)
            .current_dir(repo_root())
            .args(profile)
            .args(["-f", "docker-compose.yml", "config", "-q"]));
    }
}

/// The alert rules load (`promtool check rules`) and each alert fires on
/// the series that should raise it and not on a healthy cluster beside it
/// (`promtool test rules`).
#[test]
fn promtool_checks_and_tests_the_alert_rules() {
    let promtool = tool("promtool");
    let dir = repo_root().join("envoy-configs/monitoring");
    let checked =
        run(Command::new(&promtool)
            .current_dir(&dir)
            .args(["check", "rules", "alerts.yaml"]));
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested =
        run(Command::new(&promtool)
            .current_dir(&dir)
            .args(["test", "rules", "alerts_test.yaml"]));
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// Real OCI tools read the image `make oci` writes.
#[test]
fn skopeo_and_umoci_read_the_oci_image() {
    let dir = std::env::temp_dir().join(format!("adaptive-hedge-oci-tools-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let digest = build_image(&dir);
    let reference = format!("{}:{IMAGE_TAG}", dir.display());
    let inspect = run(Command::new(tool("skopeo")).args(["inspect", &format!("oci:{reference}")]));
    let inspected: serde_json::Value = serde_json::from_str(&inspect).expect("skopeo json");
    assert_eq!(inspected["Digest"], digest.as_str());
    run(Command::new(tool("umoci")).args(["stat", "--image", &reference]));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `make run` under func-e: func-e runs the Envoy binary placed in its data
/// home (no download), and the filter works the same.
#[test]
fn func_e_runs_envoy_with_the_filter() {
    let func_e = tool("func-e");
    let home = std::env::temp_dir().join(format!("adaptive-hedge-func-e-{}", std::process::id()));
    let bin = home.join(format!("data/envoy-versions/{ENVOY_VERSION}/bin"));
    std::fs::create_dir_all(&bin).expect("func-e home");
    let binary = envoy::envoy_binary();
    let binary = binary.canonicalize().unwrap_or(binary);
    let _ = std::fs::remove_file(bin.join("envoy"));
    std::os::unix::fs::symlink(&binary, bin.join("envoy")).expect("symlink");
    let env = |k: &str, sub: &str| (k.to_string(), home.join(sub).display().to_string());
    let launcher = Launcher {
        program: func_e,
        args: vec!["run".into()],
        env: vec![
            env("FUNC_E_DATA_HOME", "data"),
            env("FUNC_E_STATE_HOME", "state"),
            env("FUNC_E_CONFIG_HOME", "config"),
            env("FUNC_E_RUNTIME_DIR", "run"),
            ("ENVOY_VERSION".into(), ENVOY_VERSION.into()),
        ],
    };
    let sim = integration_tests::harness::sim::Simulator::start(vec![
        integration_tests::harness::sim::Latency::fixed_ms(1);
        3
    ])
    .expect("sim");
    let envoy = Envoy::start(EnvoyOptions::new("envoy.yaml", sim.ports()).launcher(launcher))
        .expect("envoy under func-e");
    let rt = integration_tests::runtime();
    let client = integration_tests::harness::load::client();
    let statuses = rt.block_on(async {
        let mut statuses = Vec::new();
        for _ in 0..20 {
            let reply =
                integration_tests::harness::load::request(&client, "GET", &envoy.url("/"), &[])
                    .await
                    .expect("request");
            statuses.push(reply.status);
        }
        statuses
    });
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(envoy.requests_seen("backend", 20), 20);
    assert!(envoy.log().contains("adaptive-hedge 0.1.0 configured"));
    envoy.assert_no_vm_failure();
    drop(envoy);
    let _ = std::fs::remove_dir_all(&home);
}

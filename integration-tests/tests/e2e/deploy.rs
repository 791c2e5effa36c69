//! Where users run the filter: the docker-compose demo, the OCI image, the
//! Istio and Envoy Gateway manifests. No Docker engine or Kubernetes here,
//! so each is checked as far as the tools `make test` installs allow: compose
//! by its file and by running its services natively, the Envoy configs by
//! `envoy --mode validate`, the image by its layout and digests, the
//! manifests' plugin configs by the filter's own validation. What needs
//! docker-compose, skopeo, umoci or func-e is in `deploy_tools.rs`
//! (`make test-deploy`).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::deploy::{
    blob, build_image, get, of_kind, run, sha256_hex, str_at, yaml_docs, ENVOY_VERSION, IMAGE_TAG,
    MANIFESTS,
};
use adaptive_hedge::policy::config::Config;
use integration_tests::harness::envoy::{self, repo_root, ChildSetup, Envoy, EnvoyOptions};
use integration_tests::harness::RemoveOnDrop;
use serde_norway::Value;

/// A manifest's plugin config through the filter's own validation: what
/// Envoy would refuse fails here, naming the field.
fn check_plugin_config(where_: &str, config: &Value) -> Config {
    let json = serde_json::to_vec(config).unwrap_or_else(|e| panic!("{where_}: {e}"));
    Config::parse(&json).unwrap_or_else(|e| panic!("{where_}: {e}"))
}

/// The compose file with its anchors and merge keys resolved, as Compose
/// reads it.
fn compose_file() -> Value {
    let mut doc = yaml_docs("docker-compose.yml").remove(0);
    doc.apply_merge().expect("merge keys");
    doc
}

/// A service's short-syntax volumes: (file in the repo, path in the container).
fn mounts(service: &Value) -> Vec<(std::path::PathBuf, String)> {
    let mut mounted = Vec::new();
    for volume in service["volumes"].as_sequence().into_iter().flatten() {
        let spec = volume.as_str().expect("short volume syntax");
        let (source, target) = spec.split_once(':').expect("source:target");
        let target = target.split(':').next().unwrap_or_default();
        mounted.push((repo_root().join(source), target.to_string()));
    }
    mounted
}

/// The Dockerfile stage named `name`, as lines (`FROM ... AS name` up to
/// the next FROM).
fn dockerfile_stage(text: &str, name: &str) -> Vec<String> {
    let mut stage = None::<Vec<String>>;
    for line in text.lines().map(str::trim) {
        if line.starts_with("FROM ") {
            if stage.is_some() {
                break;
            }
            if line.ends_with(&format!(" AS {name}")) {
                stage = Some(vec![line.to_string()]);
            }
        } else if let Some(stage) = stage.as_mut() {
            stage.push(line.to_string());
        }
    }
    stage.unwrap_or_else(|| panic!("the Dockerfile has no stage {name}"))
}

/// `docker compose up` needs no Rust on the host: the images are built from
/// the Dockerfile, whose stages build what the services run (the wasm in
/// the Envoy image, at the path the mounted config loads), with the pinned
/// Rust and Envoy versions; every file mounted exists in a fresh clone; the
/// Envoy config passes `envoy --mode validate` with the filter.
#[test]
fn compose_file_builds_the_demo_and_everything_it_mounts_exists() {
    let root = repo_root();
    let doc = compose_file();
    let services = doc["services"].as_mapping().expect("services");
    let names: Vec<&str> = services.keys().filter_map(Value::as_str).collect();
    for name in [
        "envoy",
        "sim-1",
        "sim-2",
        "sim-3",
        "load",
        "prometheus",
        "grafana",
    ] {
        assert!(names.contains(&name), "service {name} missing: {names:?}");
    }
    for (name, service) in services {
        // Nothing from `make build` (build/ is not in a fresh clone, and a
        // missing bind-mount source becomes a root-owned directory).
        for (source, target) in mounts(service) {
            assert!(
                source.is_file() && !source.starts_with(root.join("build")),
                "{name:?} mounts {} at {target}: not a file of the repository",
                source.display()
            );
        }
        // Built images come from the Dockerfile at the root, by target.
        if let Some(build) = service["build"].as_mapping() {
            assert_eq!(build.get("context").and_then(Value::as_str), Some("."));
            assert!(build.get("dockerfile").is_none(), "{name:?}: {build:?}");
            let target = str_at(&service["build"], "target");
            assert!(["envoy", "sim"].contains(&target), "{name:?}: {target}");
        }
    }
    let envoy = &doc["services"]["envoy"];
    assert_eq!(str_at(envoy, "build.target"), "envoy");
    let ports: Vec<&str> = envoy["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    // the admin interface (it can stop Envoy) on the host's loopback only
    assert!(
        ports.contains(&"127.0.0.1:9901:9901") && ports.contains(&"10000:10000"),
        "{ports:?}"
    );

    // The Dockerfile: pinned versions, and each stage builds what its
    // service runs.
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).expect("Dockerfile");
    let toolchain = std::fs::read_to_string(root.join("rust-toolchain.toml")).expect("toolchain");
    let rust = toolchain
        .lines()
        .find_map(|l| l.strip_prefix("channel = "))
        .map(|v| v.trim_matches('"'))
        .expect("channel");
    assert!(
        rust.split('.').count() == 3 && rust.split('.').all(|n| n.parse::<u32>().is_ok()),
        "rust-toolchain.toml pins a version, not a channel: {rust}"
    );
    assert!(dockerfile.contains(&format!("ARG RUST_VERSION={rust}\n")));
    assert!(dockerfile.contains(&format!("ARG ENVOY_VERSION={ENVOY_VERSION}\n")));
    let wasm_stage = dockerfile_stage(&dockerfile, "wasm").join("\n");
    assert!(
        wasm_stage.contains(
            "cargo build --release --locked --target wasm32-unknown-unknown -p adaptive-hedge"
        ) && wasm_stage.contains("--remap-path-prefix=/usr/local/cargo=/cargo"),
        "{wasm_stage}"
    );
    let envoy_stage = dockerfile_stage(&dockerfile, "envoy");
    assert!(envoy_stage[0].starts_with("FROM envoyproxy/envoy:v${ENVOY_VERSION}"));
    let loaded_at = "/etc/envoy/adaptive_hedge.wasm";
    assert!(
        envoy_stage
            .iter()
            .any(|l| l.starts_with("COPY --from=wasm ")
                && l.ends_with(&format!("/release/adaptive_hedge.wasm {loaded_at}"))),
        "{envoy_stage:?}"
    );
    let tools_stage = dockerfile_stage(&dockerfile, "tools").join("\n");
    for bin in ["sim", "load"] {
        assert!(
            tools_stage.contains(&format!("--bin {bin}")),
            "builds {bin}"
        );
        assert!(root
            .join(format!("integration-tests/src/bin/{bin}.rs"))
            .exists());
    }

    // The Envoy config it mounts passes `envoy --mode validate` with the
    // filter where the image puts it, and routes to the three sim services.
    let config = mounts(envoy)
        .into_iter()
        .find(|(_, t)| t == "/etc/envoy/envoy.yaml")
        .map(|(p, _)| p)
        .expect("envoy.yaml mounted");
    assert_eq!(config, root.join("envoy-configs/docker/envoy.yaml"));
    let text = std::fs::read_to_string(&config).expect("config");
    assert!(text.contains(&format!("filename: {loaded_at}")));
    for sim in ["sim-1", "sim-2", "sim-3"] {
        assert!(
            text.contains(&format!("address: {sim}, port_value: 8080")),
            "{sim}"
        );
    }
    let (ok, output) = Envoy::validate(
        EnvoyOptions::new("docker/envoy.yaml", &[])
            .edit(loaded_at, &envoy::wasm_path().display().to_string()),
    )
    .expect("validate");
    assert!(
        ok,
        "envoy --mode validate refused docker/envoy.yaml:\n{output}"
    );
    assert!(
        output.contains("adaptive-hedge 0.1.0 configured"),
        "{output}"
    );
}

/// Prometheus scrapes the demo's Envoys and loads the shipped alert rules;
/// Grafana gets it as its data source and the shipped dashboard.
#[test]
fn compose_monitoring_scrapes_envoy_and_shows_the_dashboard() {
    let doc = compose_file();
    let in_container = |service: &str, file: &str| -> String {
        mounts(&doc["services"][service])
            .into_iter()
            .find(|(source, _)| source.ends_with(file))
            .map(|(_, target)| target)
            .unwrap_or_else(|| panic!("{service} does not mount {file}"))
    };
    // Prometheus: its default config path, the rules beside it.
    let config_at = in_container("prometheus", "monitoring/prometheus.yml");
    assert_eq!(config_at, "/etc/prometheus/prometheus.yml");
    let prometheus = &yaml_docs("envoy-configs/monitoring/prometheus.yml")[0];
    for rules in prometheus["rule_files"].as_sequence().expect("rule_files") {
        let rules = rules.as_str().expect("path");
        assert_eq!(
            in_container("prometheus", &format!("monitoring/{rules}")),
            format!("/etc/prometheus/{rules}")
        );
    }
    let jobs = prometheus["scrape_configs"].as_sequence().expect("jobs");
    let envoy_admin = jobs
        .iter()
        .find(|job| get(job, "static_configs.0.targets.0").as_str() == Some("envoy:9901"));
    let envoy_admin = envoy_admin.expect("a job scrapes envoy:9901");
    assert_eq!(str_at(envoy_admin, "metrics_path"), "/stats/prometheus");

    // Grafana: Prometheus by its service name, the default data source
    // (the dashboard's `datasource` variable picks the default), and the
    // provider's folder holding the dashboard.
    let datasource = &yaml_docs("envoy-configs/monitoring/grafana/datasource.yaml")[0];
    let source = get(datasource, "datasources.0");
    assert_eq!(str_at(source, "type"), "prometheus");
    assert_eq!(str_at(source, "url"), "http://prometheus:9090");
    assert_eq!(source["isDefault"].as_bool(), Some(true));
    let provider = &yaml_docs("envoy-configs/monitoring/grafana/dashboards.yaml")[0];
    let folder = str_at(provider, "providers.0.options.path");
    let dashboard_at = in_container("grafana", "monitoring/dashboard.json");
    assert_eq!(
        std::path::Path::new(&dashboard_at).parent(),
        Some(std::path::Path::new(folder))
    );
    assert!(in_container("grafana", "grafana/datasource.yaml")
        .starts_with("/etc/grafana/provisioning/datasources/"));
    assert!(in_container("grafana", "grafana/dashboards.yaml")
        .starts_with("/etc/grafana/provisioning/dashboards/"));
    let home = doc["services"]["grafana"]["environment"]
        ["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
        .as_str();
    assert_eq!(home, Some(dashboard_at.as_str()));
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("envoy-configs/monitoring/dashboard.json"))
            .expect("dashboard"),
    )
    .expect("dashboard json");
    assert_eq!(dashboard["templating"]["list"][0]["type"], "datasource");
}

/// The compose file's streaming profile: its Envoy runs both roles from the
/// mounted wasm, reaches the streaming hosts by name, and passes both
/// `envoy --mode validate` and the config check.
#[test]
fn compose_streaming_profile_is_valid() {
    let root = repo_root();
    let doc = &yaml_docs("docker-compose.yml")[0];
    let service = &doc["services"]["envoy-streaming"];
    assert_eq!(str_at(service, "profiles.0"), "streaming");
    let volumes: Vec<&str> = service["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        volumes.contains(&"./envoy-configs/docker/envoy-streaming.yaml:/etc/envoy/envoy.yaml:ro"),
        "{volumes:?}"
    );
    for n in 1..=3 {
        let sim = &doc["services"][format!("sim-stream-{n}").as_str()];
        let command: Vec<&str> = sim["command"]
            .as_sequence()
            .expect("command")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            command.windows(2).any(|w| w == ["--stream", "20:10"]),
            "{command:?}"
        );
        assert!(
            command.windows(2).any(|w| w == ["--model", "streaming"]),
            "{command:?}"
        );
    }
    let text =
        std::fs::read_to_string(root.join("envoy-configs/docker/envoy-streaming.yaml")).unwrap();
    for n in 1..=3 {
        assert!(text.contains(&format!("address: sim-stream-{n}, port_value: 8080")));
    }
    let report = integration_tests::tools::config_check::check(&text);
    assert!(
        report.problems.is_empty() && report.upstream == 1,
        "{report:?}"
    );
    let (ok, output) = Envoy::validate(EnvoyOptions::new("docker/envoy-streaming.yaml", &[]).edit(
        "/etc/envoy/adaptive_hedge.wasm",
        &envoy::wasm_path().display().to_string(),
    ))
    .expect("validate");
    assert!(
        ok,
        "envoy --mode validate refused docker/envoy-streaming.yaml:\n{output}"
    );
}

/// The compose topology without Docker: the `sim` and `load` binaries the
/// images hold, with the same arguments, around a real Envoy.
#[test]
fn compose_services_work_natively() {
    // The ports are picked free, then bound by the `sim` binary: another
    // process may take one between. A `sim` that exits (it could not
    // bind) is started again on fresh ports, at most three times.
    let (sim, ports) = (0..3)
        .find_map(|_| {
            let ports: Vec<u16> = (0..3).map(|_| envoy::free_port()).collect();
            let mut sim = Command::new(env!("CARGO_BIN_EXE_sim"));
            for p in &ports {
                sim.args(["--listen", &format!("127.0.0.1:{p}")]);
            }
            let mut sim = ChildGuard(
                sim.args(["--model", "reference"])
                    .stdout(Stdio::null())
                    .pre_exec_setup(None)
                    .spawn()
                    .expect("sim"),
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                // listening, and ours: still running
                let listening = ports
                    .iter()
                    .all(|p| std::net::TcpStream::connect(("127.0.0.1", *p)).is_ok());
                match sim.0.try_wait() {
                    Ok(None) if listening => return Some((sim, ports)),
                    Ok(None) => {}
                    _ => return None,
                }
                assert!(Instant::now() < deadline, "sim did not listen");
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .expect("sim could not bind its ports in three tries");
    let envoy = Envoy::start(
        EnvoyOptions::new("envoy.yaml", &ports)
            .plugin_config(r#"{"min_samples": 50, "debug_header": true}"#),
    )
    .expect("envoy");
    let out = run(Command::new(env!("CARGO_BIN_EXE_load")).args([
        "--url",
        &envoy.url("/"),
        "--rate",
        "200",
        "--requests",
        "400",
        "--rounds",
        "1",
    ]));
    assert!(
        out.contains("round 1:") && out.contains("ok=400 errors=0"),
        "{out}"
    );
    assert!(envoy.requests_seen("backend", 400) >= 400);
    assert!(
        envoy.flushed_filter_stat("hedges_armed_total", "backend", 1) > 0,
        "the filter armed nothing: {}",
        envoy.filter_stats("backend")
    );
    // the fan-out profile's front end, with its compose arguments (fewer
    // requests): each of its requests is 10 calls through Envoy
    let doc = compose_file();
    let mut args: Vec<String> = doc["services"]["load-fanout"]["command"]
        .as_sequence()
        .expect("load-fanout command")
        .iter()
        .skip(1)
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    let value_of = |args: &[String], flag: &str| -> usize {
        args.iter().position(|a| a == flag).expect(flag) + 1
    };
    let at = value_of(&args, "--url");
    args[at] = envoy.url("/");
    let at = value_of(&args, "--requests");
    args[at] = "40".into();
    let at = value_of(&args, "--rounds");
    args[at] = "1".into();
    let fanout: u64 = args[value_of(&args, "--fanout")].parse().expect("fanout");
    assert!(fanout >= 10, "{args:?}");
    let out = run(Command::new(env!("CARGO_BIN_EXE_load")).args(&args));
    assert!(
        out.contains(&format!("waiting for {fanout} calls")) && out.contains("ok=40 errors=0"),
        "{out}"
    );
    assert!(envoy.requests_seen("backend", 400 + 40 * fanout as i64) >= 400 + 40 * fanout as i64);
    envoy.assert_no_vm_failure();
    drop(sim);
}

struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // only a child not yet reaped is ours to signal
        if let Ok(None) = self.0.try_wait() {
            // SAFETY: signalling our own child by its pid, not yet reaped.
            unsafe {
                libc::kill(self.0.id() as i32, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn oci_image_is_compat_format_and_manifests_quote_its_digest() {
    let dir = std::env::temp_dir().join(format!("adaptive-hedge-oci-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let _remove = RemoveOnDrop(dir.clone());
    let digest = build_image(&dir);
    let wasm = std::fs::read(envoy::wasm_path()).expect("make build");

    // index -> manifest -> one layer holding plugin.wasm, the compat annotation
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).expect("index")).unwrap();
    assert_eq!(index["manifests"][0]["digest"], digest.as_str());
    assert_eq!(
        index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        IMAGE_TAG
    );
    let manifest: serde_json::Value = serde_json::from_slice(&blob(&dir, &digest)).unwrap();
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        manifest["annotations"]["module.wasm.image/variant"], "compat",
        "{manifest}"
    );
    let layers = manifest["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 1, "exactly one layer: {manifest}");
    assert_eq!(
        layers[0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    let gz = blob(&dir, layers[0]["digest"].as_str().unwrap());
    assert_eq!(layers[0]["size"], gz.len());
    let mut tar_bytes = Vec::new();
    flate2::read::GzDecoder::new(gz.as_slice())
        .read_to_end(&mut tar_bytes)
        .expect("gzip");
    let mut archive = tar::Archive::new(tar_bytes.as_slice());
    let mut entries = Vec::new();
    for entry in archive.entries().expect("tar") {
        let mut entry = entry.expect("entry");
        let name = entry.path().expect("path").display().to_string();
        let mut content = Vec::new();
        entry.read_to_end(&mut content).expect("read");
        entries.push((name, content));
    }
    assert_eq!(entries.len(), 1, "one file in the layer");
    assert_eq!(entries[0].0, "plugin.wasm");
    assert!(
        entries[0].1 == wasm,
        "the layer holds build/adaptive_hedge.wasm"
    );
    let config: serde_json::Value =
        serde_json::from_slice(&blob(&dir, manifest["config"]["digest"].as_str().unwrap()))
            .unwrap();
    assert_eq!(
        config["rootfs"]["diff_ids"][0],
        format!("sha256:{}", sha256_hex(&tar_bytes))
    );

    // Reproducible: the same wasm gives the same digest, so manifests can
    // quote it; and they do.
    let again = dir.with_extension("again");
    let _ = std::fs::remove_dir_all(&again);
    let _remove_again = RemoveOnDrop(again.clone());
    assert_eq!(
        build_image(&again),
        digest,
        "the image build is not reproducible"
    );
    let hex = digest.trim_start_matches("sha256:");
    let istio: Vec<Value> = [MANIFESTS[0], MANIFESTS[2]]
        .iter()
        .flat_map(|m| yaml_docs(m))
        .collect();
    for plugin in of_kind(&istio, "WasmPlugin") {
        assert_eq!(
            str_at(plugin, "spec.sha256"),
            hex,
            "{} or {}: stale digest: run `make oci-pin`",
            MANIFESTS[0],
            MANIFESTS[2]
        );
        assert_eq!(
            str_at(plugin, "spec.url"),
            format!("oci://registry.example.com/adaptive-hedge:{IMAGE_TAG}")
        );
    }
    let gateway: Vec<Value> = [MANIFESTS[1], MANIFESTS[3]]
        .iter()
        .flat_map(|m| yaml_docs(m))
        .collect();
    for policy in of_kind(&gateway, "EnvoyExtensionPolicy") {
        for wasm in policy["spec"]["wasm"].as_sequence().expect("wasm") {
            assert_eq!(
                str_at(wasm, "code.image.sha256"),
                hex,
                "{} or {}: stale digest: run `make oci-pin`",
                MANIFESTS[1],
                MANIFESTS[3]
            );
            assert!(str_at(wasm, "code.image.url").ends_with(&format!(":{IMAGE_TAG}")));
        }
    }
}

/// `envoy --mode validate` accepts the bootstrap `text` (`name` tells the
/// temporary file and the failure apart).
fn envoy_validates(name: &str, text: &str) {
    let path =
        std::env::temp_dir().join(format!("adaptive-hedge-{name}-{}.yaml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    let out = Command::new(envoy::envoy_binary())
        .args(["--mode", "validate", "--log-level", "info", "-c"])
        .arg(&path)
        .output()
        .expect("envoy");
    let _ = std::fs::remove_file(&path);
    let output =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && output.contains("OK"),
        "{name}: envoy --mode validate refused it:\n{output}"
    );
}

#[test]
fn istio_manifests_configure_the_filter_and_what_hedging_needs() {
    let docs = yaml_docs(MANIFESTS[0]);
    let plugins = of_kind(&docs, "WasmPlugin");
    assert_eq!(plugins.len(), 2, "gateway and sidecars");
    for p in &plugins {
        assert_eq!(str_at(p, "apiVersion"), "extensions.istio.io/v1alpha1");
        assert_eq!(str_at(p, "spec.failStrategy"), "FAIL_OPEN");
        assert_eq!(str_at(p, "spec.pluginName"), "adaptive_hedge");
        assert_eq!(str_at(p, "spec.phase"), "UNSPECIFIED_PHASE");
        check_plugin_config(
            &format!("{} {}", MANIFESTS[0], str_at(p, "metadata.namespace")),
            get(p, "spec.pluginConfig"),
        );
    }
    assert!(plugins
        .iter()
        .any(|p| get(p, "spec.selector.matchLabels.istio").as_str() == Some("ingressgateway")));
    assert!(plugins
        .iter()
        .any(|p| get(p, "spec.match.0.mode").as_str() == Some("CLIENT")));
    // Circuit breaker: Istio's default max_retries (2^32-1) stays; a
    // maxRetries in the DestinationRule could only lower it.
    let rule = of_kind(&docs, "DestinationRule")[0];
    assert!(get(rule, "spec.trafficPolicy.connectionPool").is_null());
    // Outlier detection without the local-origin split: a hedge's timeout
    // is the 204, no failure, and the plugin (admin_cluster) reads that it
    // need not hold hedges back there
    assert_eq!(
        get(
            rule,
            "spec.trafficPolicy.outlierDetection.consecutive5xxErrors"
        )
        .as_u64(),
        Some(5)
    );
    assert!(get(
        rule,
        "spec.trafficPolicy.outlierDetection.splitExternalLocalOriginErrors"
    )
    .is_null());
    // Host choice: the outbound cluster follows the filter's header, and
    // Envoy accepts the patch on a cluster that keeps Istio's lb_policy.
    let host_choice = of_kind(&docs, "EnvoyFilter")
        .into_iter()
        .find(|f| str_at(f, "metadata.name") == "adaptive-hedge-host-choice")
        .expect("the host choice EnvoyFilter");
    assert_eq!(
        str_at(host_choice, "spec.configPatches.0.applyTo"),
        "CLUSTER"
    );
    let policy = get(
        host_choice,
        "spec.configPatches.0.patch.value.load_balancing_policy",
    );
    assert_eq!(
        str_at(
            policy,
            "policies.0.typed_extension_config.typed_config.override_host_sources.0.header"
        ),
        adaptive_hedge::headers::ENDPOINT_HEADER
    );
    // the ingress gateway's plugin chooses hosts too: its clusters get the
    // policy (the GATEWAY context, its pods' labels)
    let gateway_patch = of_kind(&docs, "EnvoyFilter").into_iter().find(|f| {
        let at = |path: &str| get(f, path).as_str();
        at("metadata.name") == Some("adaptive-hedge-host-choice")
            && at("spec.configPatches.0.match.context") == Some("GATEWAY")
            && at("spec.workloadSelector.labels.istio") == Some("ingressgateway")
            && at("spec.workloadSelector.labels.adaptive-hedge") == Some("gateway")
    });
    assert!(
        gateway_patch
            .is_some_and(
                |g| get(g, "spec.configPatches.0.patch.value.load_balancing_policy") == policy
            ),
        "no host-choice patch for the ingress gateway's clusters"
    );
    let mut bootstrap: Value = serde_norway::from_str(
        &std::fs::read_to_string(repo_root().join("envoy-configs/envoy-baseline.yaml")).unwrap(),
    )
    .unwrap();
    let cluster = &mut bootstrap["static_resources"]["clusters"][0];
    cluster["lb_policy"] = Value::from("LEAST_REQUEST");
    cluster["load_balancing_policy"] = policy.clone();
    envoy_validates(
        "istio-host-choice",
        &serde_norway::to_string(&bootstrap).unwrap(),
    );
    // Retry back-off: added to the hedge delay, 25 ms by default; set on
    // the proxies that carry the plugin only (the gateway's by its
    // selector, the sidecars of the plugin's namespace), never mesh-wide.
    let patches: Vec<&Value> = of_kind(&docs, "EnvoyFilter")
        .into_iter()
        .filter(|f| str_at(f, "metadata.name") == "adaptive-hedge-retry-back-off")
        .collect();
    assert_eq!(patches.len(), 2);
    for patch in &patches {
        assert_eq!(str_at(patch, "spec.configPatches.0.applyTo"), "HTTP_ROUTE");
        let back_off = get(
            patch,
            "spec.configPatches.0.patch.value.route.retry_policy.retry_back_off",
        );
        assert_eq!(str_at(back_off, "base_interval"), "0.001s");
        let scoped = !get(patch, "spec.workloadSelector").is_null()
            || str_at(patch, "metadata.namespace") != "istio-system";
        assert!(scoped, "a back-off patch for the whole mesh: {patch:?}");
    }
    let contexts: Vec<&str> = patches
        .iter()
        .map(|p| str_at(p, "spec.configPatches.0.match.context"))
        .collect();
    assert_eq!(contexts, ["GATEWAY", "SIDECAR_OUTBOUND"]);
}

/// Every `HTTP_ROUTE` MERGE the Istio manifests ship matches forwarding
/// routes only: merged into a redirect or a `direct_response` (Istio's
/// `block_all` virtual host under `REGISTRY_ONLY`, a VirtualService
/// redirect), `route: {...}` replaces the action with a route that names no
/// cluster, and Envoy refuses the proxy's whole route configuration.
#[test]
fn istio_route_patches_touch_only_routes_that_forward() {
    let docs = istio_documents();
    let mut seen = 0;
    for (file, doc) in docs.iter().filter(|(_, d)| kind_of(d) == "EnvoyFilter") {
        let Some(patches) = get(doc, "spec.configPatches").as_sequence() else {
            continue;
        };
        for patch in patches {
            if str_at(patch, "applyTo") != "HTTP_ROUTE" {
                continue;
            }
            seen += 1;
            assert_eq!(
                get(patch, "match.routeConfiguration.vhost.route.action").as_str(),
                Some("ROUTE"),
                "{file}: {}",
                named(file, doc)
            );
        }
    }
    assert!(seen >= 4, "{seen} route patches");
}

/// Every Istio patch of a cluster sets what Envoy has from 1.35 (Istio
/// 1.27) on: the `override_host` balancer, which an older proxy refuses
/// with the whole cluster update, and the upstream role's
/// `allow_on_headers_stop_iteration`, which it drops (docs/streaming.md).
/// Each matches only proxies of Istio 1.27 and later, by Istio's version
/// regex (RE2, whose syntax the regex crate shares for this).
#[test]
fn istio_cluster_patches_match_only_proxies_that_have_what_they_set() {
    let docs = istio_documents();
    let mut seen = 0;
    for (file, doc) in docs.iter().filter(|(_, d)| kind_of(d) == "EnvoyFilter") {
        let Some(patches) = get(doc, "spec.configPatches").as_sequence() else {
            continue;
        };
        for patch in patches.iter().filter(|p| str_at(p, "applyTo") == "CLUSTER") {
            seen += 1;
            let at = format!("{file}: {}", named(file, doc));
            let pattern = str_at(patch, "match.proxy.proxyVersion");
            let version = regex::Regex::new(pattern).unwrap_or_else(|e| panic!("{at}: {e}"));
            for v in ["1.27.0", "1.27.3", "1.28.0-beta.1", "1.29.1", "1.31.0"] {
                assert!(version.is_match(v), "{at}: {pattern:?} refuses {v}");
            }
            for v in ["1.26.4", "1.2.0", "1.20.1", "1.9.9", "0.27.0"] {
                assert!(!version.is_match(v), "{at}: {pattern:?} takes {v}");
            }
        }
    }
    assert!(seen >= 4, "{seen} cluster patches");
}

/// Every shipped Istio plugin (sidecar, gateway, waypoint, streaming) names
/// the bootstrap's cluster to Envoy's admin, which pilot-agent's default
/// bootstrap has in every proxy it starts: without it the plugin cannot
/// read that the DestinationRule's outlier detection never counts a hedge's
/// timeout, and holds hedges back on every cluster.
#[test]
fn every_istio_plugin_names_the_bootstrap_admin_cluster() {
    let docs = istio_documents();
    let plugins: Vec<&(String, Value)> = docs.iter().filter(|(_, d)| is_our_plugin(d)).collect();
    assert!(plugins.len() >= 4, "{} plugins", plugins.len());
    for (file, plugin) in plugins {
        assert_eq!(
            get(plugin, "spec.pluginConfig.admin_cluster").as_str(),
            Some("prometheus_stats"),
            "{file}: {}",
            named(file, plugin)
        );
    }
}

#[test]
fn gateway_manifests_configure_the_filter_and_what_hedging_needs() {
    let docs = yaml_docs(MANIFESTS[1]);
    let policy = of_kind(&docs, "EnvoyExtensionPolicy")[0];
    assert_eq!(
        str_at(policy, "apiVersion"),
        "gateway.envoyproxy.io/v1alpha1"
    );
    assert_eq!(str_at(policy, "spec.targetRefs.0.kind"), "HTTPRoute");
    let wasm = get(policy, "spec.wasm.0");
    assert_eq!(get(wasm, "failOpen").as_bool(), Some(true));
    assert_eq!(str_at(wasm, "rootID"), "adaptive_hedge");
    assert_eq!(str_at(wasm, "code.type"), "Image");
    check_plugin_config(MANIFESTS[1], get(wasm, "config"));

    let traffic = of_kind(&docs, "BackendTrafficPolicy")[0];
    assert_eq!(
        get(traffic, "spec.targetRefs.0"),
        get(policy, "spec.targetRefs.0"),
        "both policies target the same route"
    );
    assert_eq!(
        str_at(traffic, "spec.retry.perRetry.backOff.baseInterval"),
        "1ms"
    );
    assert!(
        get(traffic, "spec.circuitBreaker.maxParallelRetries")
            .as_u64()
            .unwrap_or(0)
            >= 100
    );
    // Host choice: endpoint override reads the filter's header.
    assert_eq!(
        str_at(
            traffic,
            "spec.loadBalancer.endpointOverride.extractFrom.0.header"
        ),
        adaptive_hedge::headers::ENDPOINT_HEADER
    );
    // Triggers apply to unarmed requests too: only failures where the
    // request never reached the backend.
    for trigger in get(traffic, "spec.retry.retryOn.triggers")
        .as_sequence()
        .expect("triggers")
    {
        let t = trigger.as_str().unwrap_or_default();
        assert!(
            ["connect-failure", "refused-stream"].contains(&t),
            "{t}: would retry requests the filter did not arm"
        );
    }
}

/// The metrics' cluster label as each install ships it: plain Envoy in its
/// bootstrap, Istio through a bootstrap-override ConfigMap per namespace,
/// Envoy Gateway through an EnvoyProxy bootstrap merge. All the same tag
/// (Envoy's `envoy.cluster_name`, `envoy_cluster_name` in Prometheus), and
/// Envoy accepts each merged into a bootstrap (the label itself is checked
/// through a running Envoy in config_and_metrics.rs).
#[test]
fn the_metrics_cluster_label_is_shipped_for_every_install() {
    let stats_tags = |bootstrap: &Value| bootstrap["stats_config"]["stats_tags"].clone();
    let plain: Value = serde_norway::from_str(
        &std::fs::read_to_string(repo_root().join("envoy-configs/envoy.yaml")).unwrap(),
    )
    .unwrap();
    let expected = stats_tags(&plain);
    assert_eq!(str_at(&expected, "0.tag_name"), "envoy.cluster_name");
    let mut shipped = Vec::new();
    let istio = yaml_docs(MANIFESTS[0]);
    for map in of_kind(&istio, "ConfigMap") {
        assert_eq!(str_at(map, "metadata.name"), "adaptive-hedge-stats");
        shipped.push((
            format!("istio ConfigMap in {}", str_at(map, "metadata.namespace")),
            map["data"]["custom_bootstrap.json"]
                .as_str()
                .expect("custom_bootstrap.json")
                .to_string(),
        ));
    }
    // named apart: applying one install again must not replace the other's
    // (streaming's mounts the module the upstream role loads)
    for (file, name) in [
        (MANIFESTS[1], "adaptive-hedge"),
        (MANIFESTS[3], "adaptive-hedge-streaming"),
    ] {
        let docs = yaml_docs(file);
        let proxy = of_kind(&docs, "EnvoyProxy")[0];
        assert_eq!(str_at(proxy, "spec.bootstrap.type"), "Merge", "{file}");
        assert_eq!(str_at(proxy, "metadata.name"), name, "{file}");
        shipped.push((
            file.to_string(),
            str_at(proxy, "spec.bootstrap.value").to_string(),
        ));
    }
    assert_eq!(shipped.len(), 4, "two Istio namespaces, two EnvoyProxy");
    let baseline: Value = serde_norway::from_str(
        &std::fs::read_to_string(repo_root().join("envoy-configs/envoy-baseline.yaml")).unwrap(),
    )
    .unwrap();
    for (name, text) in shipped {
        let added: Value = serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(stats_tags(&added), expected, "{name}");
        let mut bootstrap = baseline.clone();
        bootstrap["stats_config"] = added["stats_config"].clone();
        envoy_validates("stats-tags", &serde_norway::to_string(&bootstrap).unwrap());
    }
}

/// The filter's metric names in `text`: each `adaptive_hedge_<name>` (not
/// Envoy's own `envoy_wasm_adaptive_hedge_*`), without the prefix.
fn metric_names_in(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("adaptive_hedge_") {
        let before = &rest[..at];
        let after = &rest[at + "adaptive_hedge_".len()..];
        let end = after
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(after.len());
        if !before.ends_with("envoy_wasm_") {
            names.push(after[..end].to_string());
        }
        rest = &after[end..];
    }
    names
}

/// The Grafana dashboard and the alert rules (`envoy-configs/monitoring/`)
/// read only metrics the filter exports, by the cluster label the shipped
/// installs set; the dashboard is a loadable Grafana dashboard (panels with
/// queries, a cluster variable). `make test-deploy` runs the rules through
/// promtool.
#[test]
fn dashboard_and_alerts_read_the_filter_s_metrics() {
    use adaptive_hedge::policy::{hold::HoldMetric, routes::RouteMetric, worker};
    use adaptive_hedge::telemetry::Metric;
    let exported: Vec<&str> = worker::ClusterMetric::ALL
        .iter()
        .map(|m| m.name())
        .chain(worker::WorkerMetric::ALL.iter().map(|m| m.name()))
        .chain(HoldMetric::ALL.iter().map(|m| m.name()))
        .chain(RouteMetric::ALL.iter().map(|m| m.name()))
        .collect();
    let dir = repo_root().join("envoy-configs/monitoring");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("dashboard.json")).unwrap())
            .expect("dashboard.json is JSON");
    assert_eq!(dashboard["uid"], "adaptive-hedge");
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    let cluster = variables
        .iter()
        .find(|v| v["name"] == "cluster")
        .expect("a cluster variable");
    assert!(cluster["definition"]
        .as_str()
        .is_some_and(|d| d.contains("envoy_cluster_name")));
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 6);
    let mut used = Vec::new();
    for panel in panels {
        let title = panel["title"].as_str().expect("a title");
        assert!(panel["gridPos"]["w"].as_u64().is_some(), "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}");
        for target in targets {
            let expr = target["expr"].as_str().expect("expr");
            assert!(target["refId"].is_string(), "{title}");
            if expr.contains("envoy_cluster_name") || expr.contains("$cluster") {
                assert!(!expr.contains("cluster=\""), "{title}: the old label");
            }
            used.extend(metric_names_in(expr));
        }
    }
    let alerts = yaml_docs("envoy-configs/monitoring/alerts.yaml");
    let rules = get(&alerts[0], "groups.0.rules")
        .as_sequence()
        .expect("rules");
    assert!(rules.len() >= 4);
    for rule in rules {
        let name = str_at(rule, "alert");
        assert!(!str_at(rule, "labels.severity").is_empty(), "{name}");
        assert!(!str_at(rule, "annotations.summary").is_empty(), "{name}");
        used.extend(metric_names_in(str_at(rule, "expr")));
    }
    for name in [
        "budget_exhausted_total",
        "hedges_won_total",
        "hedge_delay_clamped",
    ] {
        assert!(used.iter().any(|u| u == name), "{name} unused");
    }
    for name in &used {
        assert!(
            exported.contains(&name.as_str()),
            "adaptive_hedge_{name}: not a metric the filter exports"
        );
    }
}

/// The check above is the one that catches typos: a misspelt key or a bad
/// value in a manifest's plugin config fails, naming the field.
#[test]
fn a_typo_in_a_manifest_plugin_config_fails() {
    let docs = yaml_docs(MANIFESTS[0]);
    let mut config = get(of_kind(&docs, "WasmPlugin")[0], "spec.pluginConfig").clone();
    config["budget_percnt"] = Value::from(10);
    let json = serde_json::to_vec(&config).unwrap();
    let err = Config::parse(&json)
        .expect_err("a typo must fail")
        .to_string();
    assert!(err.contains("budget_percnt"), "{err}");

    let mut config = get(of_kind(&docs, "WasmPlugin")[0], "spec.pluginConfig").clone();
    config["percentile"] = Value::from(1.5);
    let err = Config::parse(&serde_json::to_vec(&config).unwrap())
        .expect_err("out of range must fail")
        .to_string();
    assert!(err.contains("percentile"), "{err}");
}

/// The streaming manifests: the downstream role in first-byte mode where the
/// platform's own API allows it, and the upstream role through the only door
/// each platform has to a cluster's filter chain (Istio EnvoyFilter on the
/// CLUSTER, Envoy Gateway EnvoyPatchPolicy). The cluster each patch produces
/// passes the config check and `envoy --mode validate` with the real wasm.
#[test]
fn streaming_manifests_add_the_upstream_role_and_envoy_accepts_it() {
    // the downstream role, in first-byte mode, through each platform's API
    for (manifest, kind, config) in [
        (MANIFESTS[2], "WasmPlugin", "spec.pluginConfig"),
        (MANIFESTS[3], "EnvoyExtensionPolicy", "spec.wasm.0.config"),
    ] {
        let docs = yaml_docs(manifest);
        let config = check_plugin_config(manifest, get(of_kind(&docs, kind)[0], config));
        assert_eq!(
            config.latency_signal,
            adaptive_hedge::policy::config::LatencySignal::FirstByte
        );
    }
    let istio = yaml_docs(MANIFESTS[2]);
    let filter = of_kind(&istio, "EnvoyFilter")[0];
    assert_eq!(str_at(filter, "spec.configPatches.0.applyTo"), "CLUSTER");
    assert_eq!(
        str_at(filter, "spec.configPatches.0.patch.operation"),
        "MERGE"
    );
    let istio_options = get(
        filter,
        "spec.configPatches.0.patch.value.typed_extension_protocol_options",
    )
    .clone();

    let gateway = yaml_docs(MANIFESTS[3]);
    let patch = of_kind(&gateway, "EnvoyPatchPolicy")[0];
    assert_eq!(str_at(patch, "spec.type"), "JSONPatch");
    assert_eq!(
        str_at(patch, "spec.jsonPatches.0.operation.path"),
        "/typed_extension_protocol_options"
    );
    let gateway_options = get(patch, "spec.jsonPatches.0.operation.value").clone();
    // the file the patch loads is the one the EnvoyProxy mounts
    let proxy = of_kind(&gateway, "EnvoyProxy")[0];
    let mount = str_at(
        proxy,
        "spec.provider.kubernetes.envoyDeployment.container.volumeMounts.0.mountPath",
    );
    assert!(serde_norway::to_string(&gateway_options)
        .unwrap()
        .contains(mount));

    for (name, options) in [("istio", istio_options), ("gateway", gateway_options)] {
        // The patch replaces the platform's whole HttpProtocolOptions (an
        // Istio MERGE does not merge inside an Any): it must select the
        // protocol itself, and Envoy must accept it as it is.
        let key = Value::from("envoy.extensions.upstreams.http.v3.HttpProtocolOptions");
        assert!(
            options[&key].get("explicit_http_config").is_some()
                || options[&key]
                    .get("use_downstream_protocol_config")
                    .is_some(),
            "{name}: the patch selects no protocol"
        );
        let mut bootstrap: Value = serde_norway::from_str(
            &std::fs::read_to_string(repo_root().join("envoy-configs/envoy-streaming.yaml"))
                .unwrap(),
        )
        .unwrap();
        bootstrap["static_resources"]["clusters"][0]["typed_extension_protocol_options"] = options;
        let text = serde_norway::to_string(&bootstrap)
            .unwrap()
            .replace(
                "filename: build/",
                "filename: /var/local/lib/adaptive-hedge/",
            )
            .replace(
                "/var/local/lib/adaptive-hedge/adaptive_hedge.wasm",
                &envoy::wasm_path().display().to_string(),
            );
        let report = integration_tests::tools::config_check::check(&text);
        assert!(
            report.problems.is_empty() && report.upstream == 1,
            "{name}: {report:?}"
        );
        envoy_validates(&format!("{name}-streaming"), &text);
    }
}

// Istio: one adaptive-hedge plugin per proxy, and what targetRefs attach
// (issue 18, items 5 and 6).

/// Istio's root namespace as installed: a policy there reaches every
/// namespace.
const ISTIO_ROOT_NAMESPACE: &str = "istio-system";
/// The label of the pods of a Gateway API gateway (a waypoint too): its name.
const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
const WAYPOINT_CLASS: &str = "istio-waypoint";

type Labels = std::collections::BTreeMap<String, String>;
/// The Gateway API gateways shipped: (namespace, name) -> (class, the labels
/// Istio gives their pods).
type Gateways = std::collections::HashMap<(String, String), (String, Labels)>;

/// Every document of every Istio manifest, with its file: all of
/// `envoy-configs/istio/*.yaml` (but the kustomize base, which lists them),
/// so a new file is checked unlisted.
fn istio_documents() -> Vec<(String, Value)> {
    let dir = repo_root().join("envoy-configs/istio");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("envoy-configs/istio")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".yaml") && name != "kustomization.yaml")
        .map(|name| format!("envoy-configs/istio/{name}"))
        .collect();
    files.sort();
    files
        .into_iter()
        .flat_map(|file| yaml_docs(&file).into_iter().map(move |d| (file.clone(), d)))
        .collect()
}

fn kind_of(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

/// `file: Kind namespace/name`, for messages.
fn named(file: &str, doc: &Value) -> String {
    format!(
        "{file}: {} {}/{}",
        kind_of(doc),
        str_at(doc, "metadata.namespace"),
        str_at(doc, "metadata.name")
    )
}

fn labels_of(map: &Value) -> Labels {
    map.as_mapping()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let text = |x: &Value| x.as_str().expect("a label is a string").to_string();
            (text(k), text(v))
        })
        .collect()
}

/// Istio's Gateway API gateways (not its own `Gateway` kind, which has no
/// pods of its own).
fn shipped_gateways(docs: &[(String, Value)]) -> Gateways {
    docs.iter()
        .map(|(_, d)| d)
        .filter(|d| {
            kind_of(d) == "Gateway"
                && str_at(d, "apiVersion").starts_with("gateway.networking.k8s.io/")
        })
        .map(|d| {
            let name = str_at(d, "metadata.name").to_string();
            let mut pods = labels_of(&d["spec"]["infrastructure"]["labels"]);
            pods.insert(GATEWAY_NAME_LABEL.into(), name.clone());
            let key = (str_at(d, "metadata.namespace").to_string(), name);
            (key, (str_at(d, "spec.gatewayClassName").to_string(), pods))
        })
        .collect()
}

/// The proxies an Istio policy (`WasmPlugin`, `EnvoyFilter`) goes to, as
/// Istio reads it.
#[derive(Clone, Debug, PartialEq)]
enum Attachment {
    /// Pods whose labels include these (none: every pod), in the policy's
    /// namespace, or in every namespace from the root namespace.
    Selector { namespace: String, labels: Labels },
    /// `targetRefs` as (kind, name), in the policy's namespace.
    Targets {
        namespace: String,
        refs: Vec<(String, String)>,
    },
}

fn attachment(policy: &Value) -> Attachment {
    let namespace = str_at(policy, "metadata.namespace").to_string();
    let spec = &policy["spec"];
    if let Some(refs) = spec["targetRefs"].as_sequence() {
        let refs = refs
            .iter()
            .map(|r| (str_at(r, "kind").to_string(), str_at(r, "name").to_string()))
            .collect();
        return Attachment::Targets { namespace, refs };
    }
    let labels = match spec.get("selector") {
        Some(selector) => labels_of(&selector["matchLabels"]),
        None => labels_of(&spec["workloadSelector"]["labels"]),
    };
    Attachment::Selector { namespace, labels }
}

/// Whether Istio could put both on one proxy. Labels count as meeting
/// unless one key asks for two values: a pod may carry any other label.
fn may_share_a_proxy(a: &Attachment, b: &Attachment, gateways: &Gateways) -> bool {
    use Attachment::{Selector, Targets};
    let reaches = |from: &str, to: &str| from == to || from == ISTIO_ROOT_NAMESPACE;
    let is_waypoint = |namespace: &str, (kind, name): &(String, String)| match kind.as_str() {
        // a Service or ServiceEntry target applies on its waypoint only
        "Service" | "ServiceEntry" | "GatewayClass" => true,
        "Gateway" => gateways
            .get(&(namespace.to_string(), name.clone()))
            .is_some_and(|(class, _)| class == WAYPOINT_CLASS),
        _ => false,
    };
    match (a, b) {
        (
            Selector {
                namespace: na,
                labels: la,
            },
            Selector {
                namespace: nb,
                labels: lb,
            },
        ) => {
            (reaches(na, nb) || reaches(nb, na))
                && la.iter().all(|(k, v)| lb.get(k).is_none_or(|w| w == v))
        }
        (
            Targets {
                namespace: na,
                refs: ra,
            },
            Targets {
                namespace: nb,
                refs: rb,
            },
        ) => ra.iter().any(|x| {
            rb.iter().any(|y| {
                let (wx, wy) = (is_waypoint(na, x), is_waypoint(nb, y));
                if x.0 == "GatewayClass" || y.0 == "GatewayClass" {
                    // every waypoint of the mesh
                    return wx && wy;
                }
                // a waypoint Gateway meets the Services it serves
                na == nb && (x == y || (wx && wy && (x.0 == "Gateway") != (y.0 == "Gateway")))
            })
        }),
        (
            Selector { namespace, labels },
            Targets {
                namespace: nt,
                refs,
            },
        )
        | (
            Targets {
                namespace: nt,
                refs,
            },
            Selector { namespace, labels },
        ) => {
            // Istio applies selector policies to a Gateway API gateway too
            // (not to a waypoint): by its pods' labels.
            refs.iter().any(|r| {
                r.0 == "Gateway"
                    && !is_waypoint(nt, r)
                    && reaches(namespace, nt)
                    && gateways
                        .get(&(nt.clone(), r.1.clone()))
                        .is_none_or(|(_, pods)| labels.iter().all(|(k, v)| pods.get(k) == Some(v)))
            })
        }
    }
}

fn is_our_plugin(doc: &Value) -> bool {
    kind_of(doc) == "WasmPlugin" && doc["spec"]["pluginName"].as_str() == Some("adaptive_hedge")
}

/// Each pair of shipped adaptive-hedge plugins Istio could put on one proxy.
fn plugins_sharing_a_proxy(docs: &[(String, Value)]) -> Vec<String> {
    let gateways = shipped_gateways(docs);
    let plugins: Vec<(String, Attachment)> = docs
        .iter()
        .filter(|(_, d)| is_our_plugin(d))
        .map(|(file, d)| (named(file, d), attachment(d)))
        .collect();
    let mut shared = Vec::new();
    for (i, (a, at)) in plugins.iter().enumerate() {
        for (b, bt) in &plugins[i + 1..] {
            if may_share_a_proxy(at, bt, &gateways) {
                shared.push(format!("{a} and {b}"));
            }
        }
    }
    shared
}

/// Two adaptive-hedge plugins on one proxy run as two filters in one
/// chain: the second takes the first's hedge headers for a client's and
/// removes or overwrites them (docs/deployment.md#istio). The shipped
/// plugins can never select the same proxy: those chosen by labels each
/// require their own value of the label `adaptive-hedge`, the others name
/// a gateway or waypoint no selector reaches. The patches each plugin needs
/// go to exactly its proxies.
#[test]
fn istio_plugins_never_share_a_proxy() {
    let docs = istio_documents();
    let plugins: Vec<&Value> = docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| is_our_plugin(d))
        .collect();
    assert!(
        plugins.len() >= 5,
        "gateway, sidecars, streaming, targetRefs, waypoint"
    );
    let shared = plugins_sharing_a_proxy(&docs);
    assert!(
        shared.is_empty(),
        "adaptive-hedge twice in one proxy: {shared:?}"
    );

    // The label scheme: one key, a value per plugin.
    let mut values = Vec::new();
    for plugin in &plugins {
        if let Attachment::Selector { labels, .. } = attachment(plugin) {
            let value = labels.get("adaptive-hedge").cloned();
            assert!(
                value.is_some(),
                "{plugin:?}: selects no adaptive-hedge label"
            );
            assert!(!values.contains(&value), "{value:?} selects two plugins");
            values.push(value);
        }
    }

    // The check catches what this replaced: the sidecar plugin
    // namespace-wide (no selector) beside the streaming one...
    let mut widened = docs.clone();
    for (_, doc) in &mut widened {
        if is_our_plugin(doc)
            && str_at(doc, "metadata.namespace") == "default"
            && str_at(doc, "metadata.name") == "adaptive-hedge"
        {
            doc["spec"].as_mapping_mut().unwrap().remove("selector");
        }
    }
    let shared = plugins_sharing_a_proxy(&widened);
    assert!(
        shared
            .iter()
            .any(|s| s.contains("default/adaptive-hedge-streaming")),
        "{shared:?}"
    );
    // ...and a selector plugin in a targeted gateway's namespace.
    let mut crowded = docs.clone();
    for (_, doc) in &mut crowded {
        if is_our_plugin(doc) && str_at(doc, "metadata.name") == "adaptive-hedge-streaming" {
            doc["metadata"]["namespace"] = Value::from("istio-ingress");
            doc["spec"].as_mapping_mut().unwrap().remove("selector");
        }
    }
    assert!(!plugins_sharing_a_proxy(&crowded).is_empty());

    // Each patch goes to the proxies of one plugin of its namespace: no
    // proxy gets the back-off, host choice or upstream role without it.
    for (file, patch) in &docs {
        if kind_of(patch) != "EnvoyFilter" {
            continue;
        }
        let at = attachment(patch);
        assert!(
            plugins.iter().any(|p| attachment(p) == at),
            "{}: not on the proxies of a plugin ({at:?})",
            named(file, patch)
        );
    }
}

/// The targetRefs examples (`targetrefs.yaml`: a Gateway API gateway;
/// `ambient.yaml`: a waypoint) as Istio's API allows them, and every Istio
/// plugin checked alike: the plugin config through the filter's own
/// validation, the image `wasmplugin.yaml` pins, fail open, last before the
/// router.
#[test]
fn istio_target_refs_attach_as_istio_allows() {
    let docs = istio_documents();
    let gateways = shipped_gateways(&docs);
    let pinned = docs
        .iter()
        .find(|(f, d)| f.as_str() == MANIFESTS[0] && is_our_plugin(d))
        .map(|(_, d)| d.clone())
        .expect("wasmplugin.yaml's plugins");
    let (mut targeted, mut on_waypoints) = (0, 0);
    for (file, doc) in &docs {
        let kind = kind_of(doc);
        let at = named(file, doc);
        let spec = &doc["spec"];
        if kind == "WasmPlugin" {
            assert_eq!(
                str_at(doc, "apiVersion"),
                "extensions.istio.io/v1alpha1",
                "{at}"
            );
            for field in ["url", "sha256"] {
                assert_eq!(spec[field], pinned["spec"][field], "{at}: {field}");
            }
            assert_eq!(str_at(spec, "failStrategy"), "FAIL_OPEN", "{at}");
            assert_eq!(str_at(spec, "pluginName"), "adaptive_hedge", "{at}");
            assert_eq!(str_at(spec, "phase"), "UNSPECIFIED_PHASE", "{at}");
            let config = check_plugin_config(&at, &spec["pluginConfig"]);
            // Istio's default route retry policy makes 2 retries.
            assert_eq!(config.defaults.route_retries, 2, "{at}");
        }
        if !["WasmPlugin", "EnvoyFilter"].contains(&kind) {
            continue;
        }
        assert!(
            spec.get("targetRef").is_none(),
            "{at}: targetRef is deprecated: targetRefs"
        );
        let Some(refs) = spec["targetRefs"].as_sequence() else {
            continue;
        };
        targeted += 1;
        for selector in ["selector", "workloadSelector"] {
            assert!(
                spec.get(selector).is_none(),
                "{at}: {selector} and targetRefs: Istio refuses both"
            );
        }
        assert!((1..=16).contains(&refs.len()), "{at}");
        let namespace = str_at(doc, "metadata.namespace");
        let mut waypoint = false;
        for r in refs {
            let (group, target) = (r["group"].as_str().unwrap_or_default(), str_at(r, "name"));
            assert!(
                r.get("namespace").is_none_or(|n| n.as_str() == Some("")),
                "{at}: Istio refuses a target in another namespace"
            );
            let waypoint_here = gateways
                .iter()
                .any(|((ns, _), (class, _))| ns == namespace && class == WAYPOINT_CLASS);
            match (group, str_at(r, "kind")) {
                ("gateway.networking.k8s.io", "Gateway") => {
                    let (class, _) = gateways
                        .get(&(namespace.to_string(), target.to_string()))
                        .unwrap_or_else(|| {
                            panic!("{at}: no Gateway {target} shipped in {namespace}")
                        });
                    waypoint |= class == WAYPOINT_CLASS;
                }
                ("gateway.networking.k8s.io", "GatewayClass") => {
                    assert_eq!(
                        (namespace, target),
                        (ISTIO_ROOT_NAMESPACE, WAYPOINT_CLASS),
                        "{at}"
                    );
                    waypoint = true;
                }
                ("" | "core", "Service") | ("networking.istio.io", "ServiceEntry") => {
                    assert!(
                        waypoint_here,
                        "{at}: {target} is a target on waypoints only; {namespace} has none"
                    );
                    waypoint = true;
                }
                (group, kind) => panic!("{at}: Istio attaches nothing to {group}/{kind}"),
            }
        }
        if kind != "WasmPlugin" {
            continue;
        }
        // A waypoint's chain counts as inbound (SERVER), a gateway's as
        // outbound (CLIENT): a `match` must let the proxy's through.
        let modes: Vec<&str> = spec["match"]
            .as_sequence()
            .into_iter()
            .flatten()
            .map(|m| m["mode"].as_str().unwrap_or("UNDEFINED"))
            .collect();
        let wanted = if waypoint { "SERVER" } else { "CLIENT" };
        assert!(
            modes.is_empty()
                || modes
                    .iter()
                    .any(|m| [wanted, "CLIENT_AND_SERVER", "UNDEFINED"].contains(m)),
            "{at}: match {modes:?} never applies on this proxy"
        );
        if waypoint {
            on_waypoints += 1;
            // no override_host on a waypoint's clusters (no EnvoyFilter
            // reaches them)
            let config = check_plugin_config(&at, &spec["pluginConfig"]);
            assert!(
                !config.chooses_hosts(),
                "{at}: host_choice without override_host"
            );
            // a route of its own: Istio's retry policy, to other hosts
            for (kind, service) in refs.iter().map(|r| (str_at(r, "kind"), str_at(r, "name"))) {
                if kind != "Service" {
                    continue;
                }
                let route = docs
                    .iter()
                    .map(|(_, d)| d)
                    .find(|d| {
                        kind_of(d) == "HTTPRoute"
                            && str_at(d, "metadata.namespace") == namespace
                            && d["spec"]["parentRefs"].as_sequence().is_some_and(|p| {
                                p.iter().any(|p| {
                                    p["kind"].as_str() == Some("Service")
                                        && p["name"].as_str() == Some(service)
                                })
                            })
                    })
                    .unwrap_or_else(|| panic!("{at}: no HTTPRoute for the Service {service}"));
                for rule in route["spec"]["rules"].as_sequence().expect("rules") {
                    assert!(
                        rule["retry"]["attempts"].as_u64().is_none_or(|n| n == 2),
                        "{at}: the route's retries are route_retries"
                    );
                }
            }
        }
    }
    assert!(
        targeted >= 3,
        "the Gateway API gateway's plugin and patches"
    );
    assert!(on_waypoints >= 1, "a waypoint example");

    // The Gateway API gateway's host-choice patch is the sidecars' (which
    // Envoy accepts: istio_manifests_configure_the_filter_...).
    let policies: Vec<&Value> = docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| {
            kind_of(d) == "EnvoyFilter"
                && str_at(d, "metadata.name") == "adaptive-hedge-host-choice"
        })
        .map(|d| get(d, "spec.configPatches.0.patch.value.load_balancing_policy"))
        .collect();
    assert!(policies.len() >= 2 && policies.windows(2).all(|w| w[0] == w[1]));
}

/// `make oci-pin` rewrites the plugin image's digest in the files the
/// Makefile's DIGEST_MANIFESTS lists: every file under envoy-configs/ that
/// quotes it is listed (or it would go stale), and a listed file quotes no
/// other digest (the pin would overwrite it).
#[test]
fn make_oci_pin_reaches_every_file_quoting_the_digest() {
    let root = repo_root();
    let makefile = std::fs::read_to_string(root.join("Makefile")).expect("Makefile");
    let mut listed = Vec::new();
    let lines = makefile
        .lines()
        .skip_while(|l| !l.starts_with("DIGEST_MANIFESTS :="));
    // the line and its continuations
    for line in lines {
        let line = line.trim_start_matches("DIGEST_MANIFESTS :=");
        listed.extend(
            line.split_whitespace()
                .filter(|w| *w != "\\")
                .map(str::to_string),
        );
        if !line.trim_end().ends_with('\\') {
            break;
        }
    }
    for manifest in MANIFESTS {
        assert!(
            listed.iter().any(|l| l == manifest),
            "{manifest} not in DIGEST_MANIFESTS"
        );
    }
    let pinned = str_at(
        of_kind(&yaml_docs(MANIFESTS[0]), "WasmPlugin")[0],
        "spec.sha256",
    )
    .to_string();
    // every `sha256:<64 hex>` quoted in a text
    let digests = |text: &str| -> Vec<String> {
        text.match_indices("sha256:")
            .filter_map(|(i, m)| {
                let rest = text[i + m.len()..]
                    .trim_start_matches([' ', '"'])
                    .as_bytes();
                let hex = rest.get(..64)?;
                hex.iter()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
                    .then(|| String::from_utf8_lossy(hex).into_owned())
            })
            .collect()
    };
    let mut dirs = vec![root.join("envoy-configs")];
    let mut quoting = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("envoy-configs") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if let Ok(text) = std::fs::read_to_string(&path) {
                if digests(&text).contains(&pinned) {
                    let relative = path.strip_prefix(&root).unwrap().display().to_string();
                    quoting.push(relative);
                }
            }
        }
    }
    assert!(quoting.len() >= 6, "{quoting:?}");
    for file in &quoting {
        assert!(
            listed.contains(file),
            "{file} quotes the digest; add it to DIGEST_MANIFESTS"
        );
    }
    for file in &listed {
        let text =
            std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let found = digests(&text);
        assert!(
            !found.is_empty() && found.iter().all(|d| *d == pinned),
            "{file}: digests {found:?}, `make oci-pin` rewrites every one"
        );
    }
}

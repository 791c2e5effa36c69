//! Where users run the filter: the docker-compose demo, the OCI image, the
//! Istio and Envoy Gateway manifests. No Docker engine or Kubernetes here,
//! so each is checked as far as the tools `make test` installs allow: compose
//! by its file and by running its services natively, the Envoy configs by
//! `envoy --mode validate`, the image by its layout and digests, the
//! manifests' plugin configs by the filter's own validation. What needs
//! docker-compose, skopeo, umoci or func-e is in `deploy_tools.rs`
//! (`make test-deploy`).

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use adaptive_hedge::policy::config::Config;
use common::deploy::{
    blob, build_image, get, of_kind, run, sha256_hex, str_at, yaml_docs, ENVOY_VERSION, IMAGE_TAG,
    MANIFESTS,
};
use integration_tests::harness::envoy::{self, repo_root, Envoy, EnvoyOptions};
use serde_norway::Value;

/// A manifest's plugin config through the filter's own validation: what
/// Envoy would refuse fails here, naming the field.
fn check_plugin_config(where_: &str, config: &Value) -> Config {
    let json = serde_json::to_vec(config).unwrap_or_else(|e| panic!("{where_}: {e}"));
    Config::parse(&json).unwrap_or_else(|e| panic!("{where_}: {e}"))
}

#[test]
fn compose_file_runs_the_demo_and_everything_it_mounts_exists() {
    let root = repo_root();

    let doc = &yaml_docs("docker-compose.yml")[0];
    let services = doc["services"].as_mapping().expect("services");
    let names: Vec<&str> = services.keys().filter_map(Value::as_str).collect();
    for name in ["envoy", "sim-1", "sim-2", "sim-3", "load"] {
        assert!(names.contains(&name), "service {name} missing: {names:?}");
    }
    // Envoy: the image of the version the tests run, admin published.
    let envoy = &doc["services"]["envoy"];
    assert_eq!(
        str_at(envoy, "image"),
        format!("envoyproxy/envoy:v{ENVOY_VERSION}")
    );
    let ports: Vec<&str> = envoy["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        ports.contains(&"9901:9901") && ports.contains(&"10000:10000"),
        "{ports:?}"
    );
    // Every file mounted exists (the wasm after `make build`).
    let mut mounted = Vec::new();
    for (name, service) in services {
        for volume in service["volumes"].as_sequence().into_iter().flatten() {
            let spec = volume.as_str().expect("short volume syntax");
            let (source, target) = spec.split_once(':').expect("source:target");
            let target = target.split(':').next().unwrap_or_default();
            let path = root.join(source);
            assert!(
                path.exists(),
                "{name:?} mounts {source}, which does not exist (make build?)"
            );
            mounted.push((target.to_string(), path));
        }
        if let Some(dockerfile) = service["build"]["dockerfile"].as_str() {
            let path = root.join(dockerfile);
            let text = std::fs::read_to_string(&path).expect("Dockerfile");
            for bin in ["sim", "load"] {
                assert!(
                    text.contains(&format!("--bin {bin}")),
                    "{dockerfile} builds {bin}"
                );
                assert!(root
                    .join(format!("integration-tests/src/bin/{bin}.rs"))
                    .exists());
            }
        }
    }
    // The Envoy config it mounts passes `envoy --mode validate`, with the
    // wasm it mounts, and routes to the three sim services.
    let config = mounted
        .iter()
        .find(|(t, _)| t == "/etc/envoy/envoy.yaml")
        .map(|(_, p)| p.clone())
        .expect("envoy.yaml mounted");
    assert_eq!(config, root.join("envoy-configs/docker/envoy.yaml"));
    let wasm = mounted
        .iter()
        .find(|(t, _)| t == "/etc/envoy/adaptive_hedge.wasm")
        .map(|(_, p)| p.clone())
        .expect("wasm mounted");
    let text = std::fs::read_to_string(&config).expect("config");
    for sim in ["sim-1", "sim-2", "sim-3"] {
        assert!(
            text.contains(&format!("address: {sim}, port_value: 8080")),
            "{sim}"
        );
    }
    let (ok, output) = Envoy::validate(EnvoyOptions::new("docker/envoy.yaml", &[]).edit(
        "/etc/envoy/adaptive_hedge.wasm",
        &wasm.display().to_string(),
    ))
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
    let ports: Vec<u16> = (0..3).map(|_| envoy::free_port()).collect();
    let mut sim = Command::new(env!("CARGO_BIN_EXE_sim"));
    for p in &ports {
        sim.args(["--listen", &format!("127.0.0.1:{p}")]);
    }
    let sim = ChildGuard(
        sim.args(["--model", "reference"])
            .stdout(Stdio::null())
            .spawn()
            .expect("sim"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while ports
        .iter()
        .any(|p| std::net::TcpStream::connect(("127.0.0.1", *p)).is_err())
    {
        assert!(Instant::now() < deadline, "sim did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
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
    envoy.assert_no_vm_failure();
    drop(sim);
}

struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // SAFETY: signalling our own child by its pid.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let _ = self.0.wait();
    }
}

#[test]
fn oci_image_is_compat_format_and_manifests_quote_its_digest() {
    let dir = std::env::temp_dir().join(format!("adaptive-hedge-oci-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
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
            format!("oci://ghcr.io/adaptive-hedge/adaptive-hedge:{IMAGE_TAG}")
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
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&again);
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
    assert_eq!(
        get(
            rule,
            "spec.trafficPolicy.outlierDetection.consecutiveLocalOriginFailures"
        )
        .as_u64(),
        Some(10)
    );
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
    for file in [MANIFESTS[1], MANIFESTS[3]] {
        let docs = yaml_docs(file);
        let proxy = of_kind(&docs, "EnvoyProxy")[0];
        assert_eq!(str_at(proxy, "spec.bootstrap.type"), "Merge", "{file}");
        assert_eq!(str_at(proxy, "metadata.name"), "adaptive-hedge", "{file}");
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

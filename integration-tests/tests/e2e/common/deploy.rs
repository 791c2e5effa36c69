//! What the deploy checks share: the manifests, YAML access, the OCI image.

use std::path::Path;
use std::process::Command;

use integration_tests::harness::envoy::{self, repo_root};
use serde::Deserialize;
use serde_norway::Value;
use sha2::{Digest, Sha256};

pub const ENVOY_VERSION: &str = "1.40.0";
pub const IMAGE_TAG: &str = env!("CARGO_PKG_VERSION");
/// The manifests that quote the image digest.
pub const MANIFESTS: [&str; 4] = [
    "envoy-configs/istio/wasmplugin.yaml",
    "envoy-configs/gateway/adaptive-hedge.yaml",
    "envoy-configs/istio/streaming.yaml",
    "envoy-configs/gateway/streaming.yaml",
];

pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

pub fn yaml_docs(relative: &str) -> Vec<Value> {
    let path = repo_root().join(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{relative}: {e}"));
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{relative}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

pub fn get<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.')
        .fold(v, |v, key| match key.parse::<usize>() {
            Ok(i) => &v[i],
            Err(_) => &v[key],
        })
}

pub fn str_at<'a>(v: &'a Value, path: &str) -> &'a str {
    get(v, path)
        .as_str()
        .unwrap_or_else(|| panic!("{path}: not a string in {v:?}"))
}

pub fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn build_image(dir: &Path) -> String {
    build_image_of(&envoy::wasm_path(), dir)
}

/// The plugin image of `wasm`, written to `dir`; its manifest digest.
pub fn build_image_of(wasm: &Path, dir: &Path) -> String {
    let out = run(Command::new("python3")
        .current_dir(repo_root())
        .arg("tools/oci_image.py")
        .arg("build")
        .arg(wasm)
        .arg(dir)
        .arg(IMAGE_TAG));
    out.trim().to_string()
}

pub fn blob(dir: &Path, digest: &str) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    let bytes = std::fs::read(dir.join("blobs/sha256").join(hex)).expect("blob");
    assert_eq!(sha256_hex(&bytes), hex, "blob {digest} is corrupt");
    bytes
}

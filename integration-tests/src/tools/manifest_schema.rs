//! Kubernetes manifests (Istio, Envoy Gateway, Gateway API) checked against
//! the OpenAPI v3 schemas of their CustomResourceDefinitions, as the API
//! server checks them at `kubectl apply`, with one difference that matters
//! most: a field the schema does not know is always an error here. The API
//! server prunes unknown fields, and refuses them only when the client asks
//! for strict field validation (recent kubectl does by default, not every
//! deploy tool does): a misspelt `failStratgy` can apply as if it were not
//! there.
//!
//! `make crds` copies the CRDs, at the versions pinned in the Makefile, into
//! `build/crds`; `make check-configs` passes that folder to the
//! `check-configs` binary (`--crds DIR`). Without `--crds` the binary checks
//! only what [`config_check`](super::config_check) checks and says so.
//!
//! Checked: the version of the CRD that matches the document's `apiVersion`
//! (which must exist and be served; a deprecated one is a warning), types,
//! enums, patterns, lengths and bounds, `required`, `oneOf`/`anyOf`/`not`,
//! unknown fields at every level whose schema lists its fields (not inside
//! `x-kubernetes-preserve-unknown-fields`, e.g. a `WasmPlugin`'s
//! `pluginConfig` or an `EnvoyFilter` patch value, which the other checks
//! and `envoy --mode validate` read), `x-kubernetes-int-or-string`,
//! `nullable`, and `metadata` as an ObjectMeta. Not checked: the CEL rules
//! (`x-kubernetes-validations`), `format`, list uniqueness
//! (`x-kubernetes-list-type`), defaults. Core kinds have no CRD: `ConfigMap`
//! and `Namespace` get a minimal schema here (their top-level fields;
//! `data` a map of strings); any other kind without a CRD is an error.
//! Kustomize's own files and the objects it never emits (annotated
//! `config.kubernetes.io/local-config: "true"`) are skipped.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::config_check::Report;

/// The CRDs loaded, and the validators compiled from them so far.
pub struct Schemas {
    /// (group, kind) -> the CRD's versions.
    crds: HashMap<(String, String), Vec<CrdVersion>>,
    /// (group, version, kind) -> compiled, on first use.
    validators: HashMap<(String, String, String), Compiled>,
}

struct CrdVersion {
    name: String,
    served: bool,
    deprecated: Option<String>,
    schema: Value,
}

struct Compiled {
    /// The schema as JSON Schema (for the hints that read it back).
    schema: Value,
    /// The CRD's deprecation warning for this version.
    deprecated: Option<String>,
    validator: jsonschema::Validator,
}

impl Schemas {
    /// Every `CustomResourceDefinition` in the `.yaml` files under `dir`.
    pub fn load(dir: &Path) -> Result<Self, String> {
        let mut files = Vec::new();
        collect_yaml(dir, &mut files)
            .map_err(|e| format!("{}: {e} (make crds fetches the CRDs)", dir.display()))?;
        files.sort();
        let mut texts = Vec::new();
        for file in &files {
            let text =
                std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
            texts.push((file.display().to_string(), text));
        }
        let schemas = Self::from_texts(texts.iter().map(|(f, t)| (f.as_str(), t.as_str())))?;
        if schemas.crds.is_empty() {
            return Err(format!(
                "{}: no CustomResourceDefinition found (make crds fetches them)",
                dir.display()
            ));
        }
        Ok(schemas)
    }

    /// The CRDs in YAML texts, each named by `(name, text)` in errors.
    pub fn from_texts<'a>(
        texts: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, String> {
        let mut crds: HashMap<(String, String), Vec<CrdVersion>> = HashMap::new();
        for (name, text) in texts {
            for (n, document) in serde_norway::Deserializer::from_str(text).enumerate() {
                let value = serde_norway::Value::deserialize(document)
                    .map_err(|e| format!("{name}: document {}: {e}", n + 1))?;
                if value.get("kind").and_then(|k| k.as_str()) != Some("CustomResourceDefinition") {
                    continue;
                }
                let value: Value = serde_json::to_value(&value)
                    .map_err(|e| format!("{name}: document {}: {e}", n + 1))?;
                let spec = &value["spec"];
                let (Some(group), Some(kind)) =
                    (spec["group"].as_str(), spec["names"]["kind"].as_str())
                else {
                    return Err(format!(
                        "{name}: document {}: a CRD without group or kind",
                        n + 1
                    ));
                };
                let versions = spec["versions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|v| CrdVersion {
                        name: v["name"].as_str().unwrap_or_default().to_string(),
                        served: v["served"].as_bool().unwrap_or(false),
                        deprecated: v["deprecated"].as_bool().unwrap_or(false).then(|| {
                            v["deprecationWarning"]
                                .as_str()
                                .unwrap_or("deprecated")
                                .to_string()
                        }),
                        schema: v["schema"]["openAPIV3Schema"].clone(),
                    })
                    .collect();
                crds.insert((group.to_string(), kind.to_string()), versions);
            }
        }
        Ok(Self {
            crds,
            validators: HashMap::new(),
        })
    }

    /// How many kinds have a CRD here.
    pub fn kinds(&self) -> usize {
        self.crds.len()
    }

    /// Checks every document in `text` that is a Kubernetes object (has a
    /// `kind`, or a Kubernetes-shaped `apiVersion`); others (Envoy
    /// bootstrap, Prometheus rules) are not this check's, nor are
    /// kustomize's own files and the objects it never emits.
    pub fn check(&mut self, text: &str) -> Checked {
        let mut report = Report::default();
        let (mut valid, mut local) = (0, 0);
        for (n, document) in serde_norway::Deserializer::from_str(text).enumerate() {
            let Ok(value) = serde_norway::Value::deserialize(document) else {
                continue; // config_check reports it
            };
            let Ok(value) = serde_json::to_value(&value) else {
                report
                    .problems
                    .push(format!("document {}: not representable as JSON", n + 1));
                continue;
            };
            let Some(object) = value.as_object() else {
                continue;
            };
            if !is_kubernetes_object(object) {
                continue;
            }
            if is_local(&value) {
                local += 1;
                continue;
            }
            let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
            let name = value
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let label = format!("document {} ({kind} {name})", n + 1);
            let before = report.problems.len();
            self.check_object(&value, &label, &mut report);
            if report.problems.len() == before {
                valid += 1;
            }
        }
        Checked {
            report,
            valid,
            local,
        }
    }

    fn check_object(&mut self, value: &Value, label: &str, report: &mut Report) {
        let (Some(api_version), Some(kind)) = (
            value.get("apiVersion").and_then(Value::as_str),
            value.get("kind").and_then(Value::as_str),
        ) else {
            report.problems.push(format!(
                "{label}: a Kubernetes object needs both apiVersion and kind"
            ));
            return;
        };
        let metadata = value.get("metadata");
        let named = ["name", "generateName"].iter().any(|k| {
            metadata
                .and_then(|m| m.get(k))
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
        });
        if !named {
            report.problems.push(format!(
                "{label}: metadata.name: missing (the API server refuses an object without a name)"
            ));
        }
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let key = (group.to_string(), version.to_string(), kind.to_string());
        if !self.validators.contains_key(&key) {
            let (schema, deprecated) = if group.is_empty() {
                match core_schema(kind, version) {
                    Some(s) => (s, None),
                    None => {
                        report.problems.push(format!(
                            "{label}: no schema known for the core kind {api_version} {kind} (known here: v1 ConfigMap, v1 Namespace)"
                        ));
                        return;
                    }
                }
            } else {
                let Some(versions) = self.crds.get(&(group.to_string(), kind.to_string())) else {
                    report.problems.push(format!(
                        "{label}: no CRD known for {kind} in the group {group} (a misspelt kind or group, or a CRD the pinned versions do not have: make crds)"
                    ));
                    return;
                };
                let Some(v) = versions.iter().find(|v| v.name == version) else {
                    let names: Vec<&str> = versions.iter().map(|v| v.name.as_str()).collect();
                    report.problems.push(format!(
                        "{label}: apiVersion {api_version}: the {kind} CRD has no version {version} (it has {})",
                        names.join(", ")
                    ));
                    return;
                };
                if !v.served {
                    report.problems.push(format!(
                        "{label}: apiVersion {api_version}: the {kind} CRD does not serve {version}"
                    ));
                    return;
                }
                (to_json_schema(&v.schema), v.deprecated.clone())
            };
            let validator = match jsonschema::draft4::options()
                .should_validate_formats(false)
                .build(&schema)
            {
                Ok(v) => v,
                Err(e) => {
                    report.problems.push(format!(
                        "{label}: the schema of {api_version} {kind} does not compile: {e}"
                    ));
                    return;
                }
            };
            let compiled = Compiled {
                schema,
                deprecated,
                validator,
            };
            self.validators.insert(key.clone(), compiled);
        }
        let compiled = &self.validators[&key];
        if let Some(warning) = &compiled.deprecated {
            report
                .warnings
                .push(format!("{label}: apiVersion {api_version}: {warning}"));
        }
        for error in compiled.validator.iter_errors(value) {
            let path = json_path(error.instance_path().iter());
            match error.kind() {
                jsonschema::error::ValidationErrorKind::AdditionalProperties { unexpected } => {
                    for field in unexpected {
                        report.problems.push(format!(
                            "{label}: {}: unknown field (not in the {kind} {version} schema: pruned on apply unless the client asks for strict field validation)",
                            join_path(&path, field)
                        ));
                    }
                }
                // `additionalProperties: false` where no field is listed:
                // the error names only the first field of the object
                jsonschema::error::ValidationErrorKind::FalseSchema
                    if error
                        .schema_path()
                        .as_str()
                        .ends_with("/additionalProperties") =>
                {
                    let fields = value
                        .pointer(error.instance_path().as_str())
                        .and_then(Value::as_object)
                        .map(|o| o.keys().cloned().collect::<Vec<_>>())
                        .unwrap_or_default();
                    for field in fields {
                        report.problems.push(format!(
                            "{label}: {}: unknown field (the {kind} {version} schema lists no field here: pruned on apply unless the client asks for strict field validation)",
                            join_path(&path, &field)
                        ));
                    }
                }
                jsonschema::error::ValidationErrorKind::Enum { options } => {
                    let options: Vec<String> = options
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|o| o.to_string())
                        .collect();
                    report.problems.push(format!(
                        "{label}: {path}: {} is not one of {}",
                        error.instance(),
                        options.join(", ")
                    ));
                }
                kind_ => {
                    let scalar = !error.instance().is_object() && !error.instance().is_array();
                    let mut message = if scalar {
                        error.to_string()
                    } else {
                        error.masked().to_string()
                    };
                    if matches!(
                        kind_,
                        jsonschema::error::ValidationErrorKind::OneOfMultipleValid { .. }
                            | jsonschema::error::ValidationErrorKind::OneOfNotValid { .. }
                            | jsonschema::error::ValidationErrorKind::AnyOf { .. }
                    ) {
                        if let Some(hint) = compiled
                            .schema
                            .pointer(error.schema_path().as_str())
                            .and_then(alternatives_hint)
                        {
                            message = format!("{message} ({hint})");
                        }
                    }
                    let at = if path.is_empty() {
                        "(the object)"
                    } else {
                        path.as_str()
                    };
                    report.problems.push(format!("{label}: {at}: {message}"));
                }
            }
        }
    }
}

/// What [`Schemas::check`] found.
pub struct Checked {
    pub report: Report,
    /// Kubernetes objects valid against their schemas.
    pub valid: usize,
    /// Objects never applied: kustomize's own files (`Kustomization`,
    /// `Component`) and objects annotated
    /// `config.kubernetes.io/local-config: "true"` (kustomize drops them).
    pub local: usize,
}

/// Kustomize reads these and never sends them to the API server.
fn is_local(value: &Value) -> bool {
    let kustomize = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .is_some_and(|v| v.starts_with("kustomize.config.k8s.io/"));
    let annotated = value
        .pointer("/metadata/annotations/config.kubernetes.io~1local-config")
        .and_then(Value::as_str)
        == Some("true");
    kustomize || annotated
}

/// A `kind`, or a Kubernetes-shaped `apiVersion` (`v1`, `group/v1beta1`):
/// other YAML with an `apiVersion` (Grafana's provisioning files have
/// `apiVersion: 1`) is not this check's.
fn is_kubernetes_object(object: &Map<String, Value>) -> bool {
    let version_like = |v: &str| {
        v.strip_prefix('v').is_some_and(|rest| {
            let digits = rest.trim_start_matches(|c: char| c.is_ascii_digit());
            digits.len() < rest.len()
                && ["", "alpha", "beta"].iter().any(|p| {
                    digits.strip_prefix(p).is_some_and(|n| {
                        n.chars().all(|c| c.is_ascii_digit()) && (p.is_empty() || !n.is_empty())
                    })
                })
        })
    };
    object.contains_key("kind")
        || object
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| version_like(v.rsplit('/').next().unwrap_or(v)))
}

fn collect_yaml(dir: &Path, files: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_yaml(&path, files)?;
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            files.push(path);
        }
    }
    Ok(())
}

/// `spec.match[0].mode` from the instance path's segments.
fn json_path<'a>(segments: impl Iterator<Item = jsonschema::paths::LocationSegment<'a>>) -> String {
    let mut path = String::new();
    for segment in segments {
        match segment {
            jsonschema::paths::LocationSegment::Index(i) => path.push_str(&format!("[{i}]")),
            jsonschema::paths::LocationSegment::Property(p) => path = join_path(&path, &p),
        }
    }
    path
}

fn join_path(path: &str, field: &str) -> String {
    let plain = !field.is_empty()
        && field
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '@');
    match (path.is_empty(), plain) {
        (true, true) => field.to_string(),
        (false, true) => format!("{path}.{field}"),
        (_, false) => format!("{path}[{field:?}]"),
    }
}

/// For a failed `oneOf`/`anyOf` whose alternatives each require a field
/// (how CRDs say "one of these"), which fields those are.
fn alternatives_hint(alternatives: &Value) -> Option<String> {
    let alternatives = alternatives.as_array()?;
    let mut fields = Vec::new();
    let mut none_allowed = false;
    for alternative in alternatives {
        match alternative.get("required").and_then(Value::as_array) {
            Some(required) => {
                let names: Vec<&str> = required.iter().filter_map(Value::as_str).collect();
                fields.push(names.join(" + "));
            }
            None if alternative.get("not").is_some() => none_allowed = true,
            None => return None,
        }
    }
    if fields.is_empty() {
        return None;
    }
    Some(format!(
        "{} one of: {}",
        if none_allowed { "at most" } else { "exactly" },
        fields.join(", ")
    ))
}

/// A CRD's structural schema as a JSON Schema (draft 4) with the API
/// server's pruning turned into errors: every object node whose fields are
/// listed (or that lists none and has no `additionalProperties`) refuses
/// others, unless it preserves unknown fields. `apiVersion`, `kind` and an
/// ObjectMeta `metadata` are added at the root.
pub fn to_json_schema(crd_schema: &Value) -> Value {
    let mut schema = crd_schema.clone();
    convert(&mut schema);
    if let Some(root) = schema.as_object_mut() {
        root.entry("type").or_insert_with(|| json!("object"));
        add_object_fields(root);
    }
    schema
}

fn convert(node: &mut Value) {
    let Some(map) = node.as_object_mut() else {
        return;
    };
    // The CEL rules are not evaluated; `format` is not checked either
    // (Kubernetes' formats are not JSON Schema's: its `duration` is Go's).
    map.remove("x-kubernetes-validations");
    let is =
        |map: &Map<String, Value>, key: &str| map.get(key).and_then(Value::as_bool) == Some(true);
    if is(map, "x-kubernetes-int-or-string")
        && !map.contains_key("type")
        && !map.contains_key("anyOf")
    {
        map.insert("type".into(), json!(["integer", "string"]));
    }
    // decided before `nullable` turns the type into a list
    let is_object = map.get("type").and_then(Value::as_str) == Some("object");
    if is(map, "nullable") {
        if let Some(Value::String(t)) = map.get("type") {
            let t = t.clone();
            map.insert("type".into(), json!([t, "null"]));
        }
        if let Some(Value::Array(options)) = map.get_mut("enum") {
            options.push(Value::Null);
        }
    }
    if is_object
        && !is(map, "x-kubernetes-preserve-unknown-fields")
        && !map.contains_key("additionalProperties")
    {
        map.insert("additionalProperties".into(), json!(false));
    }
    if is(map, "x-kubernetes-embedded-resource") {
        add_object_fields(map);
    }
    for key in ["properties", "patternProperties"] {
        if let Some(Value::Object(properties)) = map.get_mut(key) {
            properties.values_mut().for_each(convert);
        }
    }
    for key in ["additionalProperties", "items", "not"] {
        if let Some(child) = map.get_mut(key) {
            match child {
                Value::Array(items) => items.iter_mut().for_each(convert),
                other => convert(other),
            }
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(items)) = map.get_mut(key) {
            items.iter_mut().for_each(convert);
        }
    }
}

/// `apiVersion`, `kind` and `metadata` (an ObjectMeta; a CRD's own
/// `metadata` schema only narrows `name`), which every object has.
fn add_object_fields(map: &mut Map<String, Value>) {
    let properties = map
        .entry("properties")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("properties is an object");
    properties.insert("apiVersion".into(), json!({"type": "string"}));
    properties.insert("kind".into(), json!({"type": "string"}));
    let mut meta = object_meta();
    if let Some(own) = properties
        .get("metadata")
        .and_then(|m| m.get("properties"))
        .and_then(Value::as_object)
    {
        for (field, narrowed) in own {
            let mut narrowed = narrowed.clone();
            convert(&mut narrowed);
            let base = match meta["properties"][field].take() {
                Value::Null => json!({}),
                base => base,
            };
            meta["properties"][field] = json!({"allOf": [base, narrowed]});
        }
    }
    properties.insert("metadata".into(), meta);
}

/// What `metadata` may hold (Kubernetes' ObjectMeta, the fields a manifest
/// sets or a server writes).
fn object_meta() -> Value {
    let string_map = json!({"type": "object", "additionalProperties": {"type": "string"}});
    json!({
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "name": {"type": "string", "maxLength": 253},
            "generateName": {"type": "string"},
            "namespace": {"type": "string", "maxLength": 63},
            "labels": string_map,
            "annotations": string_map,
            "finalizers": {"type": "array", "items": {"type": "string"}},
            "ownerReferences": {"type": "array", "items": {"type": "object"}},
            "managedFields": {"type": "array", "items": {"type": "object"}},
            "uid": {"type": "string"},
            "resourceVersion": {"type": "string"},
            "generation": {"type": "integer"},
            "creationTimestamp": {"type": ["string", "null"]},
            "deletionTimestamp": {"type": "string"},
            "deletionGracePeriodSeconds": {"type": "integer"},
            "selfLink": {"type": "string"},
        },
    })
}

/// The core kinds the manifests may hold, minimally: their top-level
/// fields, each of the right type (no CRD describes them).
fn core_schema(kind: &str, version: &str) -> Option<Value> {
    if version != "v1" {
        return None;
    }
    let string_map = json!({"type": "object", "additionalProperties": {"type": "string"}});
    let mut schema = match kind {
        "ConfigMap" => json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "data": string_map,
                "binaryData": string_map,
                "immutable": {"type": "boolean"},
            },
        }),
        "Namespace" => json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "spec": {
                    "type": "object",
                    "additionalProperties": false,
                    "properties": {"finalizers": {"type": "array", "items": {"type": "string"}}},
                },
                "status": {"type": "object"},
            },
        }),
        _ => return None,
    };
    add_object_fields(schema.as_object_mut().expect("an object"));
    Some(schema)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CRD in the shape Istio's and Envoy Gateway's have.
    const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: plugins.example.io
spec:
  group: example.io
  names:
    kind: Plugin
  versions:
  - name: v1
    served: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          apiVersion: {type: string}
          kind: {type: string}
          metadata: {type: object}
          spec:
            type: object
            required: [url]
            oneOf:
            - not:
                anyOf:
                - required: [selector]
                - required: [targetRefs]
            - required: [selector]
            - required: [targetRefs]
            properties:
              url: {type: string, minLength: 1}
              phase: {type: string, enum: [AUTHN, STATS]}
              priority: {type: integer, nullable: true}
              port:
                x-kubernetes-int-or-string: true
                anyOf: [{type: integer}, {type: string}]
              timeout:
                x-kubernetes-int-or-string: true
              pluginConfig:
                type: object
                x-kubernetes-preserve-unknown-fields: true
              selector:
                type: object
                properties:
                  matchLabels: {type: object, additionalProperties: {type: string}}
              targetRefs:
                type: array
                items:
                  type: object
                  required: [kind, name]
                  properties:
                    kind: {type: string}
                    name: {type: string}
                  x-kubernetes-validations:
                  - rule: self.name != ''
              empty: {type: object}
  - name: v1alpha1
    served: true
    deprecated: true
    deprecationWarning: example.io/v1alpha1 Plugin is deprecated; use v1
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
  - name: v0
    served: false
    schema:
      openAPIV3Schema: {type: object}
"#;

    const OK: &str = r#"
apiVersion: example.io/v1
kind: Plugin
metadata:
  name: p
  labels: {app: x}
spec:
  url: oci://example/p:1
  phase: STATS
  priority: null
  port: http
  timeout: 5
  pluginConfig: {anything: [1, {goes: here}]}
  targetRefs:
  - {kind: Service, name: backend}
"#;

    fn schemas() -> Schemas {
        Schemas::from_texts([("crd.yaml", CRD)]).expect("crd")
    }

    fn problems(text: &str) -> Vec<String> {
        schemas().check(text).report.problems
    }

    #[test]
    fn a_valid_object_passes_and_other_yaml_is_not_this_check_s() {
        let checked = schemas().check(OK);
        assert_eq!(checked.report.problems, Vec::<String>::new());
        assert_eq!((checked.valid, checked.local), (1, 0));
        let others =
            "static_resources: {}\n---\ngroups: []\n---\napiVersion: 1\nproviders: []\n---\n";
        let checked = schemas().check(others);
        assert!(checked.report.problems.is_empty() && checked.report.warnings.is_empty());
        assert_eq!((checked.valid, checked.local), (0, 0));
        for half in [
            "kind: Plugin\n",
            "apiVersion: example.io/v1\n",
            "apiVersion: v1beta1\n",
        ] {
            let report = schemas().check(half).report;
            assert!(
                report.problems[0].contains("needs both apiVersion and kind"),
                "{half}: {:?}",
                report.problems
            );
        }
    }

    #[test]
    fn an_unknown_field_is_an_error_at_every_level_that_lists_its_fields() {
        let cases = [
            (
                "  phase: STATS\n",
                "  phaze: STATS\n",
                "spec.phaze: unknown field",
            ),
            (
                "  name: p\n",
                "  name: p\n  lables: {a: b}\n",
                "metadata.lables: unknown field",
            ),
            (
                "kind: Service, name: backend",
                "kind: Service, nme: backend",
                "spec.targetRefs[0].nme: unknown field",
            ),
            (
                "\nspec:\n",
                "\nspek: {}\nspec:\n",
                "document 1 (Plugin p): spek: unknown field",
            ),
            (
                "  timeout: 5\n",
                "  timeout: 5\n  empty: {a: 1}\n",
                "spec.empty.a: unknown field",
            ),
        ];
        for (from, to, expected) in cases {
            let text = OK.replacen(from, to, 1);
            let found = problems(&text);
            assert!(
                found
                    .iter()
                    .any(|p| p.contains(expected) && p.contains("pruned on apply")),
                "{expected}: {found:?}"
            );
        }
    }

    #[test]
    fn types_enums_required_and_one_of_are_checked() {
        let cases = [
            (
                "phase: STATS",
                "phase: FOO",
                "spec.phase: \"FOO\" is not one of \"AUTHN\", \"STATS\"",
            ),
            ("timeout: 5", "timeout: [5]", "spec.timeout:"),
            ("port: http", "port: 1.5", "spec.port:"),
            ("url: oci://example/p:1", "url: ''", "spec.url:"),
            (
                "  url: oci://example/p:1\n",
                "",
                "spec: \"url\" is a required property",
            ),
            (
                "  targetRefs:\n",
                "  selector: {}\n  targetRefs:\n",
                "at most one of: selector, targetRefs",
            ),
            (
                "labels: {app: x}",
                "labels: {app: 1}",
                "metadata.labels.app:",
            ),
        ];
        for (from, to, expected) in cases {
            let text = OK.replacen(from, to, 1);
            assert_ne!(text, OK, "{from}");
            let found = problems(&text);
            assert!(
                found.iter().any(|p| p.contains(expected)),
                "{expected}: {found:?}"
            );
        }
    }

    #[test]
    fn versions_kinds_and_names_are_checked() {
        let with = |from: &str, to: &str| problems(&OK.replacen(from, to, 1));
        assert!(with("example.io/v1", "example.io/v2")[0]
            .contains("has no version v2 (it has v1, v1alpha1, v0)"));
        assert!(with("example.io/v1", "example.io/v0")[0].contains("does not serve v0"));
        assert!(with("kind: Plugin", "kind: Plugn")[0].contains("no CRD known for Plugn"));
        assert!(with("  name: p\n", "")[0].contains("metadata.name: missing"));
        let checked = schemas().check(&OK.replacen("example.io/v1", "example.io/v1alpha1", 1));
        let report = checked.report;
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        assert_eq!(checked.valid, 1);
        let mut schemas = schemas();
        let old = OK.replacen("example.io/v1", "example.io/v1alpha1", 1);
        for _ in 0..2 {
            let again = schemas.check(&old).report.warnings;
            assert!(again[0].contains("deprecated; use v1"), "{again:?}");
        }
        assert!(
            report.warnings[0].contains("deprecated; use v1"),
            "{:?}",
            report.warnings
        );
    }

    /// kustomize's own files, and what it never emits, are not applied.
    #[test]
    fn kustomize_files_and_local_objects_are_not_checked() {
        let text = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [a.yaml]\n---\napiVersion: adaptive-hedge/v1\nkind: Values\nmetadata:\n  name: v\n  annotations: {config.kubernetes.io/local-config: \"true\"}\nimage: {url: x}\n";
        let checked = schemas().check(text);
        assert!(
            checked.report.problems.is_empty(),
            "{:?}",
            checked.report.problems
        );
        assert_eq!((checked.valid, checked.local), (0, 2));
        let applied = text.replace("\"true\"", "\"false\"");
        let found = schemas().check(&applied).report.problems;
        assert!(found[0].contains("no CRD known for Values"), "{found:?}");
    }

    #[test]
    fn config_maps_get_a_minimal_check_and_other_core_kinds_none() {
        let config_map = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  a: b\n";
        assert_eq!(problems(config_map), Vec::<String>::new());
        let found = problems(&config_map.replace("a: b", "a: {b: c}"));
        assert!(found[0].contains("(ConfigMap c): data.a:"), "{found:?}");
        let found = problems(&config_map.replace("\ndata:", "\ndta:"));
        assert!(found[0].contains("dta: unknown field"), "{found:?}");
        let found = problems("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n");
        assert!(
            found[0].contains("no schema known for the core kind v1 Service"),
            "{found:?}"
        );
    }
}

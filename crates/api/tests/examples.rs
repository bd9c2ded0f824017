//! Every document in `examples/` parses into its typed kind, and no field of it
//! is silently dropped (a misspelt field would be ignored by serde otherwise).

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube_on_kube_api::{CanaryRelease, Cluster, ClusterPackageVersion, Machine, PackageVersion};
use serde::Deserialize;
use serde_json::Value;

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Parse `doc` as `T` and serialize it back.
fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(
    doc: &Value,
) -> Result<Value, String> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

/// Paths present in `original` but missing or different in `parsed`.
fn lost(original: &Value, parsed: &Value, path: &str, out: &mut Vec<String>) {
    match (original, parsed) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => lost(v, w, &format!("{path}.{k}"), out),
                    None => out.push(format!("{path}.{k}")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                lost(v, w, &format!("{path}[{i}]"), out);
            }
        }
        (a, b) if a == b => {}
        // Quantities and int-or-strings may change representation, not value.
        (a, b) if a.to_string().trim_matches('"') == b.to_string().trim_matches('"') => {}
        _ => out.push(path.to_string()),
    }
}

#[test]
fn every_example_parses_without_losing_fields() {
    let mut files: Vec<_> = std::fs::read_dir(examples_dir())
        .expect("examples/ exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 6,
        "expected the example files, found {files:?}"
    );

    let mut kinds = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read example");
        for document in serde_norway::Deserializer::from_str(&text) {
            let doc = Value::deserialize(document).expect("valid YAML");
            let kind = doc["kind"]
                .as_str()
                .expect("every document has a kind")
                .to_string();
            let parsed = match kind.as_str() {
                "Cluster" => round_trip::<Cluster>(&doc),
                "Machine" => round_trip::<Machine>(&doc),
                "PackageVersion" => round_trip::<PackageVersion>(&doc),
                "ClusterPackageVersion" => round_trip::<ClusterPackageVersion>(&doc),
                "CanaryRelease" => round_trip::<CanaryRelease>(&doc),
                "Secret" => round_trip::<Secret>(&doc),
                // User add-on templates are registered as labelled ConfigMaps.
                "ConfigMap" => round_trip::<ConfigMap>(&doc),
                other => panic!("{}: unexpected kind {other}", file.display()),
            }
            .unwrap_or_else(|e| panic!("{}: {kind} does not parse: {e}", file.display()));
            let mut missing = Vec::new();
            lost(&doc, &parsed, "", &mut missing);
            assert!(
                missing.is_empty(),
                "{}: {kind} drops fields {missing:?}",
                file.display()
            );
            kinds.push(kind);
        }
    }
    for kind in [
        "Cluster",
        "Machine",
        "PackageVersion",
        "ClusterPackageVersion",
        "CanaryRelease",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "no example of {kind}");
    }
}

#[test]
fn the_lost_field_check_can_fail() {
    let doc = serde_json::json!({
        "apiVersion": "kubeonkube.io/v1alpha1", "kind": "ClusterPackageVersion",
        "metadata": {"name": "default"},
        "spec": {"packages": {"kubelet": "kubelet-1.35.4"}, "rollot": {"maxUnavailable": 1}}
    });
    let parsed = round_trip::<ClusterPackageVersion>(&doc).expect("parses");
    let mut missing = Vec::new();
    lost(&doc, &parsed, "", &mut missing);
    assert_eq!(missing, vec![".spec.rollot".to_string()]);
}

//! Helpers shared by the integration tests: the example documents and a
//! dynamic API for sending objects the typed API could not even represent.

use std::path::{Path, PathBuf};

use kube::api::{Api, ApiResource, DynamicObject};
use kube::{Client, Resource};
use serde::Deserialize;
use serde_json::Value;

/// The repository's `examples/` directory.
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// Every YAML document of every example file, with its file name.
pub fn example_documents() -> Vec<(String, Value)> {
    let mut files: Vec<_> = std::fs::read_dir(examples_dir())
        .expect("examples/ exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read example");
        let name = file
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .to_string();
        for doc in serde_norway::Deserializer::from_str(&text) {
            out.push((name.clone(), Value::deserialize(doc).expect("valid YAML")));
        }
    }
    out
}

/// The first example document of `kind`.
pub fn example(kind: &str) -> Value {
    example_documents()
        .into_iter()
        .map(|(_, doc)| doc)
        .find(|doc| doc["kind"] == kind)
        .unwrap_or_else(|| panic!("no example of {kind}"))
}

/// An untyped API for the kind `K`, namespaced when `namespace` is given.
pub fn dynamic_api<K: Resource<DynamicType = ()>>(
    client: Client,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<K>(&());
    match namespace {
        Some(ns) => Api::namespaced_with(client, ns, &resource),
        None => Api::all_with(client, &resource),
    }
}

/// Set `value` at the slash-separated `path` in `doc`, creating objects on the
/// way; `Value::Null` removes the field.
pub fn set(doc: &mut Value, path: &str, value: Value) {
    let mut parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let last = parts.pop().expect("non-empty path");
    let mut here = doc;
    for part in parts {
        if here.get(part).is_none() {
            here[part] = Value::Object(Default::default());
        }
        here = &mut here[part];
    }
    match value {
        Value::Null => {
            here.as_object_mut().map(|o| o.remove(last));
        }
        v => here[last] = v,
    }
}

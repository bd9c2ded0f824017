//! Properties every CRD must have: a status subresource, the `kok` category, a
//! short name, printer columns, and a description on every field (it is what
//! `kubectl explain` shows).

use serde_json::Value;

fn undescribed(schema: &Value, path: &str, out: &mut Vec<String>) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            let here = format!("{path}.{name}");
            let top_level =
                path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&name.as_str());
            if !top_level
                && prop
                    .get("description")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
            {
                out.push(here.clone());
            }
            undescribed(prop, &here, out);
        }
    }
    if let Some(items) = schema.get("items") {
        undescribed(items, &format!("{path}[]"), out);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        undescribed(values, &format!("{path}{{}}"), out);
    }
}

#[test]
fn every_crd_is_complete() {
    for (file, crd) in kube_on_kube_api::crds() {
        assert_eq!(crd.spec.group, "kubeonkube.io", "{file}");
        let names = &crd.spec.names;
        assert!(
            names
                .categories
                .as_ref()
                .is_some_and(|c| c.contains(&"kok".to_string())),
            "{file}: kok category"
        );
        assert!(
            names.short_names.as_ref().is_some_and(|s| !s.is_empty()),
            "{file}: short name"
        );
        assert_eq!(crd.spec.versions.len(), 1, "{file}");
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(
            version
                .subresources
                .as_ref()
                .is_some_and(|s| s.status.is_some()),
            "{file}: status subresource"
        );
        assert!(
            version
                .additional_printer_columns
                .as_ref()
                .is_some_and(|c| c.len() >= 3),
            "{file}: printer columns"
        );
        let schema = serde_json::to_value(
            version
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref()),
        )
        .expect("schema");
        let mut missing = Vec::new();
        undescribed(&schema, "", &mut missing);
        assert!(
            missing.is_empty(),
            "{file}: fields without a description: {missing:#?}"
        );
    }
}

#[test]
fn machine_and_package_kinds_are_cluster_scoped() {
    for (file, crd) in kube_on_kube_api::crds() {
        let expected = if file == "cluster.yaml" {
            "Namespaced"
        } else {
            "Cluster"
        };
        assert_eq!(crd.spec.scope, expected, "{file}");
    }
}

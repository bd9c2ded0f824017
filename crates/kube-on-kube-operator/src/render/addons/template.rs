//! The add-on template language: multi-document YAML rendered with the
//! shared template engine ([`kok_common::template`]: Jinja, strict undefined
//! values, the `yaml`/`systemd`/`shell` filters) over one JSON object of
//! values, then split into its documents.

use serde::Deserialize;
use serde_json::{Map, Value};

/// `text` (called `name` in messages) rendered with `values`; an unknown key
/// or a value a filter refuses is an error naming the expression and its
/// line.
pub fn substitute(name: &str, text: &str, values: &Value) -> Result<String, String> {
    kok_common::template::render(name, text, values).map_err(|e| e.message)
}

/// The documents of a multi-document YAML text, as JSON; empty documents are
/// skipped.
pub fn documents(text: &str) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for (index, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(doc).map_err(|e| format!("document {}: {e}", index + 1))?;
        if !value.is_null() {
            out.push(value);
        }
    }
    Ok(out)
}

/// `overrides` merged into `base`: objects key by key, anything else replaced.
pub fn merge(base: &mut Map<String, Value>, overrides: &Map<String, Value>) {
    for (key, value) in overrides {
        match (base.get_mut(key), value) {
            (Some(Value::Object(b)), Value::Object(o)) => merge(b, o),
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_are_written_by_the_filter_the_template_names() {
        let values = json!({"a": {"b": "x: y", "n": 3, "list": [1, 2], "obj": {"k": "v"}}});
        let out = substitute(
            "t",
            "s: {{ a.b | yaml }}\nn: {{ a.n }}\nl: {{ a.list | yaml }}\no: {{ a.obj | tojson }}\n",
            &values,
        )
        .expect("substitute");
        assert_eq!(out, "s: \"x: y\"\nn: 3\nl: [1,2]\no: {\"k\":\"v\"}\n");
        let docs = documents(&out).expect("yaml");
        assert_eq!(docs[0]["s"], "x: y");
    }

    #[test]
    fn a_value_cannot_add_a_document() {
        let values = json!({"values": {"name": "a\n---\napiVersion: v1\nkind: Secret"}});
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: {{ values.name | yaml }}}\n";
        let docs = documents(&substitute("t", text, &values).expect("quoted")).expect("yaml");
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0]["metadata"]["name"], values["values"]["name"]);
        // Printed without a filter, the newline is refused with the key's name.
        let raw = "metadata: {name: {{ values.name }}}\n";
        let err = substitute("t", raw, &values).expect_err("refused");
        assert!(
            err.contains("values.name") && err.contains("newline"),
            "{err}"
        );
    }

    #[test]
    fn missing_keys_are_named() {
        let err = substitute("t", "a: {{ b.c }}", &json!({"b": {}})).expect_err("missing");
        assert!(err.contains("`b.c` is undefined"), "{err}");
    }

    #[test]
    fn raw_blocks_keep_go_templates() {
        let text = "summary: '{% raw %}{{ $labels.instance }}{% endraw %} down'";
        assert_eq!(
            substitute("t", text, &json!({})).expect("kept"),
            "summary: '{{ $labels.instance }} down'"
        );
    }

    #[test]
    fn documents_skip_empty_ones_and_report_the_bad_one() {
        let docs = documents("---\na: 1\n---\n---\nb: 2\n").expect("docs");
        assert_eq!(docs, vec![json!({"a": 1}), json!({"b": 2})]);
        let err = documents("a: 1\n---\nb: [\n").expect_err("bad");
        assert!(err.starts_with("document 2:"), "{err}");
    }

    #[test]
    fn merge_is_deep_and_overrides_win() {
        let mut base = json!({"a": {"x": 1, "y": 2}, "b": 1})
            .as_object()
            .cloned()
            .unwrap_or_default();
        let overrides = json!({"a": {"y": 3}, "c": true});
        merge(&mut base, overrides.as_object().expect("object"));
        assert_eq!(
            Value::Object(base),
            json!({"a": {"x": 1, "y": 3}, "b": 1, "c": true})
        );
    }
}

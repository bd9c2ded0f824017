//! The add-on template language: multi-document YAML with `{{dotted.key}}`
//! placeholders looked up in one JSON object of values. Deliberately tiny (no
//! conditionals, no loops) so a template reads like the objects it makes.

use serde::Deserialize;
use serde_json::{Map, Value};

/// Whether `key` is a placeholder key; anything else between braces (a Go
/// template such as `{{ $labels.instance }}` inside an alerting rule) is left
/// as written.
fn is_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// The value at dotted path `key` in `values`.
pub fn lookup<'a>(values: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.').try_fold(values, |v, part| v.get(part))
}

/// How a value is written into the text: strings as they are (the template
/// decides about quoting), numbers and booleans as literals, objects and lists
/// as JSON (which is YAML flow style).
fn text_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "null".into(),
        other => other.to_string(),
    }
}

/// Replace every placeholder in `text`. Every missing key is named in the error.
pub fn substitute(text: &str, values: &Value) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut missing = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            rest = "";
            break;
        };
        let key = after[..end].trim();
        if is_key(key) {
            match lookup(values, key) {
                Some(v) => out.push_str(&text_of(v)),
                None => {
                    if !missing.contains(&key) {
                        missing.push(key);
                    }
                }
            }
        } else {
            out.push_str(&rest[start..start + 2 + end + 2]);
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(format!("no value for {}", missing.join(", ")))
    }
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
    fn placeholders_are_replaced_by_kind() {
        let values = json!({"a": {"b": "x", "n": 3, "list": [1, 2], "obj": {"k": "v"}}});
        let out = substitute(
            "s: {{a.b}}\nn: {{ a.n }}\nl: {{a.list}}\no: {{a.obj}}\n",
            &values,
        )
        .expect("substitute");
        assert_eq!(out, "s: x\nn: 3\nl: [1,2]\no: {\"k\":\"v\"}\n");
    }

    #[test]
    fn missing_keys_are_all_named() {
        let err = substitute("{{a}} {{b.c}} {{a}}", &json!({})).expect_err("missing");
        assert_eq!(err, "no value for a, b.c");
    }

    #[test]
    fn other_braces_are_left_alone() {
        let text = "summary: '{{ $labels.instance }} down' {{ unclosed";
        assert_eq!(substitute(text, &json!({})).expect("kept"), text);
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

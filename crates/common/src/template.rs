//! The one template language of add-on templates and package files and units:
//! Jinja as implemented by `minijinja`, set up once for both operators. A
//! value is never quoted for the author; the author applies the filter of the
//! format being written (`yaml`/`tojson`, `systemd`, `shell`), and a value
//! that filter cannot write safely is an error naming the expression. A value
//! printed with no filter must be one line without control characters, so a
//! forgotten filter cannot add lines to a YAML document or a unit file.

use std::sync::LazyLock;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::{AutoEscape, Environment, ErrorKind, Output, State, UndefinedBehavior, Value};
use serde::Serialize;

/// Upper bound on the instructions one rendering may run, so a template
/// with runaway loops fails instead of holding a reconcile.
const FUEL: u64 = 5_000_000;

/// A template that cannot be parsed or rendered, with where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    /// The whole message: the template's name, the line, the expression and
    /// the reason.
    pub message: String,
}

static ENV: LazyLock<Environment<'static>> = LazyLock::new(environment);

/// The shared environment: strict undefined values, no automatic escaping
/// (the filters decide), the output's last newline kept, and otherwise
/// Jinja's defaults (a block tag keeps the newline after it, so a loop can
/// sit inside one line of a unit file).
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    // Building Jinja's default syntax with one whitespace option cannot
    // fail; were it to, the trailing newline would be the only loss.
    if let Ok(syntax) = SyntaxConfig::builder().keep_trailing_newline(true).build() {
        env.set_syntax(syntax);
    }
    env.set_debug(true);
    env.set_fuel(Some(FUEL));
    env.set_formatter(one_line_formatter);
    env.add_filter("yaml", yaml);
    env.add_filter("tojson", yaml);
    env.add_filter("systemd", systemd);
    env.add_filter("shell", shell);
    env
}

/// Renders `source` (named `name` in messages) with the fields of `context`
/// as its variables.
pub fn render<C: Serialize>(name: &str, source: &str, context: &C) -> Result<String, Error> {
    let context = Value::from(Serde(context));
    ENV.render_named_str(name, source, context)
        .map_err(|e| describe(name, source, &e))
}

/// The message of a minijinja error: the template, the line, the expression
/// it was evaluating (from the error's span) and the reason.
fn describe(name: &str, source: &str, err: &minijinja::Error) -> Error {
    let mut message = format!("template {name}");
    if let Some(line) = err.line() {
        message.push_str(&format!(", line {line}"));
    }
    let expression = err
        .range()
        .and_then(|r| enclosing_expression(source, r))
        .filter(|e| !e.is_empty() && !e.contains('\n'));
    if let Some(expression) = expression
        && err.kind() != ErrorKind::SyntaxError
    {
        message.push_str(&format!(", in `{expression}`"));
    }
    message.push_str(": ");
    message.push_str(&err.kind().to_string());
    if let Some(detail) = err.detail() {
        message.push_str(": ");
        message.push_str(detail);
    }
    Error { message }
}

/// The whole `{{ … }}` expression around `range` (the span minijinja gives
/// is often only the filter's name), or the span's own text.
fn enclosing_expression(source: &str, range: std::ops::Range<usize>) -> Option<&str> {
    let span = source.get(range.clone())?;
    let before = source.get(..range.start)?;
    let after = source.get(range.end..)?;
    let open = before.rfind("{{").filter(|&i| !before[i..].contains("}}"));
    let close = after.find("}}").filter(|&i| !after[..i].contains("{{"));
    match (open, close) {
        (Some(open), Some(close)) => source
            .get(open + 2..range.end + close)
            .map(|e| e.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace())),
        _ => Some(span.trim()),
    }
}

fn invalid(detail: String) -> minijinja::Error {
    minijinja::Error::new(ErrorKind::InvalidOperation, detail)
}

/// The first control character of `s`, named for a message.
fn control_char(s: &str) -> Option<String> {
    s.chars().find(|c| c.is_control()).map(|c| match c {
        '\n' => "a newline".to_string(),
        '\r' => "a carriage return".to_string(),
        '\t' => "a tab".to_string(),
        c => format!("control character U+{:04X}", u32::from(c)),
    })
}

/// Writes a value printed with no filter as it is, unless it is a string
/// with a newline or another control character: what such a value means
/// depends on the format, so the author has to choose a filter.
fn one_line_formatter(
    out: &mut Output,
    _: &mut State,
    value: &Value,
) -> Result<(), minijinja::Error> {
    let text = value.to_string();
    if !value.is_safe()
        && let Some(what) = control_char(&text)
    {
        return Err(invalid(format!(
            "the value contains {what}; printed without a filter a value must be one line: use | yaml, | systemd or | shell for the format being written"
        )));
    }
    out.write_str(&text)
        .map_err(|e| minijinja::Error::new(ErrorKind::WriteFailure, e.to_string()))
}

/// `yaml` and `tojson`: the value as JSON, which is YAML flow style, so it
/// is one scalar, list or map wherever a YAML value goes. The characters
/// YAML 1.1 reads as line breaks but JSON leaves as they are are escaped.
pub fn yaml(value: &Value) -> Result<Value, minijinja::Error> {
    let json = serde_json::to_string(value)
        .map_err(|e| invalid(format!("cannot be written as YAML: {e}")))?;
    Ok(Value::from_safe_string(yaml_safe_json(&json)))
}

/// `json` with U+0085, U+2028, U+2029 and U+FEFF written as `\u` escapes:
/// JSON allows them raw, YAML 1.1 parsers fold or drop them.
fn yaml_safe_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '\u{85}' | '\u{2028}' | '\u{2029}' | '\u{feff}' => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)))
            }
            c => out.push(c),
        }
    }
    out
}

/// The text of a scalar value, for the quoting filters; lists, maps and
/// undefined values are refused.
fn scalar_text(value: &Value, filter: &str) -> Result<String, minijinja::Error> {
    if value.is_undefined()
        || value.is_none()
        || value.try_iter().is_ok() && value.as_str().is_none()
    {
        return Err(invalid(format!(
            "`{filter}` quotes one string or number, not a {}",
            value.kind()
        )));
    }
    Ok(value.to_string())
}

/// `systemd`: the value as one argument of a unit file's command line
/// (`ExecStart=` and the like): double-quoted, with `\` and `"` escaped, `%`
/// (a specifier) as `%%` and `$` (a variable) as `$$`. A value with a
/// newline or another control character is refused: a unit file has no way
/// to hold it on one line that every systemd version reads the same.
pub fn systemd(value: &Value) -> Result<Value, minijinja::Error> {
    let text = scalar_text(value, "systemd")?;
    if let Some(what) = control_char(&text) {
        return Err(invalid(format!(
            "the value contains {what}, which a systemd argument cannot hold"
        )));
    }
    Ok(Value::from_safe_string(systemd_quote(&text)))
}

/// `text` as one double-quoted systemd command-line argument (no control
/// characters: see [`systemd`]).
pub fn systemd_quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '\\' => out.push_str(r"\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '$' => out.push_str("$$"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `shell`: the value as one single-quoted POSIX shell word. Only a NUL
/// byte, which no shell word can hold, is refused.
pub fn shell(value: &Value) -> Result<Value, minijinja::Error> {
    let text = scalar_text(value, "shell")?;
    if text.contains('\0') {
        return Err(invalid(
            "the value contains a NUL byte, which a shell word cannot hold".into(),
        ));
    }
    Ok(Value::from_safe_string(shell_quote(&text)))
}

/// Single-quotes `s` for `sh`.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn r(source: &str, context: serde_json::Value) -> Result<String, String> {
        render("t", source, &context).map_err(|e| e.message)
    }

    #[test]
    fn keys_print_as_before_and_unknown_ones_are_named() {
        let values = json!({"a": {"b": "x", "n": 3}, "nodeIP": "10.0.0.2"});
        assert_eq!(
            r("s: {{a.b}}\nn: {{ a.n }}\nip={{nodeIP}}\n", values.clone()).unwrap(),
            "s: x\nn: 3\nip=10.0.0.2\n"
        );
        let err = r("x: 1\ny: {{ values.nope }}\n", json!({"values": {}})).unwrap_err();
        assert!(err.contains("`values.nope` is undefined"), "{err}");
        assert!(err.starts_with("template t, line 2"), "{err}");
        let err = r("{{ clusterDNS }}", values).unwrap_err();
        assert!(err.contains("`clusterDNS` is undefined"), "{err}");
    }

    #[test]
    fn raw_keeps_go_templates_literal() {
        let text = "summary: '{% raw %}{{ $labels.instance }}{% endraw %} down'";
        assert_eq!(
            r(text, json!({})).unwrap(),
            "summary: '{{ $labels.instance }} down'"
        );
        // Without raw, a Go template is a syntax error with its line, never
        // text passed through by accident.
        let err = r("a: 1\nb: {{ $labels.x }}", json!({})).unwrap_err();
        assert!(err.starts_with("template t, line 2"), "{err}");
    }

    #[test]
    fn yaml_writes_one_value_whatever_it_holds() {
        let evil = "x\n---\nkind: Secret\u{2028}";
        let out = r(
            "a: {{ v | yaml }}\nb: {{ n | yaml }}\nc: {{ m | tojson }}\n",
            json!({"v": evil, "n": 3, "m": {"k": ["l", true]}}),
        )
        .unwrap();
        assert_eq!(
            out,
            "a: \"x\\n---\\nkind: Secret\\u2028\"\nb: 3\nc: {\"k\":[\"l\",true]}\n"
        );
        let parsed: serde_json::Value = serde_norway::from_str(&out).unwrap();
        assert_eq!(parsed["a"], evil);
        assert_eq!(parsed["c"], json!({"k": ["l", true]}));
    }

    #[test]
    fn systemd_quotes_one_argument_and_refuses_control_characters() {
        let out = r(
            "ExecStart=/bin/k --l={{ v | systemd }} --n={{ n | systemd }}\n",
            json!({"v": r#"a b "c" $HOME 50% \x"#, "n": 7}),
        )
        .unwrap();
        assert_eq!(
            out,
            "ExecStart=/bin/k --l=\"a b \\\"c\\\" $$HOME 50%% \\\\x\" --n=\"7\"\n"
        );
        for bad in [
            "a\nExecStartPre=/bin/sh -c evil",
            "a\rb",
            "a\u{1b}b",
            "a\0b",
        ] {
            let err = r(
                "[Service]\nExecStart=/bin/k --l={{ labels | systemd }}\n",
                json!({ "labels": bad }),
            )
            .unwrap_err();
            assert!(err.contains("labels | systemd"), "{err}");
            assert!(err.contains("line 2"), "{err}");
            assert!(err.contains("cannot hold"), "{err}");
        }
        let err = r("{{ l | systemd }}", json!({"l": [1]})).unwrap_err();
        assert!(err.contains("not a seq"), "{err}");
    }

    #[test]
    fn shell_quotes_one_word() {
        assert_eq!(
            r("echo {{ v | shell }}", json!({"v": "it's $(rm -rf /)\n"})).unwrap(),
            "echo 'it'\\''s $(rm -rf /)\n'"
        );
        let err = r("echo {{ v | shell }}", json!({"v": "a\0b"})).unwrap_err();
        assert!(err.contains("v | shell") && err.contains("NUL"), "{err}");
    }

    #[test]
    fn unfiltered_values_must_be_one_line() {
        let err = r("a: 1\nb: {{ v }}\n", json!({"v": "x\nkind: Secret"})).unwrap_err();
        assert!(err.contains("in `v`") && err.contains("a newline"), "{err}");
        // What a filter marked as written for its format passes.
        assert_eq!(
            r("{{ v | yaml }}", json!({"v": "x\ny"})).unwrap(),
            "\"x\\ny\""
        );
    }

    #[test]
    fn blocks_and_defaults_work_and_runaway_loops_stop() {
        let text = "a:\n{%- for x in xs %}\n- {{ x | yaml }}\n{%- endfor %}\n{% if opt is defined %}o: 1\n{% endif %}d: {{ missing | default('z') }}\n";
        assert_eq!(
            r(text, json!({"xs": [1, 2]})).unwrap(),
            "a:\n- 1\n- 2\nd: z\n"
        );
        let unit = "ExecStart=/k{% for k, v in args | items %} --{{ k }}={{ v | systemd }}{% endfor %}\nRestart=always\n";
        assert_eq!(
            r(unit, json!({"args": {"a": "x y", "b": "1"}})).unwrap(),
            "ExecStart=/k --a=\"x y\" --b=\"1\"\nRestart=always\n"
        );
        let err = r(
            "{% for a in range(10000) %}{% for b in range(10000) %}{% endfor %}{% endfor %}",
            json!({}),
        )
        .unwrap_err();
        assert!(err.contains("fuel"), "{err}");
    }
}

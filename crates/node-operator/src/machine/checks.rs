//! What of a Machine's spec reaches its host, checked before anything runs
//! there. The CRD refuses the same things; this holds when the CRD installed
//! is older than the operator or its rules were bypassed, so a bad value
//! becomes a condition on the Machine instead of a line in a unit file.

use kube_on_kube_api::Machine;
use kube_on_kube_api::machine::sysctl_allowed;

use crate::machine::plan::node_labels;

/// Whether `s` is a label value: at most 63 of `[A-Za-z0-9-_.]`, starting
/// and ending with a letter or digit, or empty.
pub fn label_value(s: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    s.is_empty()
        || s.len() <= 63
            && alnum(s.chars().next())
            && alnum(s.chars().last())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Whether `s` is a label key: an optional DNS-1123 subdomain and `/`, then
/// a non-empty label value.
pub fn label_key(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let dns_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    let prefix_ok = prefix.is_none_or(|p| p.len() <= 253 && p.split('.').all(dns_label));
    prefix_ok && !name.is_empty() && label_value(name)
}

fn one_line(s: &str) -> bool {
    !s.chars().any(char::is_control)
}

/// The first part of `machine`'s spec that must not reach the host, as a
/// message naming the field, or `None` when all is safe to write there.
pub fn unsafe_value(machine: &Machine) -> Option<String> {
    let spec = &machine.spec;
    for (key, value) in node_labels(machine) {
        if !label_key(&key) {
            return Some(format!("node label key {key:?} is not a label key"));
        }
        if !label_value(&value) {
            return Some(format!(
                "node label {key} has value {value:?}, which is not a label value"
            ));
        }
    }
    for taint in &spec.kubelet.taints {
        if !label_key(&taint.key) {
            return Some(format!("taint key {:?} is not a label key", taint.key));
        }
        if let Some(value) = taint.value.as_deref().filter(|v| !label_value(v)) {
            return Some(format!(
                "taint {} has value {value:?}, which is not a label value",
                taint.key
            ));
        }
        if !matches!(
            taint.effect.as_str(),
            "NoSchedule" | "PreferNoSchedule" | "NoExecute"
        ) {
            return Some(format!(
                "taint {} has effect {:?}, not NoSchedule, PreferNoSchedule or NoExecute",
                taint.key, taint.effect
            ));
        }
    }
    for (name, value) in &spec.sysctls {
        if !sysctl_allowed(name) {
            return Some(format!(
                "sysctl {name:?} is not on the allowlist (see docs/machine.md)"
            ));
        }
        if !one_line(value) {
            return Some(format!(
                "sysctl {name} has a value with a control character"
            ));
        }
    }
    let kubelet = &spec.kubelet;
    let settings = kubelet
        .extra_args
        .iter()
        .chain(&kubelet.eviction_hard)
        .map(|(k, v)| (k, v.as_str()))
        .chain(
            kubelet
                .kube_reserved
                .iter()
                .chain(&kubelet.system_reserved)
                .map(|(k, v)| (k, v.0.as_str())),
        );
    for (key, value) in settings {
        if !one_line(key) || !one_line(value) {
            return Some(format!(
                "kubelet setting {key:?} has a control character in its name or value"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Taint;

    fn machine() -> Machine {
        use serde::Deserialize;
        let text = include_str!("../../../../examples/machine.yaml");
        serde_norway::Deserializer::from_str(text)
            .filter_map(|doc| serde_json::Value::deserialize(doc).ok())
            .find(|doc| doc["kind"] == "Machine")
            .and_then(|doc| serde_json::from_value(doc).ok())
            .expect("example Machine")
    }

    #[test]
    fn labels_and_keys_follow_kubernetes() {
        for ok in ["", "a", "zone-a", "A_b.c", &"x".repeat(63)] {
            assert!(label_value(ok), "{ok:?}");
        }
        for bad in [
            "-a",
            "a-",
            "a b",
            "a\nb",
            "a=b",
            &"x".repeat(64),
            "$x",
            "%n",
        ] {
            assert!(!label_value(bad), "{bad:?}");
        }
        for ok in ["pool", "example.com/pool", "topology.kubernetes.io/zone"] {
            assert!(label_key(ok), "{ok:?}");
        }
        for bad in ["", "/pool", "Example.com/pool", "a/b/c", "a,b", "pool\n"] {
            assert!(!label_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_example_is_safe_and_each_injection_is_named() {
        assert_eq!(unsafe_value(&machine()), None);
        let injection = "a\nExecStartPre=/bin/sh -c 'id > /tmp/pwned'";

        let mut m = machine();
        m.spec.zone = Some(injection.into());
        let message = unsafe_value(&m).expect("zone refused");
        assert!(message.contains("topology.kubernetes.io/zone"), "{message}");

        let mut m = machine();
        m.spec
            .kubelet
            .node_labels
            .insert("pool".into(), injection.into());
        assert!(unsafe_value(&m).expect("label").contains("node label pool"));

        let mut m = machine();
        m.spec.kubelet.taints = vec![Taint {
            key: "dedicated".into(),
            value: Some("x".into()),
            effect: format!("NoSchedule\n{injection}"),
            time_added: None,
        }];
        assert!(unsafe_value(&m).expect("taint").contains("effect"));

        let mut m = machine();
        m.spec
            .sysctls
            .insert("kernel.core_pattern".into(), "|/tmp/x".into());
        assert!(unsafe_value(&m).expect("sysctl").contains("allowlist"));

        let mut m = machine();
        m.spec.sysctls.insert(
            "vm.swappiness".into(),
            "1\nkernel.core_pattern = |/tmp/x".into(),
        );
        assert!(
            unsafe_value(&m)
                .expect("value")
                .contains("control character")
        );

        let mut m = machine();
        m.spec
            .kubelet
            .extra_args
            .insert("v".into(), "2\rExecStartPre=/x".into());
        assert!(unsafe_value(&m).expect("arg").contains("\"v\""));

        // Spaces, quotes, `$` and `%` are not control characters: the unit
        // template quotes them.
        let mut m = machine();
        m.spec
            .kubelet
            .extra_args
            .insert("v".into(), r#"a b "c" $HOME 50%"#.into());
        assert_eq!(unsafe_value(&m), None);
    }
}

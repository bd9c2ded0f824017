//! CPU and memory of the Pods the operator runs for each Cluster in the
//! meta-cluster besides its control plane: the node-operator and the
//! snapshot gateway. A tenant does not set them: each talks to what the
//! tenant controls (its hosts, its claim), and the admin bounds what one
//! Cluster's may take of the meta-cluster with the operator's flags
//! (`--node-operator-resources`, `--snapshot-gateway-resources`; chart
//! values `kubeOnKubeOperator.nodeOperatorResources` and
//! `kubeOnKubeOperator.snapshotGatewayResources`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Deserialize;

/// The node-operator's defaults. Its caches hold the Cluster's Machines,
/// Nodes and package objects (a few MiB for a thousand nodes); each SSH
/// step it runs may hold up to 2 × 4 MiB of a host's output
/// (`node_operator::ssh::MAX_OUTPUT_BYTES`) while it reads it.
pub const NODE_OPERATOR_DEFAULT: &str =
    r#"{"requests":{"cpu":"50m","memory":"64Mi"},"limits":{"memory":"512Mi"}}"#;

/// The snapshot gateway's defaults: versitygw streams each snapshot
/// between the operator and the claim in parts of a few MiB.
pub const SNAPSHOT_GATEWAY_DEFAULT: &str =
    r#"{"requests":{"cpu":"50m","memory":"64Mi"},"limits":{"memory":"512Mi"}}"#;

/// The resources a container may be given here.
const NAMES: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Flag {
    #[serde(default)]
    requests: BTreeMap<String, String>,
    #[serde(default)]
    limits: BTreeMap<String, String>,
}

/// Parses a flag's value: a container's `resources` as JSON, with
/// `requests` and `limits` of `cpu`, `memory` or `ephemeral-storage`, each
/// a Kubernetes quantity, no request above its limit, and a memory limit.
pub fn parse(text: &str) -> Result<ResourceRequirements, String> {
    let flag: Flag = serde_json::from_str(text).map_err(|e| {
        format!("{text:?} is not resources as JSON, such as {NODE_OPERATOR_DEFAULT}: {e}")
    })?;
    let mut parsed = BTreeMap::new();
    for (kind, map) in [("requests", &flag.requests), ("limits", &flag.limits)] {
        for (name, value) in map {
            if !NAMES.contains(&name.as_str()) {
                return Err(format!(
                    "{kind}.{name}: only {} may be set",
                    NAMES.join(", ")
                ));
            }
            let amount = quantity(value).ok_or_else(|| {
                format!("{kind}.{name}: {value:?} is not a quantity such as 50m, 64Mi or 1.5Gi")
            })?;
            parsed.insert((kind, name.as_str()), amount);
        }
    }
    for name in NAMES {
        if let (Some(request), Some(limit)) = (
            parsed.get(&("requests", name)),
            parsed.get(&("limits", name)),
        ) && request > limit
        {
            return Err(format!(
                "requests.{name} {:?} is more than limits.{name} {:?}",
                flag.requests[name], flag.limits[name]
            ));
        }
    }
    if !flag.limits.contains_key("memory") {
        // Without one, a Pod that follows a tenant's input (a host's
        // output, a claim's objects) can take the meta-cluster node's memory.
        return Err("limits.memory must be set".into());
    }
    let quantities = |map: BTreeMap<String, String>| {
        (!map.is_empty()).then(|| {
            map.into_iter()
                .map(|(k, v)| (k, Quantity(v)))
                .collect::<BTreeMap<_, _>>()
        })
    };
    Ok(ResourceRequirements {
        requests: quantities(flag.requests),
        limits: quantities(flag.limits),
        ..Default::default()
    })
}

/// The value of a Kubernetes quantity (`50m`, `64Mi`, `1.5G`, `2e3`), for
/// comparing two; `None` when it is not one.
fn quantity(text: &str) -> Option<f64> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    // Only the sign may be a `+` or `-`; f64 refuses the rest (`.`, `1.2.3`).
    let unsigned = number.strip_prefix(['+', '-']).unwrap_or(number);
    if unsigned.contains(['+', '-']) {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exponent => {
            let digits = exponent.strip_prefix(['e', 'E'])?;
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            10f64.powi(digits.parse().ok()?)
        }
    };
    (value >= 0.0).then_some(value * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_parse_with_a_memory_limit() {
        for text in [NODE_OPERATOR_DEFAULT, SNAPSHOT_GATEWAY_DEFAULT] {
            let r = parse(text).expect(text);
            let limits = r.limits.expect("limits");
            assert_eq!(limits["memory"], Quantity("512Mi".into()));
            assert_eq!(r.requests.expect("requests")["cpu"], Quantity("50m".into()));
        }
    }

    #[test]
    fn quantities_are_read_as_kubernetes_writes_them() {
        assert_eq!(quantity("50m"), Some(0.05));
        assert_eq!(quantity("64Mi"), Some(64.0 * 1024.0 * 1024.0));
        assert_eq!(quantity("1.5Gi"), Some(1.5 * 1024f64.powi(3)));
        assert_eq!(quantity("2e3"), Some(2000.0));
        assert_eq!(quantity("1"), Some(1.0));
        for bad in ["", "Mi", "1.2.3", "64MB", "-1", "1e", ".", "1 Mi", "0x10"] {
            assert_eq!(quantity(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        let cases = [
            ("not json", "not resources as JSON"),
            (
                r#"{"limits":{"memory":"1Gi"},"claims":[]}"#,
                "unknown field",
            ),
            (
                r#"{"limits":{"memory":"1Gi","nvidia.com/gpu":"1"}}"#,
                "only cpu",
            ),
            (r#"{"limits":{"memory":"lots"}}"#, "not a quantity"),
            (
                r#"{"requests":{"memory":"1Gi"},"limits":{"memory":"512Mi"}}"#,
                "requests.memory \"1Gi\" is more than limits.memory \"512Mi\"",
            ),
            (r#"{"requests":{"cpu":"1"}}"#, "limits.memory must be set"),
        ];
        for (text, wanted) in cases {
            let err = parse(text).expect_err(text);
            assert!(err.contains(wanted), "{text}: {err}");
        }
        let only_limit = parse(r#"{"limits":{"memory":"1Gi","cpu":"2"}}"#).expect("parses");
        assert_eq!(only_limit.requests, None);
    }
}

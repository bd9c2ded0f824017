//! Building blocks several kinds share: patterns, well-known names and the
//! condition types both operators publish.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A Go-style duration such as `90s`, `15m`, `8760h` or `1h30m`.
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$";
/// A semantic version without a leading `v`, such as `1.35.4` or `2.1.0-rc.1`.
pub const VERSION_PATTERN: &str = r"^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]+)?$";
/// A lowercase hexadecimal SHA-256 digest.
pub const SHA256_PATTERN: &str = r"^[a-f0-9]{64}$";
/// A DNS-1123 subdomain (lowercase, dots allowed).
pub const DNS_SUBDOMAIN_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A DNS-1123 label (lowercase, no dots).
pub const DNS_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// A label value: at most 63 letters, digits, `-`, `_` and `.`, starting and
/// ending with a letter or digit (or empty).
pub const LABEL_VALUE_PATTERN: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$";
/// A package name: a DNS-1123 label.
pub const PACKAGE_NAME_PATTERN: &str = DNS_LABEL_PATTERN;

/// Label put on every Machine a CanaryRelease has claimed; the value is the
/// CanaryRelease's name. Two canaries never claim the same Machine.
pub const CANARY_LABEL: &str = "kubeonkube.io/canary";
/// Label on Nodes and Machines with the zone a host is in.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Label on Nodes and Machines with the data centre (IDC) a host is in.
pub const IDC_LABEL: &str = "kubeonkube.io/idc";
/// Label on every object the operators create for a Cluster; value: Cluster name.
pub const CLUSTER_LABEL: &str = "kubeonkube.io/cluster";
/// Label on control-plane objects naming the component they belong to.
pub const COMPONENT_LABEL: &str = "kubeonkube.io/component";

/// A reference to a key in a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub name: String,
    /// Namespace of the Secret. For cluster-scoped kinds this is required; the
    /// node-operator only reads Secrets in the namespaces it is allowed to.
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub namespace: String,
    /// Key inside the Secret's data.
    #[serde(default = "default_ssh_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_ssh_key() -> String {
    "ssh-privatekey".into()
}

/// How one operation on an object ended, as recorded in status.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub enum OperationResult {
    /// Still running.
    Running,
    /// Finished and verified.
    Succeeded,
    /// Finished with an error; see the message and output.
    Failed,
}

/// Schema of a count-or-percentage (`3` or `25%`). The length bound keeps the
/// API server's CEL cost estimate for the rules on such fields small.
pub fn int_or_percent(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "maxLength": 4,
    })
}

/// Schema of a non-empty list of at most 100 counts-or-percentages.
pub fn int_or_percent_list(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": int_or_percent(generator),
        "minItems": 1,
        "maxItems": 100,
    })
}

/// A string without control characters (C0, DEL, C1): one line of text.
pub const ONE_LINE_PATTERN: &str = r"^[^\x00-\x1f\x7f-\x{9f}]*$";
/// A label or taint key: an optional DNS-1123 subdomain prefix and `/`, then
/// a name like a non-empty label value.
pub const LABEL_KEY_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$";

/// Schema of a map whose values are strings matching `pattern`, at most
/// `max_length` long, with at most `max_properties` entries. Bounding the
/// values in the schema (rather than in a CEL rule over every entry) keeps
/// the API server's cost estimate for the map's rules small.
fn string_map(max_properties: u32, max_length: u32, pattern: &str) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": max_properties,
        "additionalProperties": {
            "type": "string",
            "maxLength": max_length,
            "pattern": pattern,
        },
    })
}

/// Schema of a map of label values (node labels).
pub fn label_value_map(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    string_map(64, 63, LABEL_VALUE_PATTERN)
}

/// Schema of a map of one-line values of at most 4096 characters (kubelet
/// flags, sysctls).
pub fn one_line_map(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    string_map(128, 4096, ONE_LINE_PATTERN)
}

/// Schema of a map of kubelet eviction thresholds: quantities or
/// percentages.
pub fn threshold_map(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    string_map(16, 16, r"^[0-9]+([.][0-9]+)?(%|[a-zA-Z]{0,2})$")
}

/// Schema of a Node's taints: label keys and values and the three effects.
pub fn taints(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 64,
        "items": {
            "type": "object",
            "description": "A taint: the Node repels Pods that do not tolerate it.",
            "required": ["key", "effect"],
            "properties": {
                "key": {
                    "type": "string",
                    "description": "Taint key, a label key such as example.com/dedicated.",
                    "maxLength": 317,
                    "pattern": LABEL_KEY_PATTERN,
                },
                "value": {
                    "type": "string",
                    "description": "Taint value, a label value.",
                    "maxLength": 63,
                    "pattern": LABEL_VALUE_PATTERN,
                },
                "effect": {
                    "type": "string",
                    "description": "NoSchedule, PreferNoSchedule or NoExecute.",
                    "enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"],
                },
                "timeAdded": {
                    "type": "string",
                    "format": "date-time",
                    "description": "When the taint was added (set by Kubernetes for NoExecute taints).",
                },
            },
        },
    })
}

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

/// Status of a user-visible condition, as in `metav1.ConditionStatus`.
pub mod condition_status {
    pub const TRUE: &str = "True";
    pub const FALSE: &str = "False";
    pub const UNKNOWN: &str = "Unknown";
}

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

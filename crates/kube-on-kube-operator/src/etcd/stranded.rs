//! Whether a member's data is stranded: kept on one node (a local volume
//! such as local-path-provisioner's, or the node directory of a hostPath
//! member) that is gone from the meta-cluster or no longer takes the
//! Cluster's Pods (cordoned for a drain, tainted, relabelled out of its
//! placement). Such a member can never start again, so the planner treats
//! its data as lost: it is replaced by a fresh member elsewhere while the
//! others keep a quorum, as a member whose claim was deleted would be.
//!
//! Only a member that is not serving is judged: one whose Pod is missing,
//! not scheduled, or bound to a node that no longer exists. A member whose
//! Pod still sits on an existing node (even a cordoned one) may come back
//! there, and is left to its kubelet.

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume, Pod,
};
use kube::ResourceExt;
use kube_on_kube_api::cluster::Placement;

use crate::etcd::spread::matches;

/// Where a member's data is kept.
#[derive(Debug, Clone, Copy)]
pub enum Home<'a> {
    /// The volume bound to its claim.
    Volume(&'a PersistentVolume),
    /// The node whose directory holds it (a hostPath member's pin).
    Node(&'a str),
}

/// Whether the member whose Pod is `pod` (not ready) and whose data is at
/// `home` can never run again: its Pod is not on an existing node, and no
/// node that takes the Cluster's Pods (`placement`) can reach its data.
pub fn stranded(
    pod: Option<&Pod>,
    home: Home<'_>,
    nodes: &[Node],
    placement: Option<&Placement>,
) -> bool {
    let bound_to = pod
        .and_then(|p| p.spec.as_ref())
        .and_then(|s| s.node_name.as_deref());
    if bound_to.is_some_and(|n| nodes.iter().any(|node| node.name_any() == n)) {
        return false;
    }
    match home {
        Home::Volume(pv) => {
            let Some(terms) = required_terms(pv) else {
                // Reachable from any node (network storage).
                return false;
            };
            !nodes
                .iter()
                .filter(|n| matches(n, placement))
                .any(|n| terms.iter().any(|t| selects(t, n)))
        }
        Home::Node(name) => !nodes
            .iter()
            .any(|n| n.name_any() == name && matches(n, placement)),
    }
}

/// The volume's required node terms (any one must select the node), if it
/// is reachable from some nodes only.
fn required_terms(pv: &PersistentVolume) -> Option<&[NodeSelectorTerm]> {
    let terms = &pv
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms;
    (!terms.is_empty()).then_some(terms.as_slice())
}

/// Whether a node selector term selects `node`, as the scheduler reads it:
/// every label expression and every field expression (only
/// `metadata.name` exists) must hold. A term with neither selects nothing.
pub fn selects(term: &NodeSelectorTerm, node: &Node) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    let labels = node.metadata.labels.as_ref();
    expressions
        .iter()
        .all(|r| holds(r, labels.and_then(|l| l.get(&r.key)).map(String::as_str)))
        && fields.iter().all(|r| {
            let name = node.metadata.name.as_deref();
            r.key == "metadata.name" && holds(r, name)
        })
}

/// One requirement against the value the node has for its key.
fn holds(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|w| w == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|w| w == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), [bound]) = (value.and_then(number), values) else {
                return false;
            };
            let Some(bound) = number(bound) else {
                return false;
            };
            if r.operator == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        // An operator the scheduler does not know selects nothing.
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        NodeSelector, NodeSpec, PersistentVolumeSpec, PodSpec, VolumeNodeAffinity,
    };

    fn node(name: &str, unschedulable: bool) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some([("kubernetes.io/hostname".to_string(), name.to_string())].into());
        n.spec = Some(NodeSpec {
            unschedulable: Some(unschedulable),
            ..Default::default()
        });
        n
    }

    /// A volume as local-path-provisioner makes it: on `host` only.
    fn local_volume(host: &str) -> PersistentVolume {
        PersistentVolume {
            spec: Some(PersistentVolumeSpec {
                node_affinity: Some(VolumeNodeAffinity {
                    required: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: "kubernetes.io/hostname".into(),
                                operator: "In".into(),
                                values: Some(vec![host.into()]),
                            }]),
                            match_fields: None,
                        }],
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod_on(node: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                node_name: node.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn data_on_a_node_that_is_gone_or_cordoned_is_stranded() {
        let pv = local_volume("meta-1");
        let others = [node("meta-2", false), node("meta-3", false)];
        let home = Home::Volume(&pv);
        // Deleted with its Machine: the Pod waits unscheduled, or is gone.
        assert!(stranded(None, home, &others, None));
        assert!(stranded(Some(&pod_on(None)), home, &others, None));
        // A Pod still bound to the deleted node says nothing of the data.
        assert!(stranded(Some(&pod_on(Some("meta-1"))), home, &others, None));

        // Cordoned for a drain, the Pod evicted.
        let mut cordoned = others.to_vec();
        cordoned.push(node("meta-1", true));
        assert!(stranded(None, home, &cordoned, None));
        // The Pod is still on it: its kubelet may bring it back.
        assert!(!stranded(
            Some(&pod_on(Some("meta-1"))),
            home,
            &cordoned,
            None
        ));

        // Back in service.
        let mut back = others.to_vec();
        back.push(node("meta-1", false));
        assert!(!stranded(None, home, &back, None));
    }

    #[test]
    fn a_volume_without_node_affinity_or_a_placement_that_excludes_its_node() {
        let network = PersistentVolume::default();
        assert!(!stranded(None, Home::Volume(&network), &[], None));

        // The node exists, but the Cluster's placement no longer takes it.
        let pv = local_volume("meta-1");
        let placement = Placement {
            node_selector: [("pool".to_string(), "control-planes".to_string())].into(),
            ..Default::default()
        };
        let nodes = [node("meta-1", false)];
        assert!(stranded(None, Home::Volume(&pv), &nodes, Some(&placement)));
        assert!(!stranded(None, Home::Volume(&pv), &nodes, None));
    }

    #[test]
    fn a_host_path_member_pinned_to_a_node() {
        let nodes = [node("meta-2", false)];
        assert!(stranded(None, Home::Node("meta-1"), &nodes, None));
        assert!(!stranded(None, Home::Node("meta-2"), &nodes, None));
    }

    #[test]
    fn node_selector_terms_read_as_the_scheduler_does() {
        let n = node("meta-1", false);
        let req = |key: &str, op: &str, values: &[&str]| NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        };
        let term =
            |e: Vec<NodeSelectorRequirement>, f: Vec<NodeSelectorRequirement>| NodeSelectorTerm {
                match_expressions: Some(e),
                match_fields: Some(f),
            };
        let host = "kubernetes.io/hostname";
        assert!(selects(
            &term(vec![req(host, "In", &["meta-1"])], vec![]),
            &n
        ));
        assert!(!selects(
            &term(vec![req(host, "NotIn", &["meta-1"])], vec![]),
            &n
        ));
        assert!(selects(&term(vec![req(host, "Exists", &[])], vec![]), &n));
        assert!(selects(
            &term(vec![req("zone", "DoesNotExist", &[])], vec![]),
            &n
        ));
        assert!(selects(
            &term(vec![], vec![req("metadata.name", "In", &["meta-1"])]),
            &n
        ));
        assert!(!selects(
            &term(vec![], vec![req("metadata.uid", "In", &["meta-1"])]),
            &n
        ));
        // Every requirement must hold; an empty term selects nothing.
        assert!(!selects(
            &term(
                vec![req(host, "In", &["meta-1"]), req("zone", "Exists", &[])],
                vec![]
            ),
            &n
        ));
        assert!(!selects(&term(vec![], vec![]), &n));
        // Gt and Lt compare whole numbers.
        let mut numbered = n.clone();
        numbered
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("gen".into(), "5".into());
        assert!(selects(
            &term(vec![req("gen", "Gt", &["4"])], vec![]),
            &numbered
        ));
        assert!(!selects(
            &term(vec![req("gen", "Lt", &["4"])], vec![]),
            &numbered
        ));
        assert!(!selects(
            &term(vec![req("gen", "Gt", &["x"])], vec![]),
            &numbered
        ));
    }
}

//! Keeping a Production Cluster's etcd members on different nodes: whether
//! enough meta-cluster nodes match the Cluster's placement for the members'
//! anti-affinity to be required (else only preferred), and the `EtcdSpread`
//! condition read back from the member Pods.

use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use kube::api::{Api, ListParams};
use kube_on_kube_api::cluster::Placement;

use super::health::Health;
use crate::render::etcd::{Spread, pod_spread};

/// Whether `node` can take a control-plane Pod placed as `placement` says:
/// schedulable, with every node-selector label, and every taint that keeps
/// Pods off tolerated.
pub fn matches(node: &Node, placement: Option<&Placement>) -> bool {
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable) == Some(true) {
        return false;
    }
    let labels = node.metadata.labels.as_ref();
    let selector_ok = placement
        .into_iter()
        .flat_map(|p| &p.node_selector)
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v));
    let tolerations: &[Toleration] = placement.map_or(&[], |p| &p.tolerations);
    let taints_ok = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect != "PreferNoSchedule")
        .all(|t| tolerations.iter().any(|tol| tolerates(tol, t)));
    selector_ok && taints_ok
}

/// A toleration's match of a taint, as the scheduler judges it.
fn tolerates(tol: &Toleration, taint: &Taint) -> bool {
    let effect_ok = tol
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key_ok = match tol.key.as_deref() {
        None | Some("") => tol.operator.as_deref() == Some("Exists"),
        Some(key) => key == taint.key,
    };
    let value_ok = match tol.operator.as_deref() {
        Some("Exists") => true,
        _ => tol.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default(),
    };
    effect_ok && key_ok && value_ok
}

/// The spread of `members` members over `nodes`: required when at least
/// that many nodes can take them.
pub fn decide(nodes: &[Node], placement: Option<&Placement>, members: usize) -> Spread {
    let fit = nodes.iter().filter(|n| matches(n, placement)).count();
    if fit >= members {
        Spread::Required
    } else {
        Spread::Preferred
    }
}

/// The spread for new member Pods of a Cluster of `members` members: the
/// meta-cluster's Nodes are read only when a member Pod is about to be
/// created. Without the right to list Nodes (an operator bound to one
/// namespace) the members are spread where the scheduler can.
pub async fn for_new_pods(
    client: &kube::Client,
    placement: Option<&Placement>,
    members: usize,
) -> Spread {
    match Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(nodes) => decide(&nodes.items, placement, members),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the meta-cluster's Nodes; etcd members are spread where the scheduler can");
            Spread::Preferred
        }
    }
}

/// `EtcdSpread`, read from the member Pods as they were created.
pub fn condition(desired: usize, pods: &[Pod]) -> Health {
    if desired <= 1 {
        return Health {
            ready: true,
            reason: "SingleMember",
            message: "one etcd member: nothing to spread".into(),
        };
    }
    let spreads: Vec<Option<Spread>> = pods.iter().map(pod_spread).collect();
    let loose = spreads
        .iter()
        .filter(|s| **s != Some(Spread::Required))
        .count();
    if loose == 0 {
        Health {
            ready: true,
            reason: "OnePerNode",
            message: format!(
                "every etcd member Pod requires a node of its own ({} members)",
                pods.len()
            ),
        }
    } else if spreads.contains(&Some(Spread::Preferred)) {
        Health {
            ready: false,
            reason: "NotEnoughNodes",
            message: format!(
                "{loose} of {} etcd member Pods may share a node: fewer than {desired} schedulable meta-cluster nodes match the Cluster's placement (or the operator may not list Nodes); members created once there are enough require a node of their own",
                pods.len()
            ),
        }
    } else {
        Health {
            ready: false,
            reason: "NotSpread",
            message: format!(
                "{loose} of {} etcd member Pods were created without anti-affinity; each gets it when it is next restarted",
                pods.len()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;
    use std::collections::BTreeMap;

    fn node(labels: &[(&str, &str)], taints: Vec<Taint>, unschedulable: bool) -> Node {
        let mut n = Node::default();
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        n.spec = Some(NodeSpec {
            taints: Some(taints),
            unschedulable: Some(unschedulable),
            ..Default::default()
        });
        n
    }

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            value: Some("true".into()),
            time_added: None,
        }
    }

    fn placement() -> Placement {
        Placement {
            node_selector: BTreeMap::from([("role".to_string(), "cp".to_string())]),
            tolerations: vec![Toleration {
                key: Some("dedicated".into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn only_nodes_that_can_take_the_pods_count() {
        let p = placement();
        let fit = node(
            &[("role", "cp")],
            vec![taint("dedicated", "NoSchedule")],
            false,
        );
        assert!(matches(&fit, Some(&p)));
        // Wrong label, cordoned, an untolerated taint: not counted.
        assert!(!matches(
            &node(&[("role", "worker")], vec![], false),
            Some(&p)
        ));
        assert!(!matches(&node(&[("role", "cp")], vec![], true), Some(&p)));
        assert!(!matches(
            &node(&[("role", "cp")], vec![taint("gpu", "NoExecute")], false),
            Some(&p)
        ));
        // A soft taint does not keep Pods off.
        assert!(matches(
            &node(
                &[("role", "cp")],
                vec![taint("gpu", "PreferNoSchedule")],
                false
            ),
            Some(&p)
        ));
        // No placement: any schedulable, untainted node.
        assert!(matches(&node(&[], vec![], false), None));
    }

    #[test]
    fn required_with_a_node_per_member_preferred_with_fewer() {
        let p = placement();
        let cp = || node(&[("role", "cp")], vec![], false);
        let other = node(&[("role", "worker")], vec![], false);
        let three = [cp(), cp(), cp(), other.clone()];
        assert_eq!(decide(&three, Some(&p), 3), Spread::Required);
        let one = [cp(), other.clone(), other];
        assert_eq!(decide(&one, Some(&p), 3), Spread::Preferred);
        assert_eq!(decide(&[], Some(&p), 3), Spread::Preferred);
    }
}

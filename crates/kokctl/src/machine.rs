//! `kubectl kok machine …`: the hosts of a business cluster, as a list and one
//! at a time in detail.

use std::fmt::Write as _;

use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::Machine;

use crate::error::{Call, Error};
use crate::output::{self, Output, or_dash};

fn call<'a>(verb: &'static str, name: Option<&'a str>) -> Call<'a> {
    Call {
        verb,
        kind: "Machine",
        plural: "machines",
        name,
        namespace: None,
        cluster: "is --kubeconfig/--context pointing at a business cluster (kubectl kok cluster kubeconfig NAME)?",
        list: "kubectl kok machine list",
    }
}

/// Every Machine.
pub async fn list(client: Client, output: Output) -> Result<(), Error> {
    let list = Api::<Machine>::all(client)
        .list(&ListParams::default())
        .await
        .map_err(|e| call("list", None).error(e))?;
    output::list(output, &list.items, row, &HEADER)
}

/// One Machine in detail.
pub async fn describe(client: Client, name: &str, output: Output) -> Result<(), Error> {
    let machine = Api::<Machine>::all(client)
        .get(name)
        .await
        .map_err(|e| call("get", Some(name)).error(e))?;
    output::one(output, &machine, describe_text)
}

const HEADER: [&str; 6] = ["NAME", "IP", "PHASE", "NODE", "KUBELET", "CANARY"];

/// One row of `machine list`.
pub fn row(m: &Machine) -> Vec<String> {
    let status = m.status.clone().unwrap_or_default();
    vec![
        m.name_any(),
        m.spec.ip.clone(),
        or_dash(status.phase.map(|p| format!("{p:?}"))),
        or_dash(status.node_name),
        or_dash(status.installed.get("kubelet").map(|p| p.version.clone())),
        or_dash(status.canary),
    ]
}

/// `machine describe` text: identity, packages, conditions and the last
/// operation with its output tail.
pub fn describe_text(m: &Machine) -> String {
    let status = m.status.clone().unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(out, "Name:        {}", m.name_any());
    let _ = writeln!(out, "IP:          {}", m.spec.ip);
    let _ = writeln!(
        out,
        "Phase:       {}",
        or_dash(status.phase.map(|p| format!("{p:?}")))
    );
    let _ = writeln!(out, "Node:        {}", or_dash(status.node_name.clone()));
    let _ = writeln!(out, "Canary:      {}", or_dash(status.canary.clone()));
    if let Some(host) = &status.host {
        let _ = writeln!(
            out,
            "Host:        {} {} {} {}",
            host.hostname,
            host.arch,
            host.os.clone().unwrap_or_default(),
            host.kernel.clone().unwrap_or_default()
        );
    }
    let _ = writeln!(out, "Packages:");
    if status.installed.is_empty() {
        let _ = writeln!(out, "  (none installed)");
    }
    for (name, p) in &status.installed {
        let _ = writeln!(
            out,
            "  {name:<12} {:<12} from {:<24} previous {:<10} {}",
            p.version,
            p.package_version,
            or_dash(p.previous.clone()),
            if p.healthy { "healthy" } else { "unhealthy" }
        );
    }
    let _ = writeln!(out, "Conditions:");
    if status.conditions.is_empty() {
        let _ = writeln!(out, "  (none reported)");
    }
    for c in &status.conditions {
        let _ = writeln!(
            out,
            "  {:<20} {:<8} {:<20} {}",
            c.type_, c.status, c.reason, c.message
        );
    }
    if let Some(op) = &status.last_operation {
        let _ = writeln!(
            out,
            "Last operation: {} ({:?}), started {}",
            op.step, op.result, op.started_at.0
        );
        if let Some(message) = &op.message {
            let _ = writeln!(out, "  {message}");
        }
        if let Some(tail) = &op.output_tail {
            let _ = writeln!(out, "  output:");
            for line in tail.lines() {
                let _ = writeln!(out, "    {line}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_shows_spec_and_empty_status() {
        let example = include_str!("../../../examples/machine.yaml");
        let doc = example.split("\n---\n").last().expect("document");
        let m: Machine = serde_norway::from_str(doc).expect("example");
        let text = describe_text(&m);
        assert!(
            text.contains(&format!("IP:          {}", m.spec.ip)),
            "{text}"
        );
        assert!(text.contains("(none installed)"), "{text}");
        assert!(text.contains("Phase:       -"), "{text}");
        assert_eq!(row(&m)[2], "-");
    }
}

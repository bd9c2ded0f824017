//! Deleting a Machine: cordon and drain its Node, stop and remove every
//! package from the host, delete the Node and the Machine's bootstrap
//! tokens, then release the finalizer. A host that stays unreachable past
//! the offboard timeout does not hold the Machine forever: it is released
//! with a Warning Event saying the host was not cleaned.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube_on_kube_api::machine::{MachinePhase, MachineStatus};
use kube_on_kube_api::{Machine, PackageVersion};

use super::fetch::{self, ssh_target};
use super::{plan, status};
use crate::context::Context;
use crate::host::{Host, Removal};
use crate::{Error, bootstrap, drain, paths};
use kok_common::finalizer;

/// Finalizer that holds a Machine until its host is cleaned and its Node gone.
pub const FINALIZER: &str = "kubeonkube.io/machine";

/// What to remove for each package the host may have: the packages the
/// Machine's status lists and those it should run, with units and links from
/// their PackageVersions when these still exist. A name that is not a
/// package name (a status key such as `../../etc`, written by whoever may
/// patch the status) is left out: it never reaches `rm`.
pub fn removals(installed: &[String], specs: &BTreeMap<String, PackageVersion>) -> Vec<Removal> {
    let mut out: BTreeMap<String, Removal> = installed
        .iter()
        .filter(|p| paths::package_name(p).is_ok())
        .map(|p| {
            (
                p.clone(),
                Removal {
                    package: p.clone(),
                    ..Default::default()
                },
            )
        })
        .collect();
    for pv in specs
        .values()
        .filter(|pv| paths::package_name(&pv.spec.package).is_ok())
    {
        let r = out
            .entry(pv.spec.package.clone())
            .or_insert_with(|| Removal {
                package: pv.spec.package.clone(),
                ..Default::default()
            });
        if let Some(unit) = &pv.spec.install.systemd_unit {
            r.unit = Some(unit.name.clone());
        }
        if r.before_remove.is_empty() {
            r.before_remove = pv.spec.install.before_remove.clone();
        }
        for b in &pv.spec.install.binaries {
            if let Some(link) = &b.link
                && !r.links.contains(link)
            {
                r.links.push(link.clone());
            }
        }
    }
    // The kubelet goes first so the Node stops before its runtime does.
    let mut list: Vec<Removal> = out.into_values().collect();
    list.sort_by_key(|r| (r.package != "kubelet", r.package.clone()));
    list
}

pub async fn offboard(machine: &Machine, ctx: &Context) -> Result<Action, Error> {
    let name = machine.name_any();
    if !finalizer::has(machine, FINALIZER) {
        return Ok(Action::await_change());
    }
    let mut st = machine.status.clone().unwrap_or_default();
    if st.phase != Some(MachinePhase::Deleting) {
        st.phase = Some(MachinePhase::Deleting);
        status::begin(&mut st, "offboard");
        status::write(ctx, machine, &st).await?;
    }
    let node_name = plan::node_name(machine);
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    if let Some(node) = nodes
        .get_opt(&node_name)
        .await
        .map_err(Error::kube(format!("get Node {node_name}")))?
    {
        drain::cordon(&ctx.client, &node, "offboarding").await?;
        let evicted = drain::drain(&ctx.client, &node_name, ctx.settings.drain_timeout).await?;
        ctx.event(
            machine,
            EventType::Normal,
            "Drained",
            "Offboard",
            format!("cordoned and drained Node {node_name} ({evicted} Pod(s) evicted)"),
        )
        .await;
    }

    match clean_host(machine, ctx, &st).await {
        Ok(tail) => {
            ctx.event(
                machine,
                EventType::Normal,
                "HostCleaned",
                "Offboard",
                format!(
                    "stopped and removed every package from {}: {}",
                    machine.spec.ip,
                    tail.lines().last().unwrap_or_default()
                ),
            )
            .await;
        }
        Err(e) if gave_up(machine, ctx.settings.offboard_timeout) => {
            ctx.event(
                machine,
                EventType::Warning,
                "HostNotCleaned",
                "Offboard",
                format!(
                    "releasing the Machine without cleaning its host after {:?}: {e}",
                    ctx.settings.offboard_timeout
                ),
            )
            .await;
        }
        Err(e) => {
            ctx.sessions.forget(&name).await;
            return Err(e);
        }
    }
    ctx.sessions.forget(&name).await;

    match nodes.delete(&node_name, &DeleteParams::default()).await {
        Ok(_) => {
            ctx.event(
                machine,
                EventType::Normal,
                "NodeDeleted",
                "Offboard",
                format!("deleted Node {node_name}"),
            )
            .await;
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(Error::kube(format!("delete Node {node_name}"))(e)),
    }
    bootstrap::delete_tokens(&ctx.client, &name).await?;
    finalizer::remove(&Api::<Machine>::all(ctx.client.clone()), machine, FINALIZER)
        .await
        .map_err(Error::kube(format!("remove finalizer from Machine {name}")))?;
    ctx.forget(&name);
    Ok(Action::await_change())
}

/// Whether the offboard timeout since the deletion request has passed.
fn gave_up(machine: &Machine, timeout: Duration) -> bool {
    let Some(deleted) = &machine.metadata.deletion_timestamp else {
        return false;
    };
    let since = Timestamp::now().duration_since(deleted.0);
    since.as_secs() >= i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX)
}

async fn clean_host(machine: &Machine, ctx: &Context, st: &MachineStatus) -> Result<String, Error> {
    let pvs: Api<PackageVersion> = Api::all(ctx.client.clone());
    let mut specs = BTreeMap::new();
    // Whatever the Machine ran or should run, as far as it is still known.
    let mut names: Vec<String> = st
        .installed
        .values()
        .map(|i| i.package_version.clone())
        .collect();
    if let Ok((wanted, _)) = fetch::wanted(ctx, machine).await {
        names.extend(wanted.into_iter().map(|w| w.package_version));
    }
    for pv_name in names {
        if let Some(pv) = pvs
            .get_opt(&pv_name)
            .await
            .map_err(Error::kube(format!("get PackageVersion {pv_name}")))?
        {
            specs.insert(pv_name, pv);
        }
    }
    let installed: Vec<String> = st.installed.keys().cloned().collect();
    for name in installed.iter().filter(|p| paths::package_name(p).is_err()) {
        tracing::warn!(machine = %machine.name_any(), package = ?name, "status.installed names no package; nothing removed for it");
        ctx.event(
            machine,
            EventType::Warning,
            "UnsafePath",
            "Offboard",
            format!("status.installed names {name:?}, which is not a package name; nothing was removed for it"),
        )
        .await;
    }
    let removals = removals(&installed, &specs);
    let target = ssh_target(ctx, machine).await?;
    let _slot = ctx.ssh_slot().await?;
    let session = ctx
        .sessions
        .get(&machine.name_any(), &target, ctx.settings.ssh_timeouts)
        .await?;
    Host::new(&session).offboard(&removals).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_on_kube_api::package::{Binary, InstallSpec, PackageVersionSpec, SystemdUnit};

    #[test]
    fn removals_cover_installed_and_known_packages_kubelet_first() {
        let pv = PackageVersion::new(
            "kubelet-1.0.0",
            PackageVersionSpec {
                package: "kubelet".into(),
                version: "1.0.0".into(),
                artifacts: vec![],
                install: InstallSpec {
                    before_remove: vec![],
                    binaries: vec![Binary {
                        path: "bin/kubelet".into(),
                        link: Some("/usr/local/bin/kubelet".into()),
                    }],
                    files: vec![],
                    systemd_unit: Some(SystemdUnit {
                        name: "kubelet.service".into(),
                        content: "x".into(),
                    }),
                    requires_drain: false,
                },
                health_check: None,
                depends_on: vec![],
            },
        );
        let list = removals(
            &["containerd".to_string(), "kubelet".to_string()],
            &BTreeMap::from([("kubelet-1.0.0".to_string(), pv)]),
        );
        assert_eq!(list[0].package, "kubelet");
        assert_eq!(list[0].unit.as_deref(), Some("kubelet.service"));
        assert_eq!(list[0].links, vec!["/usr/local/bin/kubelet"]);
        assert_eq!(list[1].package, "containerd");
        assert_eq!(list[1].unit, None);
    }

    #[test]
    fn forged_status_keys_never_become_removals() {
        let forged = ["../../etc", "/", "..", "kubelet/../../..", "a b", ""];
        let installed: Vec<String> = forged.iter().map(|s| s.to_string()).collect();
        assert!(removals(&installed, &BTreeMap::new()).is_empty());
        let script = crate::host::offboard_script(&removals(&installed, &BTreeMap::new()));
        assert!(!script.contains("rm -rf"), "{script}");
    }
}

//! What a Machine reconcile reads before it plans: the PackageVersions the
//! Machine should run, its Node and its SSH login (the private key from its
//! Secret). Converging and offboarding both start from these.

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::Api;
use kube::{Client, ResourceExt};
use kube_on_kube_api::{ClusterPackageVersion, Machine};

use super::plan::{self, Wanted};
use crate::Error;
use crate::context::Context;
use crate::rollout;
use crate::ssh::Target;

/// The PackageVersions `machine` should run, in install order.
pub async fn wanted(
    ctx: &Context,
    machine: &Machine,
) -> Result<(Vec<Wanted>, Option<ClusterPackageVersion>), Error> {
    let cpv = ctx.cluster_default("default").await?;
    let target = rollout::target(machine, cpv.as_ref());
    let mut wanted = Vec::new();
    for (package, pv_name) in &target.packages {
        let pv = ctx.package_version(pv_name).await?;
        rollout::check_package_version(package, pv_name, pv.as_ref())
            .map_err(Error::MissingPackageVersion)?;
        if let Some(pv) = pv {
            wanted.push(Wanted {
                package: package.clone(),
                package_version: pv_name.clone(),
                spec: pv.spec,
            });
        }
    }
    let ordered = plan::order(wanted).map_err(|detail| Error::InvalidSpec {
        machine: machine.name_any(),
        detail,
    })?;
    Ok((ordered, cpv))
}

/// The SSH login of `machine`, with the private key from its Secret. The
/// Secret must be in one of `namespaces`; whether it is not, does not exist,
/// lacks the key or may not be read, the Machine's author is told the same,
/// so a Machine cannot be used to learn which other Secrets exist.
pub async fn ssh_target(
    client: &Client,
    namespaces: &[String],
    machine: &Machine,
) -> Result<Target, Error> {
    let r = &machine.spec.ssh.private_key_secret_ref;
    let unusable = || Error::MissingSecret {
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        detail: format!(
            "it does not exist, has no data entry {:?}, or is not in a namespace the operator reads SSH keys from ({})",
            r.key,
            namespaces.join(", ")
        ),
    };
    if !namespaces.contains(&r.namespace) {
        return Err(unusable());
    }
    let secret = match Api::<Secret>::namespaced(client.clone(), &r.namespace)
        .get_opt(&r.name)
        .await
    {
        Ok(Some(secret)) => secret,
        Ok(None) => return Err(unusable()),
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404 => return Err(unusable()),
        Err(e) => {
            return Err(Error::kube(format!(
                "get Secret {}/{}",
                r.namespace, r.name
            ))(e));
        }
    };
    let pem = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&r.key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .ok_or_else(unusable)?;
    let ip = machine.spec.ip.parse().map_err(|_| Error::InvalidSpec {
        machine: machine.name_any(),
        detail: format!("spec.ip {:?} is not an IP address", machine.spec.ip),
    })?;
    Ok(Target {
        ip,
        port: u16::try_from(machine.spec.ssh.port).unwrap_or(22),
        user: machine.spec.ssh.user.clone(),
        private_key_pem: pem,
        host_public_key: machine.spec.ssh.host_public_key.clone(),
    })
}

pub(super) async fn get_node(client: &Client, name: &str) -> Result<Option<Node>, Error> {
    Api::<Node>::all(client.clone())
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("get Node {name}")))
}

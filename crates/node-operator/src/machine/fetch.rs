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
use kok_common::network::Network;
use std::net::IpAddr;

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

/// The SSH login of `machine`, with the private key from its Secret. Its
/// address must be outside the operator's refused networks, checked
/// first. The Secret must be in one of the operator's SSH key namespaces;
/// whether it is not, does not exist, lacks the key or may not be read, the
/// Machine's author is told the same, so a Machine cannot be used to learn
/// which other Secrets exist.
pub async fn ssh_target(ctx: &Context, machine: &Machine) -> Result<Target, Error> {
    let ip = address(machine, &ctx.settings.refused_networks)?;
    let client = &ctx.client;
    let namespaces = &ctx.settings.ssh_key_namespaces;
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
    Ok(Target {
        ip,
        port: u16::try_from(machine.spec.ssh.port).unwrap_or(22),
        user: machine.spec.ssh.user.clone(),
        private_key_pem: pem,
        host_public_key: machine.spec.ssh.host_public_key.clone(),
    })
}

/// The Machine's address, unless it is in one of the `refused` networks
/// (the operator's own: see `--refused-machine-networks`).
pub fn address(machine: &Machine, refused: &[Network]) -> Result<IpAddr, Error> {
    let invalid = |detail: String| Error::InvalidSpec {
        machine: machine.name_any(),
        detail,
    };
    let ip: IpAddr = machine.spec.ip.parse().map_err(|_| {
        invalid(format!(
            "spec.ip {:?} is not an IP address",
            machine.spec.ip
        ))
    })?;
    match refused.iter().find(|n| n.contains(&ip)) {
        Some(network) => Err(invalid(format!(
            "spec.ip {ip} is in {network}, a network of the cluster the node-operator runs in (--refused-machine-networks): a Machine must be a host outside it"
        ))),
        None => Ok(ip),
    }
}

pub(super) async fn get_node(client: &Client, name: &str) -> Result<Option<Node>, Error> {
    Api::<Node>::all(client.clone())
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("get Node {name}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(ip: &str) -> Machine {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kubeonkube.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": "m"},
            "spec": {
                "ip": ip,
                "ssh": {"privateKeySecretRef": {"name": "k", "namespace": "kube-system"},
                        "hostPublicKey": "ssh-ed25519 AAAA"},
            },
        }))
        .expect("machine")
    }

    #[test]
    fn a_machine_in_the_operators_own_networks_is_refused_before_any_connection() {
        let refused: Vec<Network> = ["10.96.0.0/12", "10.244.0.0/16", "fd00:10::/64"]
            .iter()
            .map(|n| n.parse().unwrap())
            .collect();
        for inside in ["10.96.0.1", "10.244.3.7", "fd00:10::5"] {
            let e = address(&machine(inside), &refused).unwrap_err();
            assert!(matches!(e, Error::InvalidSpec { .. }), "{inside}: {e}");
            assert!(e.to_string().contains("--refused-machine-networks"), "{e}");
        }
        for outside in ["192.0.2.10", "10.112.0.1", "2001:db8::1"] {
            assert_eq!(
                address(&machine(outside), &refused).unwrap(),
                outside.parse::<IpAddr>().unwrap()
            );
        }
        // No networks given: only the address's form is checked.
        assert!(address(&machine("10.96.0.1"), &[]).is_ok());
        assert!(address(&machine("not-an-ip"), &[]).is_err());
    }
}

//! Kubelet serving certificates signed by the cluster CA.
//!
//! The kubelets the node-operator installs ask for their serving
//! certificate with a CertificateSigningRequest (`serverTLSBootstrap`,
//! signer `kubernetes.io/kubelet-serving`), as kubeadm recommends, instead
//! of serving a self-signed one that no client can verify (metrics-server,
//! `kubectl logs` with a CA). Kubernetes approves no such request by
//! itself: a node could otherwise claim any name or address. This
//! controller approves one only when it comes from the Node of a Machine
//! and names nothing but that Machine: the requester is
//! `system:node:<node>` in `system:nodes`, the subject is the same, the
//! DNS names are the Node's name, the IP addresses the Machine's address,
//! and the usages those of a TLS server. A request from such a Node that
//! asks for more is denied, with the reason; one from a Node that is no
//! Machine's is left to whoever else approves in this cluster.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kok_common::conditions::Status;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt as _};
use kube_on_kube_api::Machine;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer as _;

use crate::machine::plan::node_name;

/// The signer of kubelet serving certificates.
pub const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";

/// How often pending requests are looked at again without a change (a
/// request may come before its Machine is in the cache).
const RESYNC: Duration = Duration::from_secs(10);

/// What to do with a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It names only what its Machine is: approve, saying so.
    Approve(String),
    /// It comes from a Machine's Node and asks for more: deny, saying why.
    Deny(String),
    /// Not ours to decide (another signer, no Machine's Node, already
    /// decided).
    Ignore,
}

/// The verdict on `csr` given the Machines of this cluster.
pub fn judge<'a>(
    csr: &CertificateSigningRequest,
    machines: impl IntoIterator<Item = &'a Machine>,
) -> Verdict {
    let spec = &csr.spec;
    if spec.signer_name != KUBELET_SERVING || decided(csr) {
        return Verdict::Ignore;
    }
    let Some(node) = spec
        .username
        .as_deref()
        .and_then(|u| u.strip_prefix("system:node:"))
    else {
        return Verdict::Ignore;
    };
    let Some(machine) = machines.into_iter().find(|m| node_name(m) == node) else {
        return Verdict::Ignore;
    };
    match check(csr, node, machine) {
        Ok(()) => Verdict::Approve(format!(
            "kubelet serving certificate of Machine {}: names only its Node {node} and address {}",
            machine.name_any(),
            machine.spec.ip
        )),
        Err(why) => Verdict::Deny(format!(
            "kubelet serving certificate requested for Machine {}'s Node {node}: {why}",
            machine.name_any()
        )),
    }
}

/// Whether the request is approved or denied already.
fn decided(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Approved" || c.type_ == "Denied")
        })
}

/// Everything the request asks for is what `machine` is.
fn check(csr: &CertificateSigningRequest, node: &str, machine: &Machine) -> Result<(), String> {
    let spec = &csr.spec;
    let groups = spec.groups.as_deref().unwrap_or_default();
    if !groups.iter().any(|g| g == "system:nodes") {
        return Err("the requester is not in the group system:nodes".into());
    }
    let usages: BTreeSet<&str> = spec.usages.iter().flatten().map(String::as_str).collect();
    let allowed: BTreeSet<&str> = ["digital signature", "key encipherment", "server auth"].into();
    if !usages.contains("server auth") || !usages.is_subset(&allowed) {
        return Err(format!(
            "usages {usages:?} are not those of a TLS server ({allowed:?}, with server auth)"
        ));
    }
    let pem = x509_parser::pem::parse_x509_pem(&spec.request.0)
        .map_err(|e| format!("the request is not PEM: {e}"))?
        .1;
    if pem.label != "CERTIFICATE REQUEST" {
        return Err(format!("the request is a PEM {:?}", pem.label));
    }
    let (_, request) = X509CertificationRequest::from_der(&pem.contents)
        .map_err(|e| format!("the request does not parse: {e}"))?;
    let info = &request.certification_request_info;
    let common_names: Vec<&str> = info
        .subject
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok())
        .collect();
    let want = format!("system:node:{node}");
    if common_names != [want.as_str()] {
        return Err(format!(
            "the subject's common name is {common_names:?}, not {want:?}"
        ));
    }
    let organizations: Vec<&str> = info
        .subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .collect();
    if organizations != ["system:nodes"] {
        return Err(format!(
            "the subject's organization is {organizations:?}, not [\"system:nodes\"]"
        ));
    }
    let address: IpAddr = machine.spec.ip.parse().map_err(|_| {
        format!(
            "the Machine's address {:?} is no IP address",
            machine.spec.ip
        )
    })?;
    let mut names = 0;
    for extension in request.requested_extensions().into_iter().flatten() {
        let ParsedExtension::SubjectAlternativeName(san) = extension else {
            continue;
        };
        for name in &san.general_names {
            names += 1;
            match name {
                GeneralName::DNSName(dns) if *dns == node => {}
                GeneralName::IPAddress(bytes) if ip_of(bytes) == Some(address) => {}
                other => {
                    let shown = match other {
                        GeneralName::DNSName(dns) => format!("DNS:{dns}"),
                        GeneralName::IPAddress(bytes) => ip_of(bytes)
                            .map_or_else(|| format!("IP:{bytes:02x?}"), |ip| format!("IP:{ip}")),
                        other => other.to_string(),
                    };
                    return Err(format!(
                        "the subject alternative name {shown} is neither the Node's name \
                         {node} nor the Machine's address {address}"
                    ));
                }
            }
        }
    }
    if names == 0 {
        return Err("the request names no subject alternative name".into());
    }
    Ok(())
}

/// The address in a SAN's 4 or 16 bytes.
fn ip_of(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// Approves or denies the kubelet serving requests of the Machines' Nodes
/// until shutdown is requested (SIGTERM/SIGINT), as the controllers stop.
pub async fn run(client: Client, machines: Store<Machine>) {
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let (store, writer) = reflector::store();
    let config = watcher::Config::default().fields(&format!("spec.signerName={KUBELET_SERVING}"));
    let mut changes = watcher(api.clone(), config)
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .boxed();
    let mut tick = tokio::time::interval(RESYNC);
    let shutdown = kok_common::shutdown::requested();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            change = changes.next() => match change {
                Some(Ok(_)) => {}
                Some(Err(error)) => tracing::warn!(%error, "watching CertificateSigningRequests"),
                None => return,
            },
            _ = tick.tick() => {}
        }
        let ready = tokio::select! {
            () = &mut shutdown => return,
            ready = machines.wait_until_ready() => ready,
        };
        if ready.is_err() {
            return;
        }
        let known: Vec<Arc<Machine>> = machines.state();
        for csr in store.state() {
            let (type_, reason, message) =
                match judge(&csr, known.iter().map(std::convert::AsRef::as_ref)) {
                    Verdict::Ignore => continue,
                    Verdict::Approve(m) => ("Approved", "MachineNodeServingCertificate", m),
                    Verdict::Deny(m) => ("Denied", "NotTheMachine", m),
                };
            let patch = serde_json::json!({"status": {"conditions": [{
                "type": type_, "status": Status::True.as_str(), "reason": reason, "message": message,
            }]}});
            match api
                .patch_approval(
                    &csr.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) if type_ == "Approved" => {
                    tracing::info!(csr = %csr.name_any(), %message, "approved");
                }
                Ok(_) => tracing::warn!(csr = %csr.name_any(), %message, "denied"),
                Err(error) => {
                    tracing::warn!(csr = %csr.name_any(), %error, "cannot record the decision");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn machine(name: &str, ip: &str) -> Machine {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kubeonkube.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": name},
            "spec": {
                "ip": ip,
                "ssh": {"privateKeySecretRef": {"name": "k", "namespace": "kube-system"},
                        "hostPublicKey": "ssh-ed25519 AAAA"},
            },
        }))
        .expect("machine")
    }

    /// A request as the kubelet makes it, with `cn`, `org` and `sans`.
    fn request(cn: &str, org: &str, sans: &[&str]) -> String {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params =
            rcgen::CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, org);
        params
            .serialize_request(&key)
            .expect("csr")
            .pem()
            .expect("pem")
    }

    fn csr(user: &str, pem: &str, usages: &[&str]) -> CertificateSigningRequest {
        let mut c = CertificateSigningRequest::default();
        c.metadata.name = Some("csr-1".into());
        c.spec.signer_name = KUBELET_SERVING.into();
        c.spec.username = Some(user.into());
        c.spec.groups = Some(vec!["system:nodes".into(), "system:authenticated".into()]);
        c.spec.usages = Some(usages.iter().map(|u| (*u).to_owned()).collect());
        c.spec.request = ByteString(pem.as_bytes().to_vec());
        c
    }

    const SERVER: [&str; 3] = ["digital signature", "key encipherment", "server auth"];

    #[test]
    fn a_machine_nodes_own_name_and_address_are_approved() {
        let ms = [machine("worker-a1", "10.0.12.34")];
        let pem = request(
            "system:node:worker-a1",
            "system:nodes",
            &["worker-a1", "10.0.12.34"],
        );
        let v = judge(&csr("system:node:worker-a1", &pem, &SERVER), &ms);
        assert!(matches!(v, Verdict::Approve(_)), "{v:?}");
    }

    #[test]
    fn anything_more_is_denied_with_the_reason() {
        let ms = [machine("worker-a1", "10.0.12.34")];
        let user = "system:node:worker-a1";
        let cases = [
            (
                request(user, "system:nodes", &["worker-a1", "10.0.12.35"]),
                &SERVER[..],
                "10.0.12.35",
            ),
            (
                request(user, "system:nodes", &["kubernetes.default.svc"]),
                &SERVER[..],
                "kubernetes.default.svc",
            ),
            (
                request("system:node:other", "system:nodes", &["worker-a1"]),
                &SERVER[..],
                "common name",
            ),
            (
                request(user, "system:masters", &["worker-a1"]),
                &SERVER[..],
                "organization",
            ),
            (
                request(user, "system:nodes", &["worker-a1"]),
                &["digital signature", "client auth", "server auth"][..],
                "usages",
            ),
            (
                request(user, "system:nodes", &[]),
                &SERVER[..],
                "no subject",
            ),
            ("not a request".to_owned(), &SERVER[..], "PEM"),
        ];
        for (pem, usages, why) in cases {
            match judge(&csr(user, &pem, usages), &ms) {
                Verdict::Deny(m) => assert!(m.contains(why), "{why}: {m}"),
                other => panic!("{why}: {other:?}"),
            }
        }
    }

    #[test]
    fn other_signers_nodes_and_decided_requests_are_left_alone() {
        let ms = [machine("worker-a1", "10.0.12.34")];
        let pem = request("system:node:worker-b", "system:nodes", &["worker-b"]);
        // No Machine's Node.
        assert_eq!(
            judge(&csr("system:node:worker-b", &pem, &SERVER), &ms),
            Verdict::Ignore
        );
        // Not a node at all.
        assert_eq!(judge(&csr("alice", &pem, &SERVER), &ms), Verdict::Ignore);
        let pem = request("system:node:worker-a1", "system:nodes", &["worker-a1"]);
        let mut other = csr("system:node:worker-a1", &pem, &SERVER);
        other.spec.signer_name = "kubernetes.io/kube-apiserver-client-kubelet".into();
        assert_eq!(judge(&other, &ms), Verdict::Ignore);
        let mut done = csr("system:node:worker-a1", &pem, &SERVER);
        done.status = Some(Default::default());
        done.status.as_mut().expect("status").conditions = Some(vec![
            k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition {
                type_: "Denied".into(),
                status: "True".into(),
                ..Default::default()
            },
        ]);
        assert_eq!(judge(&done, &ms), Verdict::Ignore);
    }
}

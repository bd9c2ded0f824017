//! Kubelet certificates signed by the cluster CA: the serving certificate of
//! a Machine's Node, and the client certificate a kubelet joining with its
//! Machine's bootstrap token asks for.
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
//!
//! The first client certificate (signer
//! `kubernetes.io/kube-apiserver-client-kubelet`) is asked for with a
//! bootstrap token. Kubernetes would approve it for any node name the token
//! holder chose (the `nodeclient` right of `system:bootstrappers`, which the
//! add-ons no longer grant): a host holding a token could become any Node.
//! Here a request made with a Machine's token is approved only for that
//! Machine's Node: subject `system:node:<node>` in `system:nodes`, no
//! alternative names, the usages of a TLS client; anything else is denied.
//! Renewals, made with the Node's own certificate for its own name, are
//! still approved by the controller-manager (`selfnodeclient`).

use std::collections::{BTreeMap, BTreeSet};
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

/// The signer of kubelet client certificates.
pub const KUBELET_CLIENT: &str = "kubernetes.io/kube-apiserver-client-kubelet";

/// The Machine each live bootstrap token was issued for, by token id.
pub type Tokens = BTreeMap<String, String>;

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

/// The verdict on `csr` given the Machines of this cluster and the live
/// bootstrap tokens issued for them.
pub fn judge<'a>(
    csr: &CertificateSigningRequest,
    machines: impl IntoIterator<Item = &'a Machine>,
    tokens: &Tokens,
) -> Verdict {
    if decided(csr) {
        return Verdict::Ignore;
    }
    match csr.spec.signer_name.as_str() {
        KUBELET_SERVING => judge_serving(csr, machines),
        KUBELET_CLIENT => judge_client(csr, machines, tokens),
        _ => Verdict::Ignore,
    }
}

fn judge_serving<'a>(
    csr: &CertificateSigningRequest,
    machines: impl IntoIterator<Item = &'a Machine>,
) -> Verdict {
    let Some(node) = csr
        .spec
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

/// A request made with a bootstrap token: only one of a Machine's live
/// tokens is ours to judge, and it gets a certificate for that Machine's
/// Node and nothing else.
fn judge_client<'a>(
    csr: &CertificateSigningRequest,
    machines: impl IntoIterator<Item = &'a Machine>,
    tokens: &Tokens,
) -> Verdict {
    let Some(token) = csr
        .spec
        .username
        .as_deref()
        .and_then(|u| u.strip_prefix("system:bootstrap:"))
    else {
        return Verdict::Ignore;
    };
    let Some(machine_name) = tokens.get(token) else {
        return Verdict::Ignore;
    };
    let Some(machine) = machines.into_iter().find(|m| &m.name_any() == machine_name) else {
        return Verdict::Ignore;
    };
    let node = node_name(machine);
    match check_client(csr, &node) {
        Ok(()) => Verdict::Approve(format!(
            "kubelet client certificate of Machine {machine_name}'s Node {node}, \
             asked for with its bootstrap token {token}"
        )),
        Err(why) => Verdict::Deny(format!(
            "kubelet client certificate asked for with Machine {machine_name}'s bootstrap \
             token {token}: {why}"
        )),
    }
}

/// The request names exactly `node` as a client: `system:node:<node>` in
/// `system:nodes`, no alternative names, the usages of a TLS client.
fn check_client(csr: &CertificateSigningRequest, node: &str) -> Result<(), String> {
    usages_are(csr, "client auth", "a TLS client")?;
    let request = Request::parse(csr)?;
    request.subject_is_node(node)?;
    if let Some(name) = request.alternative_names.first() {
        return Err(format!(
            "a client certificate names no alternative name, and this one asks for {name}"
        ));
    }
    Ok(())
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
    usages_are(csr, "server auth", "a TLS server")?;
    let request = Request::parse(csr)?;
    request.subject_is_node(node)?;
    let address: IpAddr = machine.spec.ip.parse().map_err(|_| {
        format!(
            "the Machine's address {:?} is no IP address",
            machine.spec.ip
        )
    })?;
    if request.alternative_names.is_empty() {
        return Err("the request names no subject alternative name".into());
    }
    for name in &request.alternative_names {
        match name {
            Name::Dns(dns) if dns == node => {}
            Name::Ip(Some(ip)) if *ip == address => {}
            other => {
                return Err(format!(
                    "the subject alternative name {other} is neither the Node's name \
                     {node} nor the Machine's address {address}"
                ));
            }
        }
    }
    Ok(())
}

/// The request's usages are `auth` (`server auth` or `client auth`) and at
/// most a signature and key encipherment besides.
fn usages_are(csr: &CertificateSigningRequest, auth: &str, what: &str) -> Result<(), String> {
    let usages: BTreeSet<&str> = csr
        .spec
        .usages
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    let allowed: BTreeSet<&str> = ["digital signature", "key encipherment", auth].into();
    if !usages.contains(auth) || !usages.is_subset(&allowed) {
        return Err(format!(
            "usages {usages:?} are not those of {what} ({allowed:?}, with {auth})"
        ));
    }
    Ok(())
}

/// What a certificate request asks for.
struct Request {
    common_names: Vec<String>,
    organizations: Vec<String>,
    alternative_names: Vec<Name>,
}

/// A subject alternative name.
enum Name {
    Dns(String),
    /// An IP address, `None` when its bytes are no address.
    Ip(Option<IpAddr>),
    Other(String),
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Name::Dns(dns) => write!(f, "DNS:{dns}"),
            Name::Ip(Some(ip)) => write!(f, "IP:{ip}"),
            Name::Ip(None) => write!(f, "IP:(not an address)"),
            Name::Other(other) => f.write_str(other),
        }
    }
}

impl Request {
    fn parse(csr: &CertificateSigningRequest) -> Result<Request, String> {
        let pem = x509_parser::pem::parse_x509_pem(&csr.spec.request.0)
            .map_err(|e| format!("the request is not PEM: {e}"))?
            .1;
        if pem.label != "CERTIFICATE REQUEST" {
            return Err(format!("the request is a PEM {:?}", pem.label));
        }
        let (_, request) = X509CertificationRequest::from_der(&pem.contents)
            .map_err(|e| format!("the request does not parse: {e}"))?;
        let info = &request.certification_request_info;
        let text =
            |v: &x509_parser::x509::AttributeTypeAndValue| v.as_str().map(str::to_owned).ok();
        let mut alternative_names = Vec::new();
        for extension in request.requested_extensions().into_iter().flatten() {
            let ParsedExtension::SubjectAlternativeName(san) = extension else {
                continue;
            };
            for name in &san.general_names {
                alternative_names.push(match name {
                    GeneralName::DNSName(dns) => Name::Dns((*dns).to_owned()),
                    GeneralName::IPAddress(bytes) => Name::Ip(ip_of(bytes)),
                    other => Name::Other(other.to_string()),
                });
            }
        }
        Ok(Request {
            common_names: info.subject.iter_common_name().filter_map(text).collect(),
            organizations: info.subject.iter_organization().filter_map(text).collect(),
            alternative_names,
        })
    }

    /// The subject is `system:node:<node>` in `system:nodes`, and nothing else.
    fn subject_is_node(&self, node: &str) -> Result<(), String> {
        let want = format!("system:node:{node}");
        if self.common_names != [want.as_str()] {
            return Err(format!(
                "the subject's common name is {:?}, not {want:?}",
                self.common_names
            ));
        }
        if self.organizations != ["system:nodes"] {
            return Err(format!(
                "the subject's organization is {:?}, not [\"system:nodes\"]",
                self.organizations
            ));
        }
        Ok(())
    }
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
/// and the client requests made with their bootstrap tokens until shutdown
/// is requested (SIGTERM/SIGINT), as the controllers stop.
pub async fn run(client: Client, machines: Store<Machine>) {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let (store, writer) = reflector::store();
    let mut changes = watcher(api.clone(), watcher::Config::default())
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
        let pending: Vec<Arc<CertificateSigningRequest>> = store
            .state()
            .into_iter()
            .filter(|csr| {
                [KUBELET_SERVING, KUBELET_CLIENT].contains(&csr.spec.signer_name.as_str())
                    && !decided(csr)
            })
            .collect();
        if pending.is_empty() {
            continue;
        }
        // The tokens are read only when a client request waits, and fresh:
        // one deleted since (its Machine joined or went) gets nothing.
        let tokens = if pending.iter().any(|c| c.spec.signer_name == KUBELET_CLIENT) {
            match crate::bootstrap::machine_tokens(&client).await {
                Ok(tokens) => tokens,
                Err(error) => {
                    tracing::warn!(%error, "reading the bootstrap tokens");
                    continue;
                }
            }
        } else {
            Tokens::new()
        };
        let known: Vec<Arc<Machine>> = machines.state();
        for csr in pending {
            let (type_, reason, message) =
                match judge(&csr, known.iter().map(std::convert::AsRef::as_ref), &tokens) {
                    Verdict::Ignore => continue,
                    Verdict::Approve(m) if csr.spec.signer_name == KUBELET_CLIENT => {
                        ("Approved", "MachineBootstrapToken", m)
                    }
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
        let v = judge(
            &csr("system:node:worker-a1", &pem, &SERVER),
            &ms,
            &Tokens::new(),
        );
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
            match judge(&csr(user, &pem, usages), &ms, &Tokens::new()) {
                Verdict::Deny(m) => assert!(m.contains(why), "{why}: {m}"),
                other => panic!("{why}: {other:?}"),
            }
        }
    }

    fn client_csr(token: &str, pem: &str, usages: &[&str]) -> CertificateSigningRequest {
        let mut c = csr(&format!("system:bootstrap:{token}"), pem, usages);
        c.spec.signer_name = KUBELET_CLIENT.into();
        c.spec.groups = Some(vec![
            "system:bootstrappers".into(),
            crate::bootstrap::TOKEN_GROUP.into(),
            "system:authenticated".into(),
        ]);
        c
    }

    const CLIENT: [&str; 3] = ["digital signature", "key encipherment", "client auth"];

    #[test]
    fn a_bootstrap_token_gets_a_client_certificate_for_its_machines_node_only() {
        let ms = [
            machine("worker-a1", "10.0.12.34"),
            machine("worker-b1", "10.0.12.35"),
        ];
        let tokens: Tokens = [("abc123".to_owned(), "worker-a1".to_owned())].into();
        let own = request("system:node:worker-a1", "system:nodes", &[]);
        let v = judge(&client_csr("abc123", &own, &CLIENT), &ms, &tokens);
        assert!(matches!(v, Verdict::Approve(_)), "{v:?}");
        let cases = [
            (
                request("system:node:worker-b1", "system:nodes", &[]),
                &CLIENT[..],
                "common name",
            ),
            (
                request("system:node:worker-a1", "system:masters", &[]),
                &CLIENT[..],
                "organization",
            ),
            (
                request("system:node:worker-a1", "system:nodes", &["worker-a1"]),
                &CLIENT[..],
                "alternative name",
            ),
            (own.clone(), &SERVER[..], "usages"),
        ];
        for (pem, usages, why) in cases {
            match judge(&client_csr("abc123", &pem, usages), &ms, &tokens) {
                Verdict::Deny(m) => assert!(m.contains(why), "{why}: {m}"),
                other => panic!("{why}: {other:?}"),
            }
        }
        // A token that is no Machine's (deleted once its Machine joined, or
        // another's) is not ours to judge: nothing approves it.
        assert_eq!(
            judge(&client_csr("zzz999", &own, &CLIENT), &ms, &tokens),
            Verdict::Ignore
        );
        // A Node renewing with its own certificate is the controller-manager's.
        let mut renewal = csr("system:node:worker-a1", &own, &CLIENT);
        renewal.spec.signer_name = KUBELET_CLIENT.into();
        assert_eq!(judge(&renewal, &ms, &tokens), Verdict::Ignore);
    }

    #[test]
    fn other_signers_nodes_and_decided_requests_are_left_alone() {
        let ms = [machine("worker-a1", "10.0.12.34")];
        let pem = request("system:node:worker-b", "system:nodes", &["worker-b"]);
        // No Machine's Node.
        assert_eq!(
            judge(
                &csr("system:node:worker-b", &pem, &SERVER),
                &ms,
                &Tokens::new()
            ),
            Verdict::Ignore
        );
        // Not a node at all.
        assert_eq!(
            judge(&csr("alice", &pem, &SERVER), &ms, &Tokens::new()),
            Verdict::Ignore
        );
        let pem = request("system:node:worker-a1", "system:nodes", &["worker-a1"]);
        let mut other = csr("system:node:worker-a1", &pem, &SERVER);
        other.spec.signer_name = "kubernetes.io/kube-apiserver-client-kubelet".into();
        assert_eq!(judge(&other, &ms, &Tokens::new()), Verdict::Ignore);
        let mut done = csr("system:node:worker-a1", &pem, &SERVER);
        done.status = Some(Default::default());
        done.status.as_mut().expect("status").conditions = Some(vec![
            k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition {
                type_: "Denied".into(),
                status: "True".into(),
                ..Default::default()
            },
        ]);
        assert_eq!(judge(&done, &ms, &Tokens::new()), Verdict::Ignore);
    }
}

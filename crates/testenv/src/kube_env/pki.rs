//! The certificates and keys of one environment, so the API server runs with real
//! TLS and client-certificate authentication like a production control plane.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use base64::Engine;
use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::Error;

/// Names and addresses the API server certificate is valid for: loopback for the
/// tests, the first service IP and the in-cluster names for anything that talks to
/// the `kubernetes` service.
const SERVER_SANS: &[&str] = &[
    "127.0.0.1",
    "localhost",
    "10.0.0.1",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// Paths of the PEM files, all in one directory.
pub(crate) struct Pki {
    pub(crate) ca_cert: PathBuf,
    pub(crate) ca_key: PathBuf,
    pub(crate) server_cert: PathBuf,
    pub(crate) server_key: PathBuf,
    pub(crate) sa_key: PathBuf,
    pub(crate) sa_pub: PathBuf,
    /// The credentials kube-apiserver shows kubelets (the admin's:
    /// `system:masters` may use every kubelet API).
    pub(crate) kubelet_client_cert: PathBuf,
    pub(crate) kubelet_client_key: PathBuf,
    ca_pem: String,
    admin_cert_pem: String,
    admin_key_pem: String,
}

impl Pki {
    /// Generates a CA, the API server serving certificate, an admin client
    /// certificate (`system:masters`) and the service-account signing key.
    pub(crate) fn generate(dir: &Path, extra_san: Option<IpAddr>) -> Result<Pki, Error> {
        std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;

        let ca_key = KeyPair::generate().map_err(Error::Pki)?;
        let ca_params = ca_params("kok-testenv-ca");
        let ca_cert = ca_params.self_signed(&ca_key).map_err(Error::Pki)?;
        let issuer = Issuer::new(ca_params, &ca_key);

        let server_key = KeyPair::generate().map_err(Error::Pki)?;
        let mut server_params = CertificateParams::new(
            SERVER_SANS
                .iter()
                .map(|s| s.to_string())
                .chain(extra_san.map(|ip| ip.to_string()))
                .collect::<Vec<_>>(),
        )
        .map_err(Error::Pki)?;
        server_params.distinguished_name = dn("kube-apiserver", None);
        server_params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_cert = server_params
            .signed_by(&server_key, &issuer)
            .map_err(Error::Pki)?;

        let admin_key = KeyPair::generate().map_err(Error::Pki)?;
        let mut admin_params = CertificateParams::default();
        admin_params.distinguished_name = dn("admin", Some("system:masters"));
        admin_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        admin_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin_params
            .signed_by(&admin_key, &issuer)
            .map_err(Error::Pki)?;

        // ECDSA P-256 is accepted for both the signing and the verifying flags.
        let sa_key = KeyPair::generate().map_err(Error::Pki)?;

        let pki = Pki {
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            server_cert: dir.join("apiserver.crt"),
            server_key: dir.join("apiserver.key"),
            sa_key: dir.join("sa.key"),
            sa_pub: dir.join("sa.pub"),
            kubelet_client_cert: dir.join("apiserver-kubelet-client.crt"),
            kubelet_client_key: dir.join("apiserver-kubelet-client.key"),
            ca_pem: ca_cert.pem(),
            admin_cert_pem: admin_cert.pem(),
            admin_key_pem: admin_key.serialize_pem(),
        };
        write(&pki.ca_cert, &pki.ca_pem)?;
        write(&pki.ca_key, &ca_key.serialize_pem())?;
        write(&pki.server_cert, &server_cert.pem())?;
        write(&pki.server_key, &server_key.serialize_pem())?;
        write(&pki.sa_key, &sa_key.serialize_pem())?;
        write(&pki.sa_pub, &sa_key.public_key_pem())?;
        write(&pki.kubelet_client_cert, &pki.admin_cert_pem)?;
        write(&pki.kubelet_client_key, &pki.admin_key_pem)?;
        Ok(pki)
    }

    /// An admin kubeconfig for `server`, with every credential inline so the file
    /// works wherever it is copied (another process, a Secret).
    pub(crate) fn admin_kubeconfig(&self, server: &str) -> Kubeconfig {
        let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
        let name = "kok-testenv".to_owned();
        Kubeconfig {
            clusters: vec![NamedCluster {
                name: name.clone(),
                cluster: Some(Cluster {
                    server: Some(server.to_owned()),
                    certificate_authority_data: Some(b64(&self.ca_pem)),
                    ..Cluster::default()
                }),
                ..NamedCluster::default()
            }],
            auth_infos: vec![NamedAuthInfo {
                name: "admin".to_owned(),
                auth_info: Some(AuthInfo {
                    client_certificate_data: Some(b64(&self.admin_cert_pem)),
                    client_key_data: Some(b64(&self.admin_key_pem).into()),
                    ..AuthInfo::default()
                }),
                ..NamedAuthInfo::default()
            }],
            contexts: vec![NamedContext {
                name: name.clone(),
                context: Some(Context {
                    cluster: name.clone(),
                    user: Some("admin".to_owned()),
                    ..Context::default()
                }),
                ..NamedContext::default()
            }],
            current_context: Some(name),
            kind: Some("Config".to_owned()),
            api_version: Some("v1".to_owned()),
            ..Kubeconfig::default()
        }
    }
}

/// What a test CA is: self-signed, unconstrained, signing certificates.
pub(crate) fn ca_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = dn(common_name, None);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn dn(common_name: &str, organization: Option<&str>) -> rcgen::DistinguishedName {
    let mut dn = rcgen::DistinguishedName::new();
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

pub(crate) fn write(path: &Path, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(Error::io(format!("writing {}", path.display())))
}

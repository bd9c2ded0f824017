//! Certificate authorities and leaf certificates for a business cluster, and
//! reading back what an existing certificate says, so the operator can tell
//! whether a stored certificate still matches what it would issue now.

use std::net::IpAddr;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::OffsetDateTime;

/// Certificates are back-dated by this much so a clock a little behind the
/// operator's still accepts them.
const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// Lifetime of the certificate authorities.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Errors while generating or reading certificates.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// Key or certificate generation failed.
    #[error("cannot generate {what}: {source}")]
    Generate {
        what: String,
        #[source]
        source: rcgen::Error,
    },
    /// A stored certificate or key could not be parsed.
    #[error("cannot parse {what}: {message}")]
    Parse { what: &'static str, message: String },
}

/// A certificate with its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for KeyCert {
    // Never print the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyCert")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// What a leaf certificate is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// TLS server only.
    Server,
    /// TLS client only.
    Client,
    /// Both (etcd peers).
    ServerAndClient,
}

/// Everything that identifies a leaf certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafSpec {
    pub common_name: String,
    /// Subject organizations; Kubernetes reads them as groups.
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub usage: Usage,
}

fn generate(what: &str) -> impl Fn(rcgen::Error) -> PkiError + '_ {
    move |source| PkiError::Generate {
        what: what.to_string(),
        source,
    }
}

fn window(params: &mut CertificateParams, now: OffsetDateTime, validity: Duration) {
    params.not_before = now - BACKDATE;
    params.not_after = now + validity;
}

/// A new self-signed certificate authority.
pub fn new_ca(common_name: &str, now: OffsetDateTime) -> Result<KeyCert, PkiError> {
    let key = KeyPair::generate().map_err(generate(common_name))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    window(&mut params, now, CA_VALIDITY);
    let cert = params.self_signed(&key).map_err(generate(common_name))?;
    Ok(KeyCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Issue a leaf certificate signed by `ca`.
pub fn issue(
    ca: &KeyCert,
    spec: &LeafSpec,
    now: OffsetDateTime,
    validity: Duration,
) -> Result<KeyCert, PkiError> {
    let what = spec.common_name.as_str();
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(|e| PkiError::Parse {
        what: "CA key",
        message: e.to_string(),
    })?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key).map_err(|e| PkiError::Parse {
        what: "CA certificate",
        message: e.to_string(),
    })?;
    let key = KeyPair::generate().map_err(generate(what))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, what);
    for org in &spec.organizations {
        params
            .distinguished_name
            .push(DnType::OrganizationName, org.as_str());
    }
    for name in &spec.dns_names {
        let name = name.clone().try_into().map_err(generate(what))?;
        params.subject_alt_names.push(SanType::DnsName(name));
    }
    params
        .subject_alt_names
        .extend(spec.ips.iter().copied().map(SanType::IpAddress));
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = match spec.usage {
        Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
        Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        Usage::ServerAndClient => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    };
    params.use_authority_key_identifier_extension = true;
    window(&mut params, now, validity);
    let cert = params.signed_by(&key, &issuer).map_err(generate(what))?;
    let cert_pem = if spec.organizations.len() > 1 {
        // rcgen keeps one value per attribute type; Kubernetes reads every
        // organization of the subject as a group, so write the subject again.
        let subject = subject_der(what, &spec.organizations);
        let der = with_subject(cert.der(), &subject, issuer.key()).map_err(|message| {
            PkiError::Parse {
                what: "issued certificate",
                message,
            }
        })?;
        pem_encode(&der)
    } else {
        cert.pem()
    };
    Ok(KeyCert {
        cert_pem,
        key_pem: key.serialize_pem(),
    })
}

/// DER tag-length-value.
fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// (header length, content length) of the DER element at the start of `der`.
fn header(der: &[u8]) -> Option<(usize, usize)> {
    let first = *der.get(1)?;
    if first < 0x80 {
        return Some((2, first as usize));
    }
    let n = (first & 0x7f) as usize;
    let len = der
        .get(2..2 + n)?
        .iter()
        .fold(0usize, |acc, b| (acc << 8) | *b as usize);
    Some((2 + n, len))
}

/// A subject Name with one CN and one RDN per organization.
fn subject_der(common_name: &str, organizations: &[String]) -> Vec<u8> {
    const ORGANIZATION: [u8; 3] = [0x55, 0x04, 0x0a];
    const COMMON_NAME: [u8; 3] = [0x55, 0x04, 0x03];
    let rdn = |oid: &[u8], value: &str| {
        tlv(
            0x31,
            &tlv(
                0x30,
                &[tlv(0x06, oid), tlv(0x0c, value.as_bytes())].concat(),
            ),
        )
    };
    let mut rdns: Vec<u8> = organizations
        .iter()
        .flat_map(|o| rdn(&ORGANIZATION, o))
        .collect();
    rdns.extend(rdn(&COMMON_NAME, common_name));
    tlv(0x30, &rdns)
}

/// Replace the subject of a certificate and sign it again with `key`.
fn with_subject(
    cert: &[u8],
    subject: &[u8],
    key: &impl rcgen::SigningKey,
) -> Result<Vec<u8>, String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).map_err(|e| e.to_string())?;
    let tbs: &[u8] = parsed.tbs_certificate.as_ref();
    let old_subject = parsed.tbs_certificate.subject.as_raw();
    let at = (old_subject.as_ptr() as usize)
        .checked_sub(tbs.as_ptr() as usize)
        .ok_or("subject outside the TBS")?;
    let (tbs_header, _) = header(tbs).ok_or("bad TBS")?;
    let content = &tbs[tbs_header..];
    let at = at
        .checked_sub(tbs_header)
        .ok_or("subject before the TBS content")?;
    let new_tbs = tlv(
        0x30,
        &[&content[..at], subject, &content[at + old_subject.len()..]].concat(),
    );
    // Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signature }
    let (outer_header, _) = header(cert).ok_or("bad certificate")?;
    let after_tbs = outer_header + tbs.len();
    let (alg_header, alg_len) = header(cert.get(after_tbs..).ok_or("no signature algorithm")?)
        .ok_or("bad signature algorithm")?;
    let algorithm = cert
        .get(after_tbs..after_tbs + alg_header + alg_len)
        .ok_or("short signature algorithm")?;
    let signature = key.sign(&new_tbs).map_err(|e| e.to_string())?;
    let bits = tlv(0x03, &[&[0u8][..], &signature].concat());
    Ok(tlv(0x30, &[new_tbs, algorithm.to_vec(), bits].concat()))
}

fn pem_encode(der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// A new service-account signing key pair: (private PEM, public PEM).
pub fn new_service_account_key() -> Result<(String, String), PkiError> {
    let key = KeyPair::generate().map_err(generate("service-account key"))?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

/// `sha256:<hex>` of `der`: how certificate authorities and the
/// service-account key are recorded.
pub fn fingerprint(der: &[u8]) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(der);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The DER bytes of the first PEM block of `pem` with label `label`.
fn pem_der(pem: &str, label: &'static str) -> Result<Vec<u8>, PkiError> {
    let parse = |message: String| PkiError::Parse {
        what: label,
        message,
    };
    let (_, block) =
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| parse(e.to_string()))?;
    if block.label != label {
        return Err(parse(format!("a {} block, not {label}", block.label)));
    }
    Ok(block.contents)
}

/// The DER encoding of a PEM certificate.
pub fn certificate_der(cert_pem: &str) -> Result<Vec<u8>, PkiError> {
    pem_der(cert_pem, "CERTIFICATE")
}

/// Fingerprint of a PEM certificate (of its DER encoding).
pub fn certificate_fingerprint(cert_pem: &str) -> Result<String, PkiError> {
    Ok(fingerprint(&certificate_der(cert_pem)?))
}

/// Fingerprint of a PEM public key (of its DER SubjectPublicKeyInfo).
pub fn public_key_fingerprint(public_pem: &str) -> Result<String, PkiError> {
    Ok(fingerprint(&pem_der(public_pem, "PUBLIC KEY")?))
}

/// Check that `key_pem` is the private key of the public key `public`
/// (a parsed SubjectPublicKeyInfo).
fn key_is_for(
    key_pem: &str,
    public: &x509_parser::x509::SubjectPublicKeyInfo<'_>,
) -> Result<(), PkiError> {
    use rcgen::PublicKeyData as _;
    let key = KeyPair::from_pem(key_pem).map_err(|e| PkiError::Parse {
        what: "private key",
        message: e.to_string(),
    })?;
    if key.der_bytes() == &*public.subject_public_key.data {
        Ok(())
    } else {
        Err(PkiError::Parse {
            what: "private key",
            message: "it is not the key of the certificate or public key beside it".into(),
        })
    }
}

/// Check a certificate authority as stored: its certificate is a CA and
/// `key_pem` is its key. Returns the certificate's fingerprint.
pub fn check_authority(cert_pem: &str, key_pem: &str) -> Result<String, PkiError> {
    let der = pem_der(cert_pem, "CERTIFICATE")?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| PkiError::Parse {
        what: "CA certificate",
        message: e.to_string(),
    })?;
    if !cert.is_ca() {
        return Err(PkiError::Parse {
            what: "CA certificate",
            message: "it is not a certificate authority".into(),
        });
    }
    key_is_for(key_pem, cert.public_key())?;
    Ok(fingerprint(&der))
}

/// Check a service-account key pair as stored: `public_pem` is the public key
/// of `key_pem`. Returns the public key's fingerprint.
pub fn check_key_pair(key_pem: &str, public_pem: &str) -> Result<String, PkiError> {
    use x509_parser::prelude::FromDer as _;
    let der = pem_der(public_pem, "PUBLIC KEY")?;
    let (_, public) =
        x509_parser::x509::SubjectPublicKeyInfo::from_der(&der).map_err(|e| PkiError::Parse {
            what: "PUBLIC KEY",
            message: e.to_string(),
        })?;
    key_is_for(key_pem, &public)?;
    Ok(fingerprint(&der))
}

/// Check a client certificate and key before they are used: the certificate
/// was signed by `ca_pem`'s key, is valid at `now`, and `key_pem` is its key.
pub fn check_client(
    cert_pem: &str,
    key_pem: &str,
    ca_pem: &str,
    now: OffsetDateTime,
) -> Result<(), PkiError> {
    let bad = |message: String| PkiError::Parse {
        what: "client certificate",
        message,
    };
    let ca_der = pem_der(ca_pem, "CERTIFICATE")?;
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).map_err(|e| bad(e.to_string()))?;
    let der = pem_der(cert_pem, "CERTIFICATE")?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| bad(e.to_string()))?;
    cert.verify_signature(Some(ca.public_key()))
        .map_err(|e| bad(format!("not signed by the cluster CA: {e}")))?;
    let validity = cert.validity();
    if now < validity.not_before.to_datetime() || now > validity.not_after.to_datetime() {
        return Err(bad("not valid now".into()));
    }
    key_is_for(key_pem, cert.public_key())
}

/// What a stored certificate says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub not_after: OffsetDateTime,
    /// Serial number in hex, to tell a reissued certificate from the one
    /// before it.
    pub serial: String,
    /// Subject of the issuer, as text.
    pub issuer: String,
    /// Authority key identifier, to tell which CA key signed it.
    pub authority_key_id: Option<Vec<u8>>,
    /// Subject key identifier (for a CA: what its leaves carry as authority key).
    pub subject_key_id: Option<Vec<u8>>,
}

/// Certificates read before, by the SHA-256 of their PEM text: every reconcile
/// of a Cluster checks each of its certificates (for renewal, and for the
/// expiry metric), and they seldom change.
static INSPECTED: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<[u8; 32], CertInfo>>,
> = std::sync::LazyLock::new(Default::default);

/// Certificates [`INSPECTED`] keeps before it starts over (a few per Cluster
/// live at a time; renewed ones are never asked for again).
const INSPECTED_MAX: usize = 100_000;

/// Read a PEM certificate.
pub fn inspect(cert_pem: &str) -> Result<CertInfo, PkiError> {
    use sha2::Digest as _;
    let key: [u8; 32] = sha2::Sha256::digest(cert_pem.as_bytes()).into();
    let lock = || INSPECTED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(info) = lock().get(&key) {
        return Ok(info.clone());
    }
    let info = parse_certificate(cert_pem)?;
    let mut inspected = lock();
    if inspected.len() >= INSPECTED_MAX {
        inspected.clear();
    }
    inspected.insert(key, info.clone());
    Ok(info)
}

fn parse_certificate(cert_pem: &str) -> Result<CertInfo, PkiError> {
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    let parse = |message: String| PkiError::Parse {
        what: "certificate",
        message,
    };
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).map_err(|e| parse(e.to_string()))?;
    let cert = pem.parse_x509().map_err(|e| parse(e.to_string()))?;
    let subject = cert.subject();
    let text = |attr: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        attr.as_str().unwrap_or_default().to_string()
    };
    let mut info = CertInfo {
        common_name: subject
            .iter_common_name()
            .next()
            .map(text)
            .unwrap_or_default(),
        organizations: subject.iter_organization().map(text).collect(),
        dns_names: Vec::new(),
        ips: Vec::new(),
        not_after: cert.validity().not_after.to_datetime(),
        serial: cert.raw_serial_as_string(),
        issuer: cert.issuer().to_string(),
        authority_key_id: None,
        subject_key_id: None,
    };
    for ext in cert.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => {
                for name in &san.general_names {
                    match name {
                        GeneralName::DNSName(dns) => info.dns_names.push(dns.to_string()),
                        GeneralName::IPAddress(bytes) => {
                            if let Ok(v4) = <[u8; 4]>::try_from(*bytes) {
                                info.ips.push(IpAddr::from(v4));
                            } else if let Ok(v6) = <[u8; 16]>::try_from(*bytes) {
                                info.ips.push(IpAddr::from(v6));
                            }
                        }
                        _ => {}
                    }
                }
            }
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                info.authority_key_id = aki.key_identifier.as_ref().map(|k| k.0.to_vec());
            }
            ParsedExtension::SubjectKeyIdentifier(ski) => {
                info.subject_key_id = Some(ski.0.to_vec());
            }
            _ => {}
        }
    }
    Ok(info)
}

/// Why a stored leaf certificate must be issued again, or `None` when it still
/// matches `spec`, was signed by `ca`, and has more than `renew_before` left.
pub fn reissue_reason(
    existing: &CertInfo,
    ca: &CertInfo,
    spec: &LeafSpec,
    now: OffsetDateTime,
    renew_before: Duration,
) -> Option<&'static str> {
    let sorted = |v: &[String]| {
        let mut v = v.to_vec();
        v.sort();
        v
    };
    let mut ips = existing.ips.clone();
    ips.sort();
    let mut want_ips = spec.ips.clone();
    want_ips.sort();
    if existing.authority_key_id.is_some() && existing.authority_key_id != ca.subject_key_id {
        Some("SignedByAnotherCA")
    } else if existing.common_name != spec.common_name
        || sorted(&existing.organizations) != sorted(&spec.organizations)
    {
        Some("SubjectChanged")
    } else if sorted(&existing.dns_names) != sorted(&spec.dns_names) || ips != want_ips {
        Some("SubjectAltNamesChanged")
    } else if existing.not_after - now < renew_before {
        Some("Expiring")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).expect("valid time")
    }

    fn spec() -> LeafSpec {
        LeafSpec {
            common_name: "kube-apiserver".into(),
            organizations: vec![],
            dns_names: vec!["kubernetes".into(), "api.example.com".into()],
            ips: vec![
                "10.96.0.1".parse().expect("ip"),
                "192.0.2.10".parse().expect("ip"),
            ],
            usage: Usage::Server,
        }
    }

    #[test]
    fn leaf_carries_names_validity_and_issuer() {
        let ca = new_ca("kubernetes", now()).expect("ca");
        let leaf = issue(&ca, &spec(), now(), Duration::from_secs(3600)).expect("leaf");
        let info = inspect(&leaf.cert_pem).expect("inspect");
        let ca_info = inspect(&ca.cert_pem).expect("inspect ca");
        assert_eq!(info.common_name, "kube-apiserver");
        assert_eq!(info.dns_names, vec!["kubernetes", "api.example.com"]);
        assert_eq!(info.ips.len(), 2);
        assert_eq!(info.not_after, now() + Duration::from_secs(3600));
        assert_eq!(info.issuer, "CN=kubernetes");
        assert_eq!(ca_info.not_after, now() + CA_VALIDITY);
        assert_eq!(
            reissue_reason(&info, &ca_info, &spec(), now(), Duration::from_secs(600)),
            None
        );
    }

    #[test]
    fn a_certificate_read_again_comes_from_memory_and_bad_text_is_never_kept() {
        let ca = new_ca("kubernetes", now()).expect("ca");
        let leaf = issue(&ca, &spec(), now(), Duration::from_secs(3600)).expect("leaf");
        let first = inspect(&leaf.cert_pem).expect("inspect");
        let key: [u8; 32] = {
            use sha2::Digest as _;
            sha2::Sha256::digest(leaf.cert_pem.as_bytes()).into()
        };
        let kept = INSPECTED.lock().expect("lock").get(&key).cloned();
        assert_eq!(kept.as_ref(), Some(&first));
        assert_eq!(inspect(&leaf.cert_pem).expect("again"), first);
        let bad = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(inspect(bad).is_err());
        assert!(
            inspect(bad).is_err(),
            "an error is not remembered as a result"
        );
    }

    #[test]
    fn client_cert_carries_groups() {
        let ca = new_ca("kubernetes", now()).expect("ca");
        let admin = LeafSpec {
            common_name: "kubernetes-admin".into(),
            organizations: vec!["system:masters".into()],
            dns_names: vec![],
            ips: vec![],
            usage: Usage::Client,
        };
        let info = inspect(
            &issue(&ca, &admin, now(), Duration::from_secs(60))
                .expect("leaf")
                .cert_pem,
        )
        .expect("inspect");
        assert_eq!(info.organizations, vec!["system:masters"]);
    }

    #[test]
    fn several_groups_are_all_in_the_subject_and_the_signature_holds() {
        use x509_parser::prelude::FromDer;
        let ca = new_ca("kubernetes", now()).expect("ca");
        let user = LeafSpec {
            common_name: "sre".into(),
            organizations: vec!["system:masters".into(), "sre".into(), "on-call".into()],
            dns_names: vec![],
            ips: vec![],
            usage: Usage::Client,
        };
        let leaf = issue(&ca, &user, now(), Duration::from_secs(60)).expect("leaf");
        let info = inspect(&leaf.cert_pem).expect("inspect");
        assert_eq!(info.common_name, "sre");
        assert_eq!(info.organizations, vec!["system:masters", "sre", "on-call"]);
        // The re-signed certificate verifies against the CA's key.
        let (_, ca_pem) = x509_parser::pem::parse_x509_pem(ca.cert_pem.as_bytes()).expect("pem");
        let ca_cert = ca_pem.parse_x509().expect("ca");
        let (_, leaf_pem) =
            x509_parser::pem::parse_x509_pem(leaf.cert_pem.as_bytes()).expect("pem");
        let (_, leaf_cert) =
            x509_parser::certificate::X509Certificate::from_der(&leaf_pem.contents).expect("leaf");
        leaf_cert
            .verify_signature(Some(ca_cert.public_key()))
            .expect("signature verifies");
        assert_eq!(info.issuer, "CN=kubernetes");
    }

    #[test]
    fn reissue_reasons() {
        let ca = new_ca("kubernetes", now()).expect("ca");
        let ca_info = inspect(&ca.cert_pem).expect("ca");
        let leaf = inspect(
            &issue(&ca, &spec(), now(), Duration::from_secs(3600))
                .expect("leaf")
                .cert_pem,
        )
        .expect("leaf");
        let renew = Duration::from_secs(600);
        let later = now() + Duration::from_secs(3100);
        assert_eq!(
            reissue_reason(&leaf, &ca_info, &spec(), later, renew),
            Some("Expiring")
        );
        let mut more_names = spec();
        more_names.dns_names.push("api2.example.com".into());
        assert_eq!(
            reissue_reason(&leaf, &ca_info, &more_names, now(), renew),
            Some("SubjectAltNamesChanged")
        );
        let mut renamed = spec();
        renamed.common_name = "other".into();
        assert_eq!(
            reissue_reason(&leaf, &ca_info, &renamed, now(), renew),
            Some("SubjectChanged")
        );
        let other_ca = inspect(&new_ca("kubernetes", now()).expect("ca").cert_pem).expect("ca");
        assert_eq!(
            reissue_reason(&leaf, &other_ca, &spec(), now(), renew),
            Some("SignedByAnotherCA")
        );
    }

    #[test]
    fn debug_never_prints_the_key() {
        let ca = new_ca("kubernetes", now()).expect("ca");
        assert!(!format!("{ca:?}").contains("PRIVATE KEY"));
    }
}

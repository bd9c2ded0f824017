//! Certificate authorities and the service-account key are made once. Their
//! fingerprints are recorded in the Cluster's status; a Secret that later goes
//! missing or holds another key is held (reported, nothing issued from it),
//! never silently replaced: joined kubelets, every certificate and every
//! service-account token depend on it. Only naming the recorded fingerprint in
//! [`REPLACE_AUTHORITIES_ANNOTATION`] gives it up.

use kube_on_kube_api::cluster::{AuthorityFingerprints, REPLACE_AUTHORITIES_ANNOTATION};

/// One of the keys a Cluster keeps for its lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Which {
    Cluster,
    Etcd,
    FrontProxy,
    ServiceAccount,
    /// The key kube-apiserver encrypts Secrets at rest with.
    Encryption,
}

impl Which {
    /// What it is, for messages.
    pub fn label(self) -> &'static str {
        match self {
            Which::Cluster => "cluster CA",
            Which::Etcd => "etcd CA",
            Which::FrontProxy => "front-proxy CA",
            Which::ServiceAccount => "service-account key",
            Which::Encryption => "Secret encryption key",
        }
    }

    /// Its fingerprint in the record.
    pub fn recorded(self, record: &AuthorityFingerprints) -> Option<&str> {
        match self {
            Which::Cluster => record.cluster.as_deref(),
            Which::Etcd => record.etcd.as_deref(),
            Which::FrontProxy => record.front_proxy.as_deref(),
            Which::ServiceAccount => record.service_account.as_deref(),
            Which::Encryption => record.encryption.as_deref(),
        }
    }

    /// Set its fingerprint in `record`.
    pub fn record(self, record: &mut AuthorityFingerprints, fingerprint: String) {
        let slot = match self {
            Which::Cluster => &mut record.cluster,
            Which::Etcd => &mut record.etcd,
            Which::FrontProxy => &mut record.front_proxy,
            Which::ServiceAccount => &mut record.service_account,
            Which::Encryption => &mut record.encryption,
        };
        *slot = Some(fingerprint);
    }

    /// What depends on it, for the message that says what replacing costs.
    fn dependents(self) -> &'static str {
        match self {
            Which::Cluster => {
                "every certificate it signed is issued again and every joined kubelet must join again"
            }
            Which::Etcd => "every etcd certificate is issued again and the members restart",
            Which::FrontProxy => "the aggregation layer's certificates are issued again",
            Which::ServiceAccount => "every service-account token of the cluster stops working",
            Which::Encryption => {
                "every Secret stored in the business cluster can no longer be read"
            }
        }
    }
}

/// What the Secret holding one of them contains now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// No Secret, or a Secret without the data.
    Missing,
    /// Data that is not a usable CA or key pair (bad PEM, a key that does not
    /// belong to the certificate), and why.
    Unreadable(String),
    /// A usable one, by fingerprint.
    Found(String),
}

/// Why one of them cannot be used, with the way out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub which: Which,
    /// `CertificateAuthorityMissing`, `CertificateAuthorityChanged`, …
    pub reason: &'static str,
    pub message: String,
}

/// What to do with one of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Use what is stored (and record it, if nothing was recorded).
    Use,
    /// Make a new one: nothing was recorded and nothing is stored (the
    /// Cluster's first pass).
    Create,
    /// The user gave up the recorded one: make a new one when nothing usable
    /// is stored, else take the stored one; either is recorded.
    Replace,
    /// Neither use nor replace it.
    Hold(Held),
}

/// The fingerprints the Cluster's annotation allows to be replaced.
pub fn replaceable(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> Vec<String> {
    annotations
        .and_then(|a| a.get(REPLACE_AUTHORITIES_ANNOTATION))
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|f| !f.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Decide one of them from what was recorded, what is stored in `secret`,
/// and the fingerprints the user allowed to be replaced.
pub fn decide(
    which: Which,
    secret: &str,
    recorded: Option<&str>,
    stored: &Stored,
    replace: &[String],
) -> Decision {
    let (reason, what) = match (recorded, stored) {
        (None, Stored::Missing) => return Decision::Create,
        (None, Stored::Found(_)) => return Decision::Use,
        (Some(r), Stored::Found(f)) if r == f => return Decision::Use,
        (Some(r), _) if replace.iter().any(|f| f == r) => return Decision::Replace,
        (None, Stored::Unreadable(why)) => (
            unreadable(which),
            format!(
                "Secret {secret} does not hold a usable {}: {why}",
                which.label()
            ),
        ),
        (Some(r), Stored::Unreadable(why)) => (
            unreadable(which),
            format!(
                "Secret {secret} no longer holds a usable {} ({r}): {why}",
                which.label()
            ),
        ),
        (Some(r), Stored::Missing) => (
            match which {
                Which::ServiceAccount => "ServiceAccountKeyMissing",
                Which::Encryption => "EncryptionKeyMissing",
                _ => "CertificateAuthorityMissing",
            },
            format!(
                "Secret {secret} holding the {} ({r}) is missing",
                which.label()
            ),
        ),
        (Some(r), Stored::Found(f)) => (
            match which {
                Which::ServiceAccount => "ServiceAccountKeyChanged",
                Which::Encryption => "EncryptionKeyChanged",
                _ => "CertificateAuthorityChanged",
            },
            format!(
                "Secret {secret} holds another {} ({f}) than the one recorded ({r})",
                which.label()
            ),
        ),
    };
    let way_out = match recorded {
        Some(r) => format!(
            "restore the Secret from a backup; or, to replace it for good ({}), annotate the Cluster {REPLACE_AUTHORITIES_ANNOTATION}={r}",
            which.dependents()
        ),
        None => "put a usable one into the Secret, or delete the Secret to have one made".into(),
    };
    Decision::Hold(Held {
        which,
        reason,
        message: format!(
            "{what}; nothing is issued from it and the control plane runs on as it is: {way_out}"
        ),
    })
}

fn unreadable(which: Which) -> &'static str {
    match which {
        Which::ServiceAccount => "ServiceAccountKeyUnreadable",
        Which::Encryption => "EncryptionKeyUnreadable",
        _ => "CertificateAuthorityUnreadable",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "sha256:aa";
    const NEW: &str = "sha256:bb";

    fn found(f: &str) -> Stored {
        Stored::Found(f.into())
    }

    fn held(decision: Decision) -> Held {
        match decision {
            Decision::Hold(h) => h,
            other => panic!("not held: {other:?}"),
        }
    }

    #[test]
    fn made_once_then_used() {
        let d = |recorded, stored: &Stored| decide(Which::Cluster, "c-ca", recorded, stored, &[]);
        assert_eq!(d(None, &Stored::Missing), Decision::Create);
        assert_eq!(d(None, &found(OLD)), Decision::Use);
        assert_eq!(d(Some(OLD), &found(OLD)), Decision::Use);
    }

    #[test]
    fn a_recorded_authority_that_is_gone_or_changed_is_held_with_the_way_out() {
        let missing = held(decide(
            Which::Cluster,
            "c-ca",
            Some(OLD),
            &Stored::Missing,
            &[],
        ));
        assert_eq!(missing.reason, "CertificateAuthorityMissing");
        assert!(
            missing.message.contains("Secret c-ca"),
            "{}",
            missing.message
        );
        assert!(
            missing.message.contains("restore the Secret from a backup"),
            "{}",
            missing.message
        );
        assert!(
            missing
                .message
                .contains(&format!("{REPLACE_AUTHORITIES_ANNOTATION}={OLD}")),
            "{}",
            missing.message
        );
        let changed = held(decide(
            Which::Etcd,
            "c-etcd-ca",
            Some(OLD),
            &found(NEW),
            &[],
        ));
        assert_eq!(changed.reason, "CertificateAuthorityChanged");
        assert!(changed.message.contains(NEW) && changed.message.contains(OLD));
        let sa = held(decide(
            Which::ServiceAccount,
            "c-sa",
            Some(OLD),
            &Stored::Missing,
            &[],
        ));
        assert_eq!(sa.reason, "ServiceAccountKeyMissing");
        assert!(sa.message.contains("token"), "{}", sa.message);
        let bad = held(decide(
            Which::FrontProxy,
            "c-front-proxy-ca",
            Some(OLD),
            &Stored::Unreadable("bad PEM".into()),
            &[],
        ));
        assert_eq!(bad.reason, "CertificateAuthorityUnreadable");
        // Unreadable before anything was recorded: not overwritten either.
        let first = held(decide(
            Which::Cluster,
            "c-ca",
            None,
            &Stored::Unreadable("bad PEM".into()),
            &[],
        ));
        assert_eq!(first.reason, "CertificateAuthorityUnreadable");
    }

    #[test]
    fn only_the_recorded_fingerprint_named_in_the_annotation_replaces() {
        let annotations = [(
            REPLACE_AUTHORITIES_ANNOTATION.to_string(),
            format!(" sha256:zz, {OLD} ,"),
        )]
        .into();
        let replace = replaceable(Some(&annotations));
        assert_eq!(replace, vec!["sha256:zz".to_string(), OLD.to_string()]);
        for stored in [
            Stored::Missing,
            found(NEW),
            Stored::Unreadable("bad".into()),
        ] {
            assert_eq!(
                decide(Which::Cluster, "c-ca", Some(OLD), &stored, &replace),
                Decision::Replace
            );
        }
        // Another recorded fingerprint is not given up by it.
        assert!(matches!(
            decide(
                Which::Cluster,
                "c-ca",
                Some(NEW),
                &Stored::Missing,
                &replace
            ),
            Decision::Hold(_)
        ));
        // Once the new one is recorded and stored, the annotation does nothing.
        assert_eq!(
            decide(Which::Cluster, "c-ca", Some(NEW), &found(NEW), &replace),
            Decision::Use
        );
        assert!(replaceable(None).is_empty());
    }
}

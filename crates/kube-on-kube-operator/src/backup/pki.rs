//! The Cluster's identity, kept with each snapshot: its certificate
//! authorities (cluster, etcd, front-proxy), service-account key pair and
//! the key its Secrets are encrypted at rest with, as their Secrets hold
//! them, sealed with AES-256-GCM under a key the user gives (a Secret), so
//! that a Cluster restored from the snapshot keeps the CA its kubelets and
//! kubeconfigs trust, the key its tokens were signed with and the key that
//! opens its Secrets, and storage that leaks does not leak the keys.
//!
//! Sealed form: `KOKPKI1\n`, a 12-byte random nonce, then the ciphertext of
//! the JSON bundle with its 16-byte tag. The snapshot's name is the
//! additional authenticated data: a bundle moved next to another snapshot
//! does not open. Since format 2 the bundle also names the data it was
//! sealed with (the `.db` object's sha256 and size, and the revision), so
//! a snapshot whose data (and manifest) were swapped for another's is
//! refused before anything is restored from it ([`check_data`]).
//! Everything here is pure but for the nonce.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a sealed bundle starts with.
const MAGIC: &[u8] = b"KOKPKI1\n";
/// The bundle format this code writes: the identity and the data it
/// vouches for.
const FORMAT: u32 = 2;
/// The format written before bundles named their snapshot's data; still
/// read, and said to vouch for no data.
const FORMAT_UNBOUND: u32 = 1;
/// The key of the user's Secret that holds the key.
pub const KEY_FIELD: &str = "key";

/// The Secrets of a Cluster's identity, by the suffix of their name
/// (`<cluster>-<suffix>`).
pub const ROLES: [&str; 4] = ["ca", "etcd-ca", "front-proxy-ca", "sa"];
/// Secrets of the identity kept when the Cluster has them: the key its
/// Secrets are encrypted at rest with (Clusters made before it, and
/// snapshots taken of them, have none).
pub const OPTIONAL_ROLES: [&str; 1] = ["encryption"];

/// The roles of a bundle that are there: every one of [`ROLES`] and those
/// of [`OPTIONAL_ROLES`] it holds.
pub fn roles_of(bundle: &Bundle) -> impl Iterator<Item = &'static str> + '_ {
    ROLES.into_iter().chain(
        OPTIONAL_ROLES
            .into_iter()
            .filter(|r| bundle.secrets.contains_key(*r)),
    )
}

/// Why a bundle could not be sealed or opened.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PkiError {
    /// The user's key is not 32 bytes (raw, or base64 text of them) or a
    /// passphrase.
    #[error(
        "the encryption key must be 32 bytes, raw or as base64 text (make one with `openssl rand -base64 32`), or a passphrase of 32 to 1024 printable characters; it has {0} bytes"
    )]
    KeySize(usize),
    /// The bundle is not one this code sealed, or was cut short.
    #[error("not a sealed PKI bundle")]
    NotSealed,
    /// The tag did not match: another key, another snapshot, or damage.
    #[error(
        "the PKI bundle does not open with key {key_id}: it was sealed with another key (or for another snapshot), or it is damaged"
    )]
    Open { key_id: String },
    /// What opened is not a bundle of a known format.
    #[error("the PKI bundle is not a bundle this operator reads: {0}")]
    Format(String),
    /// A Secret of the identity is missing, or a key of it.
    #[error("{0}")]
    Missing(String),
    /// The snapshot's data is not the data the bundle was sealed with.
    #[error(
        "snapshot {snapshot}'s data is not the data its identity was sealed with: the manifest says {found}, the sealed identity {sealed}; the storage holds another snapshot's (or another cluster's) data under this name"
    )]
    NotItsData {
        snapshot: String,
        found: String,
        sealed: String,
    },
}

/// Iterations of PBKDF2-HMAC-SHA256 a passphrase goes through (OWASP's
/// figure for it): a guess costs a third of a second of a core, once per
/// snapshot taken or restored.
const PASSPHRASE_ITERATIONS: u32 = 600_000;
/// The salt of that derivation: one per purpose, not per key (a key Secret
/// holds the passphrase only; what it seals must still open with it alone).
const PASSPHRASE_SALT: &[u8] = b"kube-on-kube backup key passphrase v1";
/// The passphrases a key Secret may hold: printable text, from 32
/// characters (shorter ones are too easy to guess) up to this.
const PASSPHRASE_MAX: usize = 1024;

/// A 256-bit key.
pub struct Key {
    bytes: [u8; 32],
    /// A passphrase of exactly 32 characters was once used as the key's
    /// bytes as they were; bundles sealed so still open with them.
    former: Option<[u8; 32]>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({})", self.id())
    }
}

impl Key {
    /// The key a Secret's value holds: 32 raw bytes, base64 text of them
    /// (surrounding white space ignored), or a passphrase (printable text
    /// of 32 to 1024 characters), which goes through PBKDF2-HMAC-SHA256: a
    /// passphrase used as the key's bytes as they are would be guessed at
    /// the speed of AES. A passphrase of exactly 32 characters was used so
    /// before; what was sealed with it still opens ([`open`]).
    pub fn from_secret_value(value: &[u8]) -> Result<Key, PkiError> {
        use base64::Engine as _;
        let text = std::str::from_utf8(value).ok().map(str::trim);
        let decoded = text.and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok());
        if let Some(key) = decoded
            .as_deref()
            .and_then(|d| <[u8; 32]>::try_from(d).ok())
        {
            return Ok(Key::raw(key));
        }
        let printable = |b: &u8| b.is_ascii_graphic() || *b == b' ';
        if (32..=PASSPHRASE_MAX).contains(&value.len()) && value.iter().all(printable) {
            let mut bytes = [0u8; 32];
            ring::pbkdf2::derive(
                ring::pbkdf2::PBKDF2_HMAC_SHA256,
                std::num::NonZeroU32::new(PASSPHRASE_ITERATIONS).expect("not zero"),
                PASSPHRASE_SALT,
                value,
                &mut bytes,
            );
            return Ok(Key {
                bytes,
                former: <[u8; 32]>::try_from(value).ok(),
            });
        }
        <[u8; 32]>::try_from(value)
            .map(Key::raw)
            .map_err(|_| PkiError::KeySize(value.len()))
    }

    fn raw(bytes: [u8; 32]) -> Key {
        Key {
            bytes,
            former: None,
        }
    }

    /// A name for the key that does not give it away: the first 16 hex
    /// digits of a sha256 over a label and the key.
    pub fn id(&self) -> String {
        let digest = Sha256::new()
            .chain_update(b"kube-on-kube pki key id\n")
            .chain_update(self.bytes)
            .finalize();
        hex(&digest[..8])
    }

    fn aead(&self) -> LessSafeKey {
        aead(&self.bytes)
    }
}

fn aead(key: &[u8; 32]) -> LessSafeKey {
    // 32 bytes is AES-256-GCM's key length: cannot fail.
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte key"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The snapshot data a bundle is sealed with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Data {
    /// sha256 of the `.db` object, lower-case hex.
    pub sha256: String,
    /// Its size in bytes.
    pub size: u64,
    /// The etcd revision the snapshot holds at least.
    pub revision: u64,
}

impl std::fmt::Display for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sha256 {}, {} bytes, revision {}",
            self.sha256, self.size, self.revision
        )
    }
}

/// The identity Secrets' data, by role ([`ROLES`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bundle {
    format: u32,
    /// Role → the Secret's data.
    pub secrets: BTreeMap<String, BTreeMap<String, ByteString>>,
    /// The data of the snapshot it is sealed with (format 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Data>,
}

impl Bundle {
    /// A bundle of `secrets` (role → data); every role of [`ROLES`] must be
    /// there.
    pub fn new(
        secrets: BTreeMap<String, BTreeMap<String, ByteString>>,
    ) -> Result<Bundle, PkiError> {
        let missing: Vec<&str> = ROLES
            .iter()
            .copied()
            .filter(|r| secrets.get(*r).is_none_or(BTreeMap::is_empty))
            .collect();
        if !missing.is_empty() {
            return Err(PkiError::Missing(format!(
                "the cluster's {} Secret(s) are missing or empty",
                missing.join(", ")
            )));
        }
        Ok(Bundle {
            format: FORMAT_UNBOUND,
            secrets,
            data: None,
        })
    }

    /// The bundle, naming the snapshot data it is sealed with (what
    /// snapshots are stored with).
    pub fn for_data(&self, data: Data) -> Bundle {
        Bundle {
            format: FORMAT,
            data: Some(data),
            ..self.clone()
        }
    }
}

/// Whether `bundle` (opened for snapshot `snapshot`) vouches for `found`,
/// the data the snapshot's manifest describes: `Ok(true)` when it names
/// that data, `Ok(false)` for a bundle sealed before bundles named their
/// data (it vouches for none), an error when it names other data.
pub fn check_data(bundle: &Bundle, snapshot: &str, found: &Data) -> Result<bool, PkiError> {
    match &bundle.data {
        None => Ok(false),
        Some(sealed) if sealed == found => Ok(true),
        Some(sealed) => Err(PkiError::NotItsData {
            snapshot: snapshot.to_string(),
            found: found.to_string(),
            sealed: sealed.to_string(),
        }),
    }
}

/// Seal `bundle` under `key` for the snapshot `snapshot`.
pub fn seal(bundle: &Bundle, key: &Key, snapshot: &str) -> Vec<u8> {
    let mut nonce = [0u8; NONCE_LEN];
    // The system's generator failing is not something to carry on from.
    SystemRandom::new()
        .fill(&mut nonce)
        .expect("the system's random generator");
    // A bundle of byte maps always serializes.
    let mut data = serde_json::to_vec(bundle).expect("bundle JSON");
    key.aead()
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(snapshot.as_bytes()),
            &mut data,
        )
        .expect("sealing within AES-GCM's size limit");
    let mut out = Vec::with_capacity(MAGIC.len() + NONCE_LEN + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&data);
    out
}

/// Open a bundle sealed for `snapshot` with `key`.
pub fn open(sealed: &[u8], key: &Key, snapshot: &str) -> Result<Bundle, PkiError> {
    let rest = sealed.strip_prefix(MAGIC).ok_or(PkiError::NotSealed)?;
    if rest.len() < NONCE_LEN + AES_256_GCM.tag_len() {
        return Err(PkiError::NotSealed);
    }
    let (nonce, ciphertext) = rest.split_at(NONCE_LEN);
    let nonce: [u8; NONCE_LEN] = nonce.try_into().map_err(|_| PkiError::NotSealed)?;
    // The key, then the bytes a 32-character passphrase was used as before
    // it went through the derivation.
    let plain = std::iter::once(&key.bytes)
        .chain(&key.former)
        .find_map(|k| {
            let mut data = ciphertext.to_vec();
            let len = aead(k)
                .open_in_place(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(snapshot.as_bytes()),
                    &mut data,
                )
                .ok()?
                .len();
            data.truncate(len);
            Some(data)
        })
        .ok_or_else(|| PkiError::Open { key_id: key.id() })?;
    let bundle: Bundle =
        serde_json::from_slice(&plain).map_err(|e| PkiError::Format(e.to_string()))?;
    match (bundle.format, &bundle.data) {
        (FORMAT, Some(_)) | (FORMAT_UNBOUND, None) => {}
        (FORMAT, None) => return Err(PkiError::Format("format 2 without its data".into())),
        (format, _) => return Err(PkiError::Format(format!("format {format}"))),
    }
    let data = bundle.data.clone();
    Ok(Bundle {
        format: bundle.format,
        data,
        ..Bundle::new(bundle.secrets)?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle() -> Bundle {
        Bundle::new(
            ROLES
                .iter()
                .map(|r| {
                    (
                        r.to_string(),
                        [(
                            "tls.key".to_string(),
                            ByteString(format!("{r} key").into_bytes()),
                        )]
                        .into(),
                    )
                })
                .collect(),
        )
        .unwrap()
    }

    fn key(byte: u8) -> Key {
        Key::raw([byte; 32])
    }

    #[test]
    fn a_sealed_bundle_opens_with_its_key_for_its_snapshot_only() {
        let sealed = seal(&bundle(), &key(1), "20261127T120500Z-r1");
        assert!(sealed.starts_with(MAGIC));
        // The keys are not there in the clear.
        assert!(!sealed.windows(6).any(|w| w == b"ca key"));
        assert_eq!(open(&sealed, &key(1), "20261127T120500Z-r1"), Ok(bundle()));
        let other = open(&sealed, &key(2), "20261127T120500Z-r1").unwrap_err();
        assert_eq!(
            other,
            PkiError::Open {
                key_id: key(2).id()
            }
        );
        assert!(open(&sealed, &key(1), "20261127T120501Z-r2").is_err());
        let mut damaged = sealed.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        assert!(matches!(
            open(&damaged, &key(1), "20261127T120500Z-r1"),
            Err(PkiError::Open { .. })
        ));
        assert_eq!(
            open(&sealed[..20], &key(1), "20261127T120500Z-r1"),
            Err(PkiError::NotSealed)
        );
    }

    #[test]
    fn a_bundle_vouches_for_the_data_it_was_sealed_with_only() {
        let data = Data {
            sha256: "ab".repeat(32),
            size: 4096,
            revision: 7,
        };
        let sealed = seal(&bundle().for_data(data.clone()), &key(1), "s");
        let opened = open(&sealed, &key(1), "s").unwrap();
        assert_eq!(opened.data.as_ref(), Some(&data));
        assert_eq!(check_data(&opened, "s", &data), Ok(true));
        // Another snapshot's data under this name, manifest and all.
        for other in [
            Data {
                sha256: "cd".repeat(32),
                ..data.clone()
            },
            Data {
                size: 4097,
                ..data.clone()
            },
            Data {
                revision: 8,
                ..data.clone()
            },
        ] {
            let e = check_data(&opened, "s", &other).unwrap_err();
            assert!(matches!(e, PkiError::NotItsData { .. }), "{e}");
            assert!(e.to_string().contains(&other.to_string()), "{e}");
        }
        // A bundle of the first format names no data: it vouches for none.
        let old = open(&seal(&bundle(), &key(1), "s"), &key(1), "s").unwrap();
        assert_eq!(check_data(&old, "s", &data), Ok(false));
    }

    #[test]
    fn the_encryption_key_is_kept_when_the_cluster_has_one() {
        let mut secrets = bundle().secrets;
        let plain: Vec<&str> = roles_of(&bundle()).collect();
        assert_eq!(plain, ROLES);
        secrets.insert(
            "encryption".into(),
            [("key".to_string(), ByteString(b"k".to_vec()))].into(),
        );
        let with_key = Bundle::new(secrets).unwrap();
        let opened = open(&seal(&with_key, &key(1), "s"), &key(1), "s").unwrap();
        assert_eq!(opened, with_key);
        assert!(roles_of(&opened).any(|r| r == "encryption"));
    }

    #[test]
    fn two_seals_of_one_bundle_differ() {
        assert_ne!(seal(&bundle(), &key(1), "s"), seal(&bundle(), &key(1), "s"));
    }

    #[test]
    fn keys_are_32_bytes_raw_or_base64() {
        use base64::Engine as _;
        let raw = [7u8; 32];
        let text = base64::engine::general_purpose::STANDARD.encode(raw);
        let a = Key::from_secret_value(&raw).unwrap();
        let b = Key::from_secret_value(format!("{text}\n").as_bytes()).unwrap();
        assert_eq!(a.id(), b.id());
        assert_eq!(a.id().len(), 16);
        assert_eq!(
            Key::from_secret_value(b"short").unwrap_err(),
            PkiError::KeySize(5)
        );
        let sixteen = base64::engine::general_purpose::STANDARD.encode([1u8; 16]);
        assert!(Key::from_secret_value(sixteen.as_bytes()).is_err());
    }

    #[test]
    fn passphrases_go_through_a_derivation_and_open_what_they_sealed_before() {
        let phrase = b"correct horse battery staple 123";
        assert_eq!(phrase.len(), 32);
        let key = Key::from_secret_value(phrase).unwrap();
        // Not the passphrase's bytes as they are, nor their id.
        assert_ne!(key.bytes, *phrase);
        assert_ne!(key.id(), Key::raw(*phrase).id());
        // The same passphrase, the same key (each derivation takes about a
        // second in a debug build: this test makes three).
        assert_eq!(Key::from_secret_value(phrase).unwrap().id(), key.id());
        // A bundle sealed with the passphrase used as the key opens, and one
        // sealed with the derived key; another passphrase opens neither.
        let before = seal(&bundle(), &Key::raw(*phrase), "s");
        assert_eq!(open(&before, &key, "s").unwrap(), bundle());
        let now = seal(&bundle(), &key, "s");
        assert_eq!(open(&now, &key, "s").unwrap(), bundle());
        assert!(open(&now, &Key::raw(*phrase), "s").is_err());
        // A longer passphrase is one too, with no former bytes to try.
        let other = Key::from_secret_value(b"correct horse battery staple 1234, and more").unwrap();
        assert_eq!(other.former, None);
        assert!(open(&before, &other, "s").is_err());
        assert!(open(&now, &other, "s").is_err());
        // Shorter and unprintable values are refused (before any derivation).
        assert_eq!(
            Key::from_secret_value(b"only twenty-four letters").unwrap_err(),
            PkiError::KeySize(24)
        );
        let mut binary = [b'a'; 40];
        binary[3] = 0;
        assert_eq!(
            Key::from_secret_value(&binary).unwrap_err(),
            PkiError::KeySize(40)
        );
    }

    #[test]
    fn a_bundle_needs_every_role() {
        let mut secrets = bundle().secrets;
        secrets.remove("sa");
        let e = Bundle::new(secrets).unwrap_err();
        assert!(e.to_string().contains("sa"), "{e}");
    }
}

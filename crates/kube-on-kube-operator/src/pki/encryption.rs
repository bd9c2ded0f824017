//! The keys kube-apiserver encrypts Secrets at rest with, and the
//! `EncryptionConfiguration` that names them: `secretbox` (XSalsa20 and
//! Poly1305) with 32-byte keys for Secrets, then `identity`, so that
//! Secrets written before encryption was on are still read (and encrypted
//! when next written). Made once per Cluster and kept like its CAs (see
//! [`super::authorities`]): losing it loses every Secret stored.
//!
//! The configuration holds a [`Ring`] of one or two keys, the first the one
//! that encrypts. A rotation ([`crate::key_rotation`]) goes `[a]` → `[a, b]`
//! (every kube-apiserver can read `b` before any writes with it) → `[b, a]`
//! (`b` encrypts; every Secret is written again) → `[b]`. Key names are
//! `key<N>`, numbered up: the name is stored with every value it encrypts
//! (`k8s:enc:secretbox:v1:key1:`), and a second key numbered above the first
//! is the one coming, below it the one going.

use base64::Engine as _;
use serde::Deserialize;

use super::PkiError;

/// The Secret's key holding the encrypting key: base64 of 32 bytes.
pub const KEY: &str = "key";
/// The Secret's key holding the configuration kube-apiserver reads.
pub const CONFIG: &str = crate::names::ENCRYPTION_CONFIG_KEY;
/// The name of a Cluster's first key.
const FIRST_NAME: &str = "key1";

/// One key of the ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedKey {
    /// Its name in the configuration, `key<N>`.
    pub name: String,
    /// The key: base64 of 32 bytes.
    pub secret: String,
}

impl NamedKey {
    fn number(&self) -> u32 {
        key_number(&self.name).unwrap_or(0)
    }

    /// Its fingerprint (of the 32 bytes).
    pub fn fingerprint(&self) -> String {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(self.secret.trim())
            .unwrap_or_default();
        super::fingerprint(&bytes)
    }
}

/// Where a ring is in a rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// One key.
    Steady,
    /// A second key is there to be read, not yet to encrypt.
    Adding,
    /// The new key encrypts; the old one is still there to be read.
    Retiring,
}

/// The keys of the configuration, the first the one that encrypts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    pub keys: Vec<NamedKey>,
}

impl Ring {
    /// The ring of the Secret's `key` and `config`: the configuration must
    /// be exactly what [`Ring::config`] renders for its keys (nothing added
    /// to it), with one or two distinct 32-byte keys named `key<N>`, the
    /// first of them `key`.
    pub fn parse(key: &str, config: &str) -> Result<Ring, PkiError> {
        let bad = |message: String| PkiError::Parse {
            what: "encryption configuration",
            message,
        };
        let parsed: Configuration =
            serde_norway::from_str(config).map_err(|e| bad(e.to_string()))?;
        let keys: Vec<NamedKey> = parsed
            .resources
            .first()
            .and_then(|r| r.providers.first())
            .and_then(|p| p.secretbox.as_ref())
            .map(|s| {
                s.keys
                    .iter()
                    .map(|k| NamedKey {
                        name: k.name.clone(),
                        secret: k.secret.clone(),
                    })
                    .collect()
            })
            .ok_or_else(|| bad("it has no secretbox provider first".into()))?;
        if keys.is_empty() || keys.len() > 2 {
            return Err(bad(format!("{} keys, not one or two", keys.len())));
        }
        for k in &keys {
            decode(&k.secret)?;
            if key_number(&k.name).is_none() {
                return Err(bad(format!("key name {:?} is not key<N>", k.name)));
            }
        }
        if keys.len() == 2 && keys[0].name == keys[1].name {
            return Err(bad(format!("two keys named {}", keys[0].name)));
        }
        if keys[0].secret != key.trim() {
            return Err(bad(
                "it is not the configuration of the key beside it".into()
            ));
        }
        let ring = Ring { keys };
        if ring.config() != config {
            return Err(bad(
                "it is not the configuration the operator writes for its keys".into(),
            ));
        }
        Ok(ring)
    }

    /// The configuration kube-apiserver reads.
    pub fn config(&self) -> String {
        let keys: String = self
            .keys
            .iter()
            .map(|k| format!("      - name: {}\n        secret: {}\n", k.name, k.secret))
            .collect();
        format!(
            "apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources:
  - secrets
  providers:
  - secretbox:
      keys:
{keys}  - identity: {{}}
"
        )
    }

    /// The key that encrypts.
    pub fn first(&self) -> &NamedKey {
        &self.keys[0]
    }

    /// Where it is in a rotation.
    pub fn phase(&self) -> Phase {
        match self.keys.as_slice() {
            [first, second] if second.number() > first.number() => Phase::Adding,
            [_, _] => Phase::Retiring,
            _ => Phase::Steady,
        }
    }

    /// Whether one of its keys has `fingerprint`.
    pub fn holds(&self, fingerprint: &str) -> bool {
        self.keys.iter().any(|k| k.fingerprint() == fingerprint)
    }

    /// `[a]` → `[a, b]` with a new key `b`.
    pub fn with_new_key(&self) -> Result<Ring, PkiError> {
        let number = self.keys.iter().map(NamedKey::number).max().unwrap_or(0) + 1;
        let mut keys = vec![self.first().clone()];
        keys.push(NamedKey {
            name: format!("key{number}"),
            secret: random_key()?,
        });
        Ok(Ring { keys })
    }

    /// `[a, b]` → `[b, a]`: the new key encrypts.
    pub fn switched(&self) -> Ring {
        let mut keys = self.keys.clone();
        keys.reverse();
        Ring { keys }
    }

    /// `[b, a]` → `[b]`: the old key goes.
    pub fn retired(&self) -> Ring {
        Ring {
            keys: vec![self.first().clone()],
        }
    }
}

/// kube-apiserver's configuration with the KMS v2 plugin `name` first (it
/// encrypts), then the ring's keys and `identity` (they read what was
/// written before).
pub fn kms_config(ring: &Ring, name: &str) -> String {
    use crate::names::KMS_SOCKET;
    ring.config().replacen(
        "  providers:\n",
        &format!(
            "  providers:\n  - kms:\n      apiVersion: v2\n      name: {name}\n      endpoint: unix://{KMS_SOCKET}\n      timeout: 3s\n"
        ),
        1,
    )
}

/// The ring an encryption Secret holds, if it holds a readable one.
pub fn stored(secret: &k8s_openapi::api::core::v1::Secret) -> Option<Ring> {
    let data = secret.data.as_ref()?;
    let text = |k: &str| {
        data.get(k)
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
    };
    Ring::parse(&text(KEY)?, &text(CONFIG)?).ok()
}

/// `N` of a key name `key<N>` (N ≥ 1).
fn key_number(name: &str) -> Option<u32> {
    let n: u32 = name.strip_prefix("key")?.parse().ok()?;
    (n >= 1 && name == format!("key{n}")).then_some(n)
}

/// The parts of an `EncryptionConfiguration` a ring is read from.
#[derive(Deserialize)]
struct Configuration {
    resources: Vec<Resources>,
}

#[derive(Deserialize)]
struct Resources {
    providers: Vec<Provider>,
}

#[derive(Deserialize)]
struct Provider {
    secretbox: Option<Secretbox>,
}

#[derive(Deserialize)]
struct Secretbox {
    keys: Vec<ConfiguredKey>,
}

#[derive(Deserialize)]
struct ConfiguredKey {
    name: String,
    secret: String,
}

/// The configuration for the single key `key` (base64 of 32 bytes).
pub fn config(key: &str) -> String {
    Ring {
        keys: vec![NamedKey {
            name: FIRST_NAME.into(),
            secret: key.into(),
        }],
    }
    .config()
}

/// Base64 of 32 random bytes.
fn random_key() -> Result<String, PkiError> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| PkiError::Parse {
            what: "the system's random generator",
            message: "no random bytes".into(),
        })?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// A new key: (the key as base64, its configuration, its fingerprint).
pub fn new_key() -> Result<(String, String, String), PkiError> {
    let key = random_key()?;
    let bytes = decode(&key)?;
    let fingerprint = super::fingerprint(&bytes);
    Ok((key.clone(), config(&key), fingerprint))
}

/// The 32 bytes of a key given as base64.
fn decode(key: &str) -> Result<Vec<u8>, PkiError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(key.trim())
        .map_err(|e| PkiError::Parse {
            what: "encryption key",
            message: e.to_string(),
        })?;
    if bytes.len() != 32 {
        return Err(PkiError::Parse {
            what: "encryption key",
            message: format!("{} bytes, not 32", bytes.len()),
        });
    }
    Ok(bytes)
}

/// The fingerprint of the stored encrypting `key` when `stored_config` is
/// the configuration of a ring it heads.
pub fn check(key: &str, stored_config: &str) -> Result<String, PkiError> {
    Ok(Ring::parse(key, stored_config)?.first().fingerprint())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_checks_and_its_configuration_names_it_first() {
        let (key, config_text, fingerprint) = new_key().unwrap();
        assert_eq!(check(&key, &config_text).unwrap(), fingerprint);
        let secretbox = config_text.find("secretbox").unwrap();
        let identity = config_text.find("identity").unwrap();
        assert!(secretbox < identity, "{config_text}");
        assert!(config_text.contains(&key));
        let (other, _, other_fingerprint) = new_key().unwrap();
        assert_ne!(other_fingerprint, fingerprint);
        // A configuration of another key, a short key, or no base64.
        assert!(check(&key, &config(&other)).is_err());
        let short = base64::engine::general_purpose::STANDARD.encode([1u8; 16]);
        assert!(check(&short, &config(&short)).is_err());
        assert!(check("not base64!", &config("not base64!")).is_err());
    }

    #[test]
    fn a_rotation_adds_switches_and_retires_with_every_step_checked() {
        let (key, config_text, fingerprint) = new_key().unwrap();
        let ring = Ring::parse(&key, &config_text).unwrap();
        assert_eq!(ring.phase(), Phase::Steady);
        // A Secret written before rings existed is the ring of key1.
        assert_eq!(ring.first().name, "key1");
        assert_eq!(ring.config(), config_text);

        let adding = ring.with_new_key().unwrap();
        assert_eq!(adding.phase(), Phase::Adding);
        assert_eq!(adding.first(), ring.first(), "the old key still encrypts");
        assert_eq!(adding.keys[1].name, "key2");
        let added = adding.config();
        assert_eq!(check(&key, &added).unwrap(), fingerprint);
        assert!(added.find("name: key1").unwrap() < added.find("name: key2").unwrap());

        let retiring = adding.switched();
        assert_eq!(retiring.phase(), Phase::Retiring);
        let new_key = retiring.first().secret.clone();
        let new_fingerprint = retiring.first().fingerprint();
        assert_ne!(new_fingerprint, fingerprint);
        assert_eq!(
            check(&new_key, &retiring.config()).unwrap(),
            new_fingerprint
        );
        assert!(retiring.holds(&fingerprint) && retiring.holds(&new_fingerprint));
        // The configuration of the switched ring names the old key second.
        assert!(check(&key, &retiring.config()).is_err());

        let done = retiring.retired();
        assert_eq!(done.phase(), Phase::Steady);
        assert!(!done.holds(&fingerprint));
        assert_eq!(done.first().name, "key2");
        // The next rotation numbers on.
        assert_eq!(done.with_new_key().unwrap().keys[1].name, "key3");
    }

    #[test]
    fn a_kms_plugin_encrypts_first_and_the_keys_still_read() {
        let (key, config_text, _) = new_key().unwrap();
        let ring = Ring::parse(&key, &config_text).unwrap();
        let text = kms_config(&ring, "vault");
        let kms = text.find("- kms:").unwrap();
        let secretbox = text.find("- secretbox:").unwrap();
        let identity = text.find("- identity:").unwrap();
        assert!(kms < secretbox && secretbox < identity, "{text}");
        assert!(
            text.contains("name: vault\n      endpoint: unix:///var/run/kmsplugin/socket.sock")
        );
        assert!(text.contains("apiVersion: v2") && text.contains(&key));
        // It is no ring the operator keeps in the encryption Secret.
        assert!(check(&key, &text).is_err());
    }

    #[test]
    fn a_configuration_the_operator_did_not_write_is_refused() {
        let (key, config_text, _) = new_key().unwrap();
        let ring = Ring::parse(&key, &config_text)
            .unwrap()
            .with_new_key()
            .unwrap();
        let text = ring.config();
        // Another provider put first, a third key, a duplicate name, a key
        // not named key<N>, anything added.
        let aescbc = text.replacen("secretbox:", "aescbc:", 1);
        let third = text.replacen(
            "  - identity",
            &format!("      - name: key9\n        secret: {key}\n  - identity"),
            1,
        );
        let duplicate = text.replacen("name: key2", "name: key1", 1);
        let named = text.replacen("name: key2", "name: mine", 1);
        let zero = text.replacen("name: key2", "name: key02", 1);
        let added = format!("{text}# more\n");
        let kms = text.replacen(
            "  - identity: {}",
            "  - kms:\n      apiVersion: v2\n      name: x\n      endpoint: unix:///x\n  - identity: {}",
            1,
        );
        for bad in [aescbc, third, duplicate, named, zero, added, kms] {
            assert!(check(&key, &bad).is_err(), "{bad}");
        }
        assert!(check(&key, &text).is_ok());
    }
}

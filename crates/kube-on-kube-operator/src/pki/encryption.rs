//! The key kube-apiserver encrypts Secrets at rest with, and the
//! `EncryptionConfiguration` that names it: `secretbox` (XSalsa20 and
//! Poly1305) with a 32-byte key for Secrets, then `identity`, so that
//! Secrets written before encryption was on are still read (and encrypted
//! when next written). Made once per Cluster and kept like its CAs (see
//! [`super::authorities`]): losing it loses every Secret stored.

use base64::Engine as _;

use super::PkiError;

/// The Secret's key holding the encryption key: base64 of 32 bytes.
pub const KEY: &str = "key";
/// The Secret's key holding the configuration kube-apiserver reads.
pub const CONFIG: &str = crate::names::ENCRYPTION_CONFIG_KEY;
/// The key's name in the configuration (stored with every value it
/// encrypts: `k8s:enc:secretbox:v1:key1:`).
const KEY_NAME: &str = "key1";

/// The configuration for the key `key` (base64 of 32 bytes).
pub fn config(key: &str) -> String {
    format!(
        "apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources:
  - secrets
  providers:
  - secretbox:
      keys:
      - name: {KEY_NAME}
        secret: {key}
  - identity: {{}}
"
    )
}

/// A new key: (the key as base64, its configuration, its fingerprint).
pub fn new_key() -> Result<(String, String, String), PkiError> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| PkiError::Parse {
            what: "the system's random generator",
            message: "no random bytes".into(),
        })?;
    let key = base64::engine::general_purpose::STANDARD.encode(bytes);
    let fingerprint = super::fingerprint(&bytes);
    Ok((key.clone(), config(&key), fingerprint))
}

/// The fingerprint of the stored `key` when it is 32 bytes of base64 and
/// `stored_config` is its configuration.
pub fn check(key: &str, stored_config: &str) -> Result<String, PkiError> {
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
    if stored_config != config(key) {
        return Err(PkiError::Parse {
            what: "encryption configuration",
            message: "it is not the configuration of the key beside it".into(),
        });
    }
    Ok(super::fingerprint(&bytes))
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
}

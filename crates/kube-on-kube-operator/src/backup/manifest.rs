//! What a snapshot is called in the store and what its manifest records.
//!
//! A snapshot is two objects under the target's prefix: the data,
//! `<name>.db` (the file `etcdctl snapshot save` would write), and its
//! manifest, `<name>.manifest.json`, written only after the data is whole.
//! A snapshot without a manifest was cut short and is never listed. Names
//! start with the UTC time the snapshot was taken, so they sort by age.
//! Everything here is pure.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// The manifest format this code writes and reads.
pub const FORMAT: u32 = 1;
/// The data object's name ends with this.
pub const DATA_SUFFIX: &str = ".db";
/// The manifest's name ends with this.
pub const MANIFEST_SUFFIX: &str = ".manifest.json";
/// The sealed PKI bundle's name ends with this (see [`super::pki`]).
pub const PKI_SUFFIX: &str = ".pki";

/// Why a manifest was not taken.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Not the JSON of a manifest.
    #[error("not a snapshot manifest: {0}")]
    Json(#[source] serde_json::Error),
    /// A format this code does not know.
    #[error("manifest format {0} is not {FORMAT}")]
    Format(u32),
    /// It names another snapshot or object than the one it was found as.
    #[error("manifest of {found:?} found as {expected:?}")]
    Name { expected: String, found: String },
    /// Its checksum is not a sha256.
    #[error("manifest sha256 {0:?} is not 64 hex digits")]
    Sha256(String),
}

/// What the store records about one complete snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    /// The snapshot's name (see [`snapshot_name`]).
    pub name: String,
    /// The data object's name under the prefix: `<name>.db`.
    pub object: String,
    /// Bytes of the data object.
    pub size: u64,
    /// sha256 of the data object, lower-case hex.
    pub sha256: String,
    /// The etcd revision the member had when the snapshot started; the
    /// snapshot holds at least this revision.
    pub etcd_revision: u64,
    /// The etcd server version of the member it was taken from.
    pub etcd_version: String,
    /// The business cluster's Kubernetes version, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    /// When it was taken, RFC 3339 in UTC.
    pub taken_at: String,
    /// The client URL of the member it was taken from.
    pub member: String,
    /// The Cluster's sealed identity stored beside it, when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pki: Option<PkiObject>,
    /// The request (the `kubeonkube.io/backup-requested` annotation's value)
    /// it was taken for, when it was: a restarted operator finds the answer
    /// here instead of taking a second snapshot for the same request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
}

/// The sealed PKI bundle of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PkiObject {
    /// Its object's name under the prefix: `<name>.pki`.
    pub object: String,
    /// sha256 of the object, lower-case hex.
    pub sha256: String,
    /// The id of the key it is sealed with ([`super::pki::Key::id`]).
    pub key_id: String,
}

impl Manifest {
    /// The manifest object's name under the prefix.
    pub fn manifest_object(&self) -> String {
        format!("{}{MANIFEST_SUFFIX}", self.name)
    }

    /// Reads the manifest stored as `<name>.manifest.json` and checks that
    /// it is about that snapshot.
    pub fn parse(bytes: &[u8], name: &str) -> Result<Manifest, ManifestError> {
        let manifest: Manifest = serde_json::from_slice(bytes).map_err(ManifestError::Json)?;
        if manifest.format != FORMAT {
            return Err(ManifestError::Format(manifest.format));
        }
        let object = format!("{name}{DATA_SUFFIX}");
        if manifest.name != name || manifest.object != object {
            return Err(ManifestError::Name {
                expected: object,
                found: manifest.object,
            });
        }
        if !is_sha256(&manifest.sha256) {
            return Err(ManifestError::Sha256(manifest.sha256));
        }
        if let Some(pki) = &manifest.pki {
            let object = format!("{name}{PKI_SUFFIX}");
            if pki.object != object {
                return Err(ManifestError::Name {
                    expected: object,
                    found: pki.object.clone(),
                });
            }
            if !is_sha256(&pki.sha256) {
                return Err(ManifestError::Sha256(pki.sha256.clone()));
            }
        }
        Ok(manifest)
    }
}

fn is_sha256(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A snapshot's name: `20261127T120500Z-r12345`, the UTC second it was
/// taken and the revision it holds at least. Sorting names sorts by time.
pub fn snapshot_name(taken_at: OffsetDateTime, revision: u64) -> String {
    let compact: String = rfc3339(taken_at)
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect();
    format!("{compact}-r{revision}")
}

/// `taken_at` as RFC 3339 in UTC, to the second.
pub fn rfc3339(taken_at: OffsetDateTime) -> String {
    let t = taken_at.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Whether `name` is one [`snapshot_name`] makes.
pub fn is_snapshot_name(name: &str) -> bool {
    let Some((time, revision)) = name.split_once("-r") else {
        return false;
    };
    let b = time.as_bytes();
    b.len() == 16
        && b[8] == b'T'
        && b[15] == b'Z'
        && b[..8].iter().chain(&b[9..15]).all(u8::is_ascii_digit)
        && !revision.is_empty()
        && revision.bytes().all(|c| c.is_ascii_digit())
}

/// One object directly under the prefix, as listed: its name and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The object's name under the prefix.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
}

/// The snapshots whose data object and manifest are both listed, newest
/// first, each with its data object's size; other objects are ignored.
pub fn complete(listed: &[Listed]) -> Vec<(String, u64)> {
    let data: std::collections::HashMap<&str, u64> = listed
        .iter()
        .filter_map(|o| Some((o.name.strip_suffix(DATA_SUFFIX)?, o.size)))
        .collect();
    let mut names: Vec<(String, u64)> = listed
        .iter()
        .filter_map(|o| o.name.strip_suffix(MANIFEST_SUFFIX))
        .filter(|name| is_snapshot_name(name))
        .filter_map(|name| Some((name.to_string(), *data.get(name)?)))
        .collect();
    names.sort_by(|a, b| b.0.cmp(&a.0));
    names
}

/// Objects of snapshots that never got their manifest, named before
/// `newest` (the snapshot just stored): what an upload cut short by the
/// process dying left behind. Uploads run one at a time per target, so none
/// of them is still being written. Objects of other names are not ours and
/// are left alone.
pub fn abandoned(listed: &[Listed], newest: &str) -> Vec<String> {
    let manifests: std::collections::HashSet<&str> = listed
        .iter()
        .filter_map(|o| o.name.strip_suffix(MANIFEST_SUFFIX))
        .collect();
    let mut names: Vec<String> = listed
        .iter()
        .filter(|o| {
            [DATA_SUFFIX, PKI_SUFFIX].iter().any(|suffix| {
                o.name.strip_suffix(suffix).is_some_and(|name| {
                    is_snapshot_name(name) && name < newest && !manifests.contains(name)
                })
            })
        })
        .map(|o| o.name.clone())
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(unix: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(unix).unwrap()
    }

    fn manifest(name: &str) -> Manifest {
        Manifest {
            format: FORMAT,
            name: name.into(),
            object: format!("{name}.db"),
            size: 20_512,
            sha256: "ab".repeat(32),
            etcd_revision: 12,
            etcd_version: "3.6.16".into(),
            kubernetes_version: Some("v1.35.4".into()),
            taken_at: "2026-11-27T12:05:00Z".into(),
            member: "https://c-etcd-0.ns.svc:2379".into(),
            pki: None,
            request: None,
        }
    }

    #[test]
    fn names_sort_by_time_and_carry_the_revision() {
        // 2026-11-27T12:05:00Z
        let t = at(1_795_781_100);
        assert_eq!(snapshot_name(t, 12345), "20261127T120500Z-r12345");
        assert_eq!(rfc3339(t), "2026-11-27T12:05:00Z");
        let earlier = snapshot_name(at(1_795_781_100 - 86_400 * 40), 99_999);
        assert!(earlier < snapshot_name(t, 1));
        assert!(is_snapshot_name("20261127T120500Z-r12345"));
        for bad in [
            "20261127T120500Z-r",
            "20261127T120500Z-rx",
            "2026112T120500Z-r1",
            "20261127-120500Z-r1",
            "latest",
        ] {
            assert!(!is_snapshot_name(bad), "{bad}");
        }
    }

    #[test]
    fn only_snapshots_with_data_and_manifest_are_complete_newest_first() {
        let listed = |name: &str, size| Listed {
            name: name.into(),
            size,
        };
        let objects = vec![
            listed("20261127T120000Z-r10.db", 100),
            listed("20261127T120000Z-r10.manifest.json", 1),
            // Data whose manifest was never written: cut short.
            listed("20261127T130000Z-r20.db", 200),
            listed("20261127T140000Z-r30.manifest.json", 1),
            listed("20261127T140000Z-r30.db", 300),
            // A manifest whose data is gone.
            listed("20261127T150000Z-r40.manifest.json", 1),
            // Not ours.
            listed("notes.manifest.json", 1),
            listed("notes.db", 1),
        ];
        assert_eq!(
            complete(&objects),
            vec![
                ("20261127T140000Z-r30".to_string(), 300),
                ("20261127T120000Z-r10".to_string(), 100),
            ]
        );
        assert!(complete(&[]).is_empty());
        // Cut short before the newest: removed once a later one is stored;
        // nothing else is.
        assert_eq!(
            abandoned(&objects, "20261127T140000Z-r30"),
            ["20261127T130000Z-r20.db"]
        );
        let with_pki = [
            objects.clone(),
            vec![
                listed("20261127T130000Z-r20.pki", 9),
                listed("20261127T120000Z-r10.pki", 9),
                // Being written now, by name after the newest: not touched.
                listed("20261127T160000Z-r50.db", 9),
            ],
        ]
        .concat();
        assert_eq!(
            abandoned(&with_pki, "20261127T150500Z-r45"),
            ["20261127T130000Z-r20.db", "20261127T130000Z-r20.pki"]
        );
        assert!(abandoned(&objects, "20261127T120000Z-r10").is_empty());
    }

    #[test]
    fn a_manifest_round_trips_and_is_checked() {
        let m = manifest("20261127T120500Z-r12");
        let json = serde_json::to_vec(&m).unwrap();
        assert_eq!(Manifest::parse(&json, "20261127T120500Z-r12").unwrap(), m);
        assert_eq!(m.manifest_object(), "20261127T120500Z-r12.manifest.json");
        let text = String::from_utf8(json.clone()).unwrap();
        assert!(text.contains(r#""etcdRevision":12"#), "{text}");

        assert!(matches!(
            Manifest::parse(&json, "20261127T120500Z-r13"),
            Err(ManifestError::Name { .. })
        ));
        let mut other = m.clone();
        other.format = 2;
        assert!(matches!(
            Manifest::parse(&serde_json::to_vec(&other).unwrap(), &m.name),
            Err(ManifestError::Format(2))
        ));
        let mut other = m.clone();
        other.sha256 = "AB".repeat(32);
        assert!(matches!(
            Manifest::parse(&serde_json::to_vec(&other).unwrap(), &m.name),
            Err(ManifestError::Sha256(_))
        ));
        assert!(matches!(
            Manifest::parse(b"{", &m.name),
            Err(ManifestError::Json(_))
        ));
    }
}

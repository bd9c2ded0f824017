//! Snapshots in S3-compatible storage: uploaded as they stream from etcd
//! (a multipart upload, hashed on the way), listed newest first, and
//! downloaded with their size and checksum checked before the file is in
//! place.
//!
//! A snapshot is only ever added: an upload refuses a name that exists,
//! writes the data object first and the manifest last, with a conditional
//! put, so a failure at any point leaves every existing snapshot as it was
//! and at most an unlisted data object of its own (see [`super::manifest`]).

use std::path::{Path as FsPath, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::client::{HttpError, HttpErrorKind};
use object_store::path::Path;
use object_store::{
    Attribute, Attributes, ObjectStore, ObjectStoreExt, PutMode, PutMultipartOptions, PutOptions,
    PutPayload, RetryConfig, WriteMultipart,
};
use tokio::io::AsyncWriteExt;

use super::manifest::{
    self, DATA_SUFFIX, Listed, MANIFEST_SUFFIX, Manifest, ManifestError, PKI_SUFFIX, PkiObject,
};
use super::snapshot::FileDigest;
use super::transport::{Timeouts, Transport, TransportError};

/// Parts of a multipart upload; S3 wants at least 5 MiB for all but the
/// last.
const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts uploading at once: memory held is about this many parts.
const PARTS_IN_FLIGHT: usize = 2;

/// The most of a manifest the operator reads. One it writes has a few
/// hundred bytes; the bucket is the tenant's, and may hold anything under
/// the name.
pub const MAX_MANIFEST_BYTES: u64 = 64 * 1024;
/// The most of a sealed PKI bundle the operator reads (one it writes has a
/// few tens of KiB).
pub const MAX_PKI_BYTES: u64 = 1024 * 1024;
/// The most objects one listing of a prefix reads: a prefix a tenant filled
/// with millions of objects costs one bounded pass, not the operator's
/// memory.
pub const MAX_LISTED_OBJECTS: usize = 10_000;
/// The most manifests one listing reads (one GET each): a retention keeps
/// at most 1,000 snapshots (the CRD's bound), plus the newest and those
/// cut short. A prefix a tenant filled with more costs no more than this.
pub const MAX_LISTED_SNAPSHOTS: usize = 1_100;

/// Why a snapshot could not be stored, listed or fetched.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The target's settings are not usable.
    #[error("backup target: {message}")]
    Config { message: String },
    /// The TLS settings are not usable.
    #[error("backup target: {0}")]
    Transport(#[source] TransportError),
    /// The storage refused the credentials or their permissions.
    #[error("storage refused {what}: check the access key, secret and bucket policy: {source}")]
    Denied {
        what: String,
        #[source]
        source: object_store::Error,
    },
    /// The storage's certificate is not one the target trusts (or TLS
    /// failed otherwise).
    #[error("storage not trusted for {what}: check the endpoint and its CA: {source}")]
    Untrusted {
        what: String,
        #[source]
        source: object_store::Error,
    },
    /// The storage could not be reached or did not answer in time.
    #[error("storage unreachable for {what}: {source}")]
    Unreachable {
        what: String,
        #[source]
        source: object_store::Error,
    },
    /// Any other failure of a storage request.
    #[error("storage failed {what}: {source}")]
    Storage {
        what: String,
        #[source]
        source: object_store::Error,
    },
    /// A snapshot of that name exists; it is never replaced.
    #[error("snapshot object {key} already exists")]
    Exists { key: String },
    /// The snapshot's data object is gone.
    #[error("snapshot object {key} does not exist")]
    Missing { key: String },
    /// The data being uploaded failed.
    #[error("reading the snapshot to upload: {0}")]
    Source(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The data being uploaded was empty.
    #[error("the snapshot to upload is empty")]
    Empty,
    /// A manifest could not be read.
    #[error("manifest {key}: {source}")]
    Manifest {
        key: String,
        #[source]
        source: ManifestError,
    },
    /// The object's size is not the manifest's.
    #[error("snapshot object {key} has {actual} bytes, its manifest says {expected}")]
    Size {
        key: String,
        expected: u64,
        actual: u64,
    },
    /// The object's checksum is not the manifest's.
    #[error("snapshot object {key} has sha256 {actual}, its manifest says {expected}")]
    Checksum {
        key: String,
        expected: String,
        actual: String,
    },
    /// The object does not end with the sha256 of the database before it.
    #[error("snapshot object {key} does not end with the sha256 of its database")]
    NotASnapshot { key: String },
    /// An object larger than the operator reads of its kind.
    #[error("{key} has more than the {limit} bytes a {what} may have; not read")]
    TooLarge {
        key: String,
        what: &'static str,
        limit: u64,
    },
    /// A storage operation did not end within its overall deadline (a
    /// storage that answers, but slowly enough to hold the operator).
    #[error("storage did not finish {what} within {after:?}")]
    Deadline { what: String, after: Duration },
    /// More objects under the prefix than one listing reads.
    #[error("more than {limit} objects under {prefix}; not listed")]
    TooMany { prefix: String, limit: usize },
    /// More snapshots under the prefix than one listing reads manifests of.
    #[error(
        "{found} snapshots under {prefix}, more than the {limit} whose manifests one listing reads (a retention keeps at most 1000); not listed: remove the extra ones"
    )]
    TooManySnapshots {
        prefix: String,
        found: usize,
        limit: usize,
    },
    /// A local file could not be written.
    #[error("{what} {path}: {source}", path = path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl StoreError {
    /// Short static category, used as a metric label and event reason.
    pub fn category(&self) -> &'static str {
        match self {
            StoreError::Config { .. } | StoreError::Transport(_) => "backup-config",
            StoreError::Denied { .. } => "backup-denied",
            StoreError::Untrusted { .. } => "backup-untrusted",
            StoreError::Unreachable { .. } | StoreError::Deadline { .. } => "backup-unreachable",
            StoreError::Storage { .. } => "backup-storage",
            StoreError::Exists { .. } => "backup-exists",
            StoreError::Missing { .. } => "backup-missing",
            StoreError::Source(_) | StoreError::Empty => "backup-source",
            StoreError::Manifest { .. } => "backup-manifest",
            StoreError::Size { .. }
            | StoreError::Checksum { .. }
            | StoreError::NotASnapshot { .. } => "backup-corrupt",
            StoreError::TooLarge { .. }
            | StoreError::TooMany { .. }
            | StoreError::TooManySnapshots { .. } => "backup-too-large",
            StoreError::File { .. } => "backup-file",
        }
    }

    /// Sorts a failed storage request by what the caller can do about it.
    fn from_storage(what: impl Into<String>, source: object_store::Error) -> StoreError {
        let what = what.into();
        match &source {
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => StoreError::Denied { what, source },
            _ if is_tls_failure(&source) => StoreError::Untrusted { what, source },
            _ if is_unreachable(&source) => StoreError::Unreachable { what, source },
            _ => StoreError::Storage { what, source },
        }
    }
}

/// Whether TLS failed: rustls's error somewhere in the chain. An
/// `io::Error` passes over the error it wraps in its `source`, so those are
/// opened too.
fn is_tls_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            && is_tls_failure(inner)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// Whether the request never got an answer: no connection, or no answer in
/// time.
fn is_unreachable(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(http) = e.downcast_ref::<HttpError>()
            && matches!(http.kind(), HttpErrorKind::Connect | HttpErrorKind::Timeout)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// Where snapshots go and how to get there.
#[derive(Clone)]
pub struct StoreConfig {
    /// The S3 endpoint, `https://host[:port]` (path-style requests).
    pub endpoint: String,
    /// The region the signatures name; S3-compatible servers mostly ignore it.
    pub region: String,
    /// The bucket.
    pub bucket: String,
    /// The prefix, within the bucket, the snapshots go under (may be empty).
    pub prefix: String,
    /// The access key ID.
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: String,
    /// PEM CA certificate(s) to trust for the endpoint instead of the
    /// system's roots.
    pub ca_pem: Option<String>,
    /// Whether a plain `http://` endpoint is allowed.
    pub allow_http: bool,
    /// Bounds on each request.
    pub timeouts: Timeouts,
    /// Retries of a failed request (with backoff), within `retry_timeout`.
    pub max_retries: usize,
    /// How long a request may be retried for.
    pub retry_timeout: Duration,
    /// The overall deadline of one operation on small objects (a listing
    /// with every page, a manifest, a sealed identity, a deletion),
    /// retries included, however the storage paces its answers.
    pub deadline: Duration,
    /// The slowest transfer of a snapshot's data the operator waits for,
    /// in bytes per second: reading `size` bytes may take `deadline` plus
    /// `size / min_rate` seconds.
    pub min_rate: u64,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("StoreConfig")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("access_key_id", &self.access_key_id)
            .field("ca_pem", &self.ca_pem.is_some())
            .field("allow_http", &self.allow_http)
            .finish_non_exhaustive()
    }
}

impl StoreConfig {
    /// A target with the default timeouts and retries.
    pub fn new(
        endpoint: impl Into<String>,
        bucket: impl Into<String>,
        prefix: impl Into<String>,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> Self {
        StoreConfig {
            endpoint: endpoint.into(),
            region: "us-east-1".into(),
            bucket: bucket.into(),
            prefix: prefix.into(),
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
            ca_pem: None,
            allow_http: false,
            timeouts: Timeouts {
                connect: Duration::from_secs(10),
                request: Duration::from_secs(120),
                idle: Duration::from_secs(60),
            },
            max_retries: 3,
            retry_timeout: Duration::from_secs(120),
            deadline: Duration::from_secs(180),
            min_rate: 1024 * 1024,
        }
    }
}

/// What an upload records besides what it measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// See [`manifest::snapshot_name`].
    pub name: String,
    /// The revision the snapshot holds at least.
    pub etcd_revision: u64,
    /// The etcd server version of the member.
    pub etcd_version: String,
    /// The business cluster's Kubernetes version, when known.
    pub kubernetes_version: Option<String>,
    /// When it was taken, RFC 3339.
    pub taken_at: String,
    /// The client URL of the member.
    pub member: String,
    /// The request it is taken for (see [`Manifest::request`]).
    pub request: Option<String>,
}

/// The snapshots of one target: a bucket and a prefix.
#[derive(Debug)]
pub struct SnapshotStore {
    store: AmazonS3,
    prefix: Option<Path>,
    bucket: String,
    deadline: Duration,
    min_rate: u64,
}

impl SnapshotStore {
    /// A store for `config`. Nothing is sent until it is used.
    pub fn new(config: &StoreConfig) -> Result<SnapshotStore, StoreError> {
        let bad = |message: String| StoreError::Config { message };
        let endpoint: hyper::Uri = config
            .endpoint
            .parse()
            .map_err(|e| bad(format!("endpoint {:?}: {e}", config.endpoint)))?;
        match endpoint.scheme_str() {
            Some("https") => {}
            Some("http") if config.allow_http => {}
            _ => {
                return Err(bad(format!(
                    "endpoint {:?} is not https://host[:port]",
                    config.endpoint
                )));
            }
        }
        if endpoint.host().is_none() {
            return Err(bad(format!("endpoint {:?} has no host", config.endpoint)));
        }
        if config.bucket.is_empty() {
            return Err(bad("no bucket".into()));
        }
        let prefix = config.prefix.trim_matches('/');
        let prefix = if prefix.is_empty() {
            None
        } else {
            Some(Path::parse(prefix).map_err(|e| bad(format!("prefix {prefix:?}: {e}")))?)
        };
        let transport =
            Transport::new(config.ca_pem.as_deref(), config.allow_http, config.timeouts)
                .map_err(StoreError::Transport)?;
        let retry = RetryConfig {
            max_retries: config.max_retries,
            retry_timeout: config.retry_timeout,
            ..RetryConfig::default()
        };
        let store = AmazonS3Builder::new()
            .with_endpoint(config.endpoint.trim_end_matches('/'))
            .with_region(&config.region)
            .with_bucket_name(&config.bucket)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key)
            .with_allow_http(config.allow_http)
            .with_virtual_hosted_style_request(false)
            .with_disable_tagging(true)
            .with_retry(retry)
            .with_http_connector(transport)
            .build()
            .map_err(|e| bad(e.to_string()))?;
        Ok(SnapshotStore {
            store,
            prefix,
            bucket: config.bucket.clone(),
            deadline: config.deadline,
            min_rate: config.min_rate.max(1),
        })
    }

    /// `operation`'s result if it ends within `after`; else it is dropped
    /// (its requests with it) and the answer is [`StoreError::Deadline`].
    async fn within<T>(
        &self,
        after: Duration,
        what: impl FnOnce() -> String,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(after, operation)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Deadline {
                    what: what(),
                    after,
                })
            })
    }

    /// One request's answer if it comes within the deadline.
    async fn bounded<T>(
        &self,
        what: impl FnOnce() -> String,
        request: impl Future<Output = object_store::Result<T>>,
    ) -> Result<object_store::Result<T>, StoreError> {
        tokio::time::timeout(self.deadline, request)
            .await
            .map_err(|_| StoreError::Deadline {
                what: what(),
                after: self.deadline,
            })
    }

    /// How long reading `size` bytes of a snapshot's data may take.
    fn data_deadline(&self, size: u64) -> Duration {
        self.deadline
            .saturating_add(Duration::from_secs(size / self.min_rate))
    }

    /// The key of `name` under the prefix.
    fn key(&self, name: &str) -> Path {
        match &self.prefix {
            Some(prefix) => prefix.clone().join(name),
            None => Path::from(name),
        }
    }

    /// `bucket/prefix/`, for messages.
    fn shown_prefix(&self) -> String {
        match &self.prefix {
            Some(p) => format!("{}/{p}/", self.bucket),
            None => format!("{}/", self.bucket),
        }
    }

    /// `bucket/key`, for messages.
    fn shown(&self, key: &Path) -> String {
        format!("{}/{key}", self.bucket)
    }

    /// Uploads the snapshot file `data` yields as `info.name`, then the
    /// Cluster's identity `pki` (when given) sealed with its key for this
    /// snapshot and naming the data just stored ([`super::pki::Data`]),
    /// then its manifest, and returns the manifest. Refuses a name that
    /// exists; on any failure the upload is abandoned and no manifest is
    /// written.
    pub async fn upload<S, E>(
        &self,
        info: &SnapshotInfo,
        data: S,
        pki: Option<(&super::pki::Bundle, &super::pki::Key)>,
    ) -> Result<Manifest, StoreError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::error::Error + Send + Sync + 'static,
    {
        if !manifest::is_snapshot_name(&info.name) {
            return Err(StoreError::Config {
                message: format!("{:?} is not a snapshot name", info.name),
            });
        }
        let object = format!("{}{DATA_SUFFIX}", info.name);
        let data_key = self.key(&object);
        let manifest_key = self.key(&format!("{}{MANIFEST_SUFFIX}", info.name));
        for key in [&data_key, &manifest_key] {
            let looked = self
                .bounded(
                    || format!("looking for {}", self.shown(key)),
                    self.store.head(key),
                )
                .await?;
            match looked {
                Ok(_) => {
                    return Err(StoreError::Exists {
                        key: self.shown(key),
                    });
                }
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    return Err(StoreError::from_storage(
                        format!("looking for {}", self.shown(key)),
                        e,
                    ));
                }
            }
        }
        let mut attributes = Attributes::new();
        attributes.insert(Attribute::ContentType, "application/octet-stream".into());
        let options = PutMultipartOptions {
            attributes,
            ..Default::default()
        };
        let upload = self
            .store
            .put_multipart_opts(&data_key, options)
            .await
            .map_err(|e| {
                StoreError::from_storage(
                    format!("starting the upload of {}", self.shown(&data_key)),
                    e,
                )
            })?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
        let mut digest = FileDigest::default();
        if let Err(e) = self.send(&mut writer, &mut digest, data, &data_key).await {
            if let Err(abort) = writer.abort().await {
                tracing::warn!(key = %self.shown(&data_key), error = %abort, "abandoning the upload failed");
            }
            return Err(e);
        }
        writer.finish().await.map_err(|e| {
            StoreError::from_storage(
                format!("completing the upload of {}", self.shown(&data_key)),
                e,
            )
        })?;
        let sums = digest.finish();
        let stored = self
            .bounded(
                || format!("reading back {}", self.shown(&data_key)),
                self.store.head(&data_key),
            )
            .await?
            .map_err(|e| {
                StoreError::from_storage(format!("reading back {}", self.shown(&data_key)), e)
            })?;
        if stored.size != sums.size {
            return Err(StoreError::Size {
                key: self.shown(&data_key),
                expected: sums.size,
                actual: stored.size,
            });
        }
        let pki = match pki {
            None => None,
            Some((bundle, key)) => {
                let bound = bundle.for_data(super::pki::Data {
                    sha256: sums.sha256.clone(),
                    size: sums.size,
                    revision: info.etcd_revision,
                });
                let sealed = super::pki::seal(&bound, key, &info.name);
                Some(self.put_pki(&info.name, &sealed, &key.id()).await?)
            }
        };
        let manifest = Manifest {
            format: manifest::FORMAT,
            name: info.name.clone(),
            object,
            size: sums.size,
            sha256: sums.sha256,
            etcd_revision: info.etcd_revision,
            etcd_version: info.etcd_version.clone(),
            kubernetes_version: info.kubernetes_version.clone(),
            taken_at: info.taken_at.clone(),
            member: info.member.clone(),
            pki,
            request: info.request.clone(),
        };
        let json = serde_json::to_vec_pretty(&manifest).map_err(|e| StoreError::Manifest {
            key: self.shown(&manifest_key),
            source: ManifestError::Json(e),
        })?;
        let mut attributes = Attributes::new();
        attributes.insert(Attribute::ContentType, "application/json".into());
        let options = PutOptions {
            mode: PutMode::Create,
            attributes,
            ..Default::default()
        };
        self.bounded(
            || format!("writing {}", self.shown(&manifest_key)),
            self.store
                .put_opts(&manifest_key, PutPayload::from(json), options),
        )
        .await?
        .map_err(|e| match e {
            object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. } => StoreError::Exists {
                key: self.shown(&manifest_key),
            },
            e => StoreError::from_storage(format!("writing {}", self.shown(&manifest_key)), e),
        })?;
        Ok(manifest)
    }

    /// Writes the sealed PKI bundle of snapshot `name` (never over one
    /// that exists).
    async fn put_pki(
        &self,
        name: &str,
        sealed: &[u8],
        key_id: &str,
    ) -> Result<PkiObject, StoreError> {
        let object = format!("{name}{PKI_SUFFIX}");
        let key = self.key(&object);
        let options = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        self.bounded(
            || format!("writing {}", self.shown(&key)),
            self.store
                .put_opts(&key, PutPayload::from(sealed.to_vec()), options),
        )
        .await?
        .map_err(|e| match e {
            object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. } => StoreError::Exists {
                key: self.shown(&key),
            },
            e => StoreError::from_storage(format!("writing {}", self.shown(&key)), e),
        })?;
        let mut digest = FileDigest::default();
        digest.update(sealed);
        Ok(PkiObject {
            object,
            sha256: digest.finish().sha256,
            key_id: key_id.to_string(),
        })
    }

    /// The sealed PKI bundle of the snapshot `manifest` describes, checked
    /// against the manifest's sha256.
    pub async fn pki(&self, manifest: &Manifest) -> Result<Vec<u8>, StoreError> {
        let Some(pki) = &manifest.pki else {
            return Err(StoreError::Missing {
                key: format!("the PKI bundle of {}", manifest.name),
            });
        };
        let key = self.key(&pki.object);
        let bytes = self.read_bounded(&key, "PKI bundle", MAX_PKI_BYTES).await?;
        let mut digest = FileDigest::default();
        digest.update(&bytes);
        let actual = digest.finish().sha256;
        if actual != pki.sha256 {
            return Err(StoreError::Checksum {
                key: self.shown(&key),
                expected: pki.sha256.clone(),
                actual,
            });
        }
        Ok(bytes)
    }

    /// Feeds `data` into the upload, hashing it; the upload is not finished.
    async fn send<S, E>(
        &self,
        writer: &mut WriteMultipart,
        digest: &mut FileDigest,
        mut data: S,
        key: &Path,
    ) -> Result<(), StoreError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::error::Error + Send + Sync + 'static,
    {
        while let Some(piece) = data.next().await {
            let piece = piece.map_err(|e| StoreError::Source(Box::new(e)))?;
            writer
                .wait_for_capacity(PARTS_IN_FLIGHT)
                .await
                .map_err(|e| {
                    StoreError::from_storage(format!("uploading {}", self.shown(key)), e)
                })?;
            digest.update(&piece);
            writer.put(piece);
        }
        if digest.size() == 0 {
            return Err(StoreError::Empty);
        }
        Ok(())
    }

    /// The complete snapshots under the prefix, newest first. A manifest that
    /// cannot be read, or whose data object's size differs from it, is left
    /// out (and logged): it does not describe a snapshot that can be
    /// restored.
    pub async fn list(&self) -> Result<Vec<Manifest>, StoreError> {
        let objects = self.objects().await?;
        let prefix = self.shown_prefix();
        self.within(
            self.deadline,
            || format!("reading the manifests under {prefix}"),
            self.manifests(objects),
        )
        .await
    }

    /// The manifests of the complete snapshots among `objects`.
    async fn manifests(&self, objects: Vec<Listed>) -> Result<Vec<Manifest>, StoreError> {
        let complete = manifest::complete(&objects);
        if complete.len() > MAX_LISTED_SNAPSHOTS {
            return Err(StoreError::TooManySnapshots {
                prefix: self.shown_prefix(),
                found: complete.len(),
                limit: MAX_LISTED_SNAPSHOTS,
            });
        }
        let mut manifests = Vec::new();
        for (name, size) in complete {
            match self.manifest(&name).await {
                Ok(m) if m.size == size => manifests.push(m),
                Ok(m) => tracing::warn!(
                    snapshot = %name, manifest_size = m.size, object_size = size,
                    "snapshot object and manifest differ in size; not listed"
                ),
                Err(e @ StoreError::Manifest { .. }) | Err(e @ StoreError::Missing { .. }) => {
                    tracing::warn!(snapshot = %name, error = %e, "snapshot not listed")
                }
                Err(e) => return Err(e),
            }
        }
        Ok(manifests)
    }

    /// Deletes the snapshot `manifest` describes: the manifest first, so a
    /// deletion cut short leaves an unlisted data object, never a listed
    /// snapshot without its data. Objects already gone are not an error.
    pub async fn delete(&self, manifest: &Manifest) -> Result<(), StoreError> {
        self.within(
            self.deadline,
            || format!("deleting snapshot {}", manifest.name),
            self.delete_objects(manifest),
        )
        .await
    }

    async fn delete_objects(&self, manifest: &Manifest) -> Result<(), StoreError> {
        let pki = manifest.pki.iter().map(|p| p.object.clone());
        for object in [manifest.manifest_object(), manifest.object.clone()]
            .into_iter()
            .chain(pki)
        {
            let key = self.key(&object);
            match self.store.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    return Err(StoreError::from_storage(
                        format!("deleting {}", self.shown(&key)),
                        e,
                    ));
                }
            }
        }
        Ok(())
    }

    /// The objects directly under the prefix, at most
    /// [`MAX_LISTED_OBJECTS`] of them: the listing is read page by page and
    /// stops there.
    async fn objects(&self) -> Result<Vec<Listed>, StoreError> {
        let where_ = self.shown_prefix();
        self.within(
            self.deadline,
            || format!("listing {where_}"),
            self.list_objects(),
        )
        .await
    }

    async fn list_objects(&self) -> Result<Vec<Listed>, StoreError> {
        let where_ = self.shown_prefix();
        let depth = self.prefix.as_ref().map_or(0, |p| p.parts().count());
        let mut listing = self.store.list(self.prefix.as_ref());
        let mut objects = Vec::new();
        let mut seen = 0usize;
        while let Some(item) = listing.next().await {
            let object = match item {
                Ok(object) => object,
                Err(e) => {
                    return Err(self
                        .classify_list_error(format!("listing {where_}"), e)
                        .await);
                }
            };
            seen += 1;
            if seen > MAX_LISTED_OBJECTS {
                return Err(StoreError::TooMany {
                    prefix: where_,
                    limit: MAX_LISTED_OBJECTS,
                });
            }
            // Directly under the prefix only, as a listing with a delimiter.
            if object.location.parts().count() != depth + 1 {
                continue;
            }
            if let Some(name) = object.location.filename() {
                objects.push(Listed {
                    name: name.to_string(),
                    size: object.size,
                });
            }
        }
        Ok(objects)
    }

    /// Deletes the objects of snapshots cut short before `newest` (see
    /// [`manifest::abandoned`]); returns their names.
    pub async fn remove_abandoned(&self, newest: &str) -> Result<Vec<String>, StoreError> {
        let abandoned = manifest::abandoned(&self.objects().await?, newest);
        self.within(
            self.deadline,
            || "deleting snapshots cut short".to_string(),
            self.delete_all(&abandoned),
        )
        .await?;
        Ok(abandoned)
    }

    async fn delete_all(&self, abandoned: &[String]) -> Result<(), StoreError> {
        for object in abandoned {
            let key = self.key(object);
            match self.store.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    return Err(StoreError::from_storage(
                        format!("deleting {}", self.shown(&key)),
                        e,
                    ));
                }
            }
        }
        Ok(())
    }

    /// object_store reports a refused listing as a generic error with the
    /// status in text only; one HEAD, whose refusal it does classify, tells
    /// refused credentials from other failures.
    async fn classify_list_error(&self, what: String, e: object_store::Error) -> StoreError {
        let error = StoreError::from_storage(what.clone(), e);
        if !matches!(error, StoreError::Storage { .. }) {
            return error;
        }
        let key = self.key(".access-check");
        match self.bounded(String::new, self.store.head(&key)).await {
            Ok(Err(
                source @ (object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }),
            )) => StoreError::Denied { what, source },
            _ => error,
        }
    }

    /// The object at `key`, read as it streams and refused once it passes
    /// `limit` bytes (the size the storage announces is not trusted): a
    /// tenant's object costs the operator at most `limit` of memory.
    async fn read_bounded(
        &self,
        key: &Path,
        what: &'static str,
        limit: u64,
    ) -> Result<Vec<u8>, StoreError> {
        self.within(
            self.deadline,
            || format!("reading {}", self.shown(key)),
            self.read_capped(key, what, limit),
        )
        .await
    }

    async fn read_capped(
        &self,
        key: &Path,
        what: &'static str,
        limit: u64,
    ) -> Result<Vec<u8>, StoreError> {
        let failed = |e: object_store::Error| match e {
            object_store::Error::NotFound { .. } => StoreError::Missing {
                key: self.shown(key),
            },
            e => StoreError::from_storage(format!("reading {}", self.shown(key)), e),
        };
        let too_large = || StoreError::TooLarge {
            key: self.shown(key),
            what,
            limit,
        };
        let got = self.store.get(key).await.map_err(failed)?;
        if got.meta.size > limit {
            return Err(too_large());
        }
        let mut stream = got.into_stream();
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(failed)?;
            if (bytes.len() + chunk.len()) as u64 > limit {
                return Err(too_large());
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }

    /// The manifest of snapshot `name`.
    pub async fn manifest(&self, name: &str) -> Result<Manifest, StoreError> {
        let key = self.key(&format!("{name}{MANIFEST_SUFFIX}"));
        let bytes = self
            .read_bounded(&key, "manifest", MAX_MANIFEST_BYTES)
            .await?;
        Manifest::parse(&bytes, name).map_err(|source| StoreError::Manifest {
            key: self.shown(&key),
            source,
        })
    }

    /// Downloads the snapshot `manifest` describes to `dest`. The file
    /// appears at `dest` only once its size and sha256 are the manifest's and
    /// it ends with its database's sha256; otherwise nothing is left there.
    pub async fn download(&self, manifest: &Manifest, dest: &FsPath) -> Result<(), StoreError> {
        let key = self.key(&manifest.object);
        let file_name = dest
            .file_name()
            .ok_or_else(|| StoreError::Config {
                message: format!("{} is not a file path", dest.display()),
            })?
            .to_string_lossy();
        let partial = dest.with_file_name(format!(".{file_name}.partial"));
        let result = self.fetch(manifest, &key, Some(&partial)).await;
        if let Err(e) = result {
            let _ = tokio::fs::remove_file(&partial).await;
            return Err(e);
        }
        tokio::fs::rename(&partial, dest)
            .await
            .map_err(|source| StoreError::File {
                what: "moving the snapshot to",
                path: dest.to_owned(),
                source,
            })
    }

    /// Reads the snapshot `manifest` describes through, writing it nowhere,
    /// and checks it as [`SnapshotStore::download`] does: whether it can be
    /// restored, before anything is given up for it.
    pub async fn verify(&self, manifest: &Manifest) -> Result<(), StoreError> {
        let key = self.key(&manifest.object);
        self.fetch(manifest, &key, None).await
    }

    /// Reads the object `key` of `manifest`, into `partial` when given, and
    /// checks its size, sha256 and the database's own trailing sha256.
    async fn fetch(
        &self,
        manifest: &Manifest,
        key: &Path,
        partial: Option<&FsPath>,
    ) -> Result<(), StoreError> {
        self.within(
            self.data_deadline(manifest.size),
            || format!("reading {}", self.shown(key)),
            self.fetch_data(manifest, key, partial),
        )
        .await
    }

    async fn fetch_data(
        &self,
        manifest: &Manifest,
        key: &Path,
        partial: Option<&FsPath>,
    ) -> Result<(), StoreError> {
        let got = self.store.get(key).await.map_err(|e| match e {
            object_store::Error::NotFound { .. } => StoreError::Missing {
                key: self.shown(key),
            },
            e => StoreError::from_storage(format!("reading {}", self.shown(key)), e),
        })?;
        let file_error = |source| StoreError::File {
            what: "writing",
            path: partial.map(FsPath::to_owned).unwrap_or_default(),
            source,
        };
        let mut file = match partial {
            Some(path) => Some(tokio::fs::File::create(path).await.map_err(file_error)?),
            None => None,
        };
        let mut digest = FileDigest::default();
        let mut stream = got.into_stream();
        while let Some(piece) = stream.next().await {
            let piece = piece
                .map_err(|e| StoreError::from_storage(format!("reading {}", self.shown(key)), e))?;
            digest.update(&piece);
            if digest.size() > manifest.size {
                break;
            }
            if let Some(file) = file.as_mut() {
                file.write_all(&piece).await.map_err(file_error)?;
            }
        }
        if let Some(file) = file.as_mut() {
            file.sync_all().await.map_err(file_error)?;
        }
        let sums = digest.finish();
        if sums.size != manifest.size {
            return Err(StoreError::Size {
                key: self.shown(key),
                expected: manifest.size,
                actual: sums.size,
            });
        }
        if sums.sha256 != manifest.sha256 {
            return Err(StoreError::Checksum {
                key: self.shown(key),
                expected: manifest.sha256.clone(),
                actual: sums.sha256,
            });
        }
        if !sums.ends_with_db_sha256 {
            return Err(StoreError::NotASnapshot {
                key: self.shown(key),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(endpoint: &str) -> StoreConfig {
        StoreConfig::new(endpoint, "backups", "/clusters/ns/c/", "key", "secret")
    }

    #[test]
    fn endpoints_must_be_https_unless_http_is_allowed() {
        assert!(SnapshotStore::new(&config("https://s3.example:9000")).is_ok());
        let e = SnapshotStore::new(&config("http://s3.example:9000")).unwrap_err();
        assert_eq!(e.category(), "backup-config", "{e}");
        let mut plain = config("http://127.0.0.1:9000");
        plain.allow_http = true;
        assert!(SnapshotStore::new(&plain).is_ok());
        for bad in ["s3.example", "https://", "ftp://s3.example"] {
            let e = SnapshotStore::new(&config(bad)).unwrap_err();
            assert!(matches!(e, StoreError::Config { .. }), "{bad}: {e}");
        }
        let mut no_bucket = config("https://s3.example");
        no_bucket.bucket.clear();
        assert!(SnapshotStore::new(&no_bucket).is_err());
    }

    #[test]
    fn keys_are_under_the_prefix_without_stray_slashes() {
        let store = SnapshotStore::new(&config("https://s3.example")).unwrap();
        assert_eq!(
            store.key("20261127T120500Z-r1.db").as_ref(),
            "clusters/ns/c/20261127T120500Z-r1.db"
        );
        let mut root = config("https://s3.example");
        root.prefix = String::new();
        let store = SnapshotStore::new(&root).unwrap();
        assert_eq!(store.key("x.db").as_ref(), "x.db");
    }

    /// A storage that answers every request at once, then sends its body
    /// one byte every 100 ms: never idle long enough for the transport's
    /// idle bound, never done.
    async fn trickling_storage() -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = [0u8; 8192];
                    let _ = socket.read(&mut request).await;
                    let head = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nETag: \"e\"\r\n\
                        Last-Modified: Wed, 21 Oct 2015 07:28:00 GMT\r\n\r\n";
                    if socket.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    loop {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if socket.write_all(b" ").await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn a_storage_that_answers_too_slowly_is_given_up_at_the_deadline() {
        let mut slow = config(&trickling_storage().await);
        slow.allow_http = true;
        slow.max_retries = 0;
        slow.deadline = Duration::from_secs(1);
        let store = SnapshotStore::new(&slow).unwrap();
        let started = std::time::Instant::now();
        let e = store.manifest("20261127T120500Z-r1").await.unwrap_err();
        assert!(matches!(e, StoreError::Deadline { .. }), "a manifest: {e}");
        assert_eq!(e.category(), "backup-unreachable");
        assert!(started.elapsed() < Duration::from_secs(3));
        let started = std::time::Instant::now();
        let e = store.list().await.unwrap_err();
        assert!(matches!(e, StoreError::Deadline { .. }), "a listing: {e}");
        assert!(started.elapsed() < Duration::from_secs(3));
        // Data may take as long as its size at the slowest rate allowed.
        assert_eq!(
            store.data_deadline(10 * 1024 * 1024),
            Duration::from_secs(1 + 10)
        );
    }

    #[test]
    fn the_secret_is_not_in_debug_output() {
        let shown = format!("{:?}", config("https://s3.example"));
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("key"), "{shown}");
    }
}

//! etcd snapshots into real S3-compatible storage: a real etcd member over
//! mutual TLS and a real versitygw over TLS (`kok_testenv::s3`). A snapshot
//! is streamed from etcd into the bucket, listed, downloaded, checked, and
//! read by upstream's `etcdutl`; in a three-member cluster a follower gives
//! it, and without quorum none is taken; failures (credentials refused, nothing
//! listening, an untrusted certificate, a stream that breaks off, a name that
//! exists, a damaged object) each give their own error and leave every
//! stored snapshot in place.

mod etcd_members;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use etcd_members::{Etcd, Pki, port_pairs, start_new_cluster, wait_healthy};
use kok_testenv::s3::{S3Options, S3Server};
use kok_testenv::wait::wait_for;
use kube_on_kube_operator::backup::{
    self, BackupError, Manifest, SnapshotInfo, SnapshotStore, StoreConfig, StoreError, manifest,
};
use kube_on_kube_operator::etcd::api::EtcdClient;
use time::OffsetDateTime;

const START: Duration = Duration::from_secs(60);
const REQUEST: Duration = Duration::from_secs(5);
const PREFIX: &str = "clusters/tenant-a/c1";

/// One etcd member on loopback with its client, and its files.
struct Member {
    etcd: Etcd,
    client: EtcdClient,
    pki: Pki,
    /// Holds the member's data and certificates until the test ends.
    _dir: tempfile::TempDir,
}

async fn start_member() -> Member {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut etcd = start_new_cluster(dir.path(), &pki, &port_pairs(1)).remove(0);
    let client = EtcdClient::new(vec![etcd.client_url.clone()], pki.client_tls(), REQUEST).unwrap();
    wait_healthy(&client, &mut etcd).await;
    Member {
        etcd,
        client,
        pki,
        _dir: dir,
    }
}

/// A member, a storage server and a store on it under [`PREFIX`]: what
/// most tests here start from.
async fn member_and_store() -> (Member, S3Server, SnapshotStore) {
    let member = start_member().await;
    let s3 = S3Server::start(&S3Options::default()).unwrap();
    let store = SnapshotStore::new(&store_config(&s3)).unwrap();
    (member, s3, store)
}

impl Member {
    async fn put(&self, key: &str, value: &[u8]) {
        etcdctl_put(&self.etcd.client_url, &self.pki, key, value).await;
    }
}

/// `etcdctl put key` against `url`, with `value` on standard input (values
/// of a megabyte do not fit on a command line).
async fn etcdctl_put(url: &str, pki: &Pki, key: &str, value: &[u8]) {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(kok_testenv::bins::bin("etcdctl").unwrap())
        .arg(format!("--endpoints={url}"))
        .arg(format!("--cacert={}", pki.ca_file.display()))
        .arg(format!("--cert={}", pki.cert_file.display()))
        .arg(format!("--key={}", pki.key_file.display()))
        .arg("put")
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(value).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "etcdctl put {key}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn store_config(s3: &S3Server) -> StoreConfig {
    let mut config = StoreConfig::new(
        s3.endpoint(),
        s3.bucket(),
        PREFIX,
        s3.access_key_id(),
        s3.secret_access_key(),
    );
    config.region = s3.region().into();
    config.ca_pem = s3.ca_pem().map(str::to_owned);
    config
}

/// Bytes that do not compress or repeat, from a simple generator.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn sha256_hex(path: &Path) -> String {
    use sha2::Digest;
    backup::snapshot::hex(&sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

/// `etcdutl snapshot status FILE -w json`: (revision, total keys).
fn etcdutl_status(file: &Path) -> Result<(u64, u64), String> {
    let out = std::process::Command::new(kok_testenv::s3::etcdutl().unwrap())
        .args(["snapshot", "status", "-w", "json"])
        .arg(file)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    Ok((
        status["revision"].as_u64().unwrap(),
        status["totalKey"].as_u64().unwrap(),
    ))
}

/// The object names under the prefix as the server stores them, sorted.
fn stored_objects(s3: &S3Server) -> Vec<String> {
    let dir = s3.object_path(s3.bucket(), PREFIX);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test]
async fn a_snapshot_streams_from_etcd_into_the_bucket_and_back() {
    let (member, s3, store) = member_and_store().await;
    assert!(store.list().await.unwrap().is_empty());

    // About 20 MB of values: a database sent in hundreds of gateway
    // messages and uploaded in several parts.
    const VALUES: usize = 14;
    for i in 0..VALUES {
        member
            .put(
                &format!("/registry/blob-{i:02}"),
                &noise(1_400_000, i as u64 + 1),
            )
            .await;
    }
    member.put("/registry/small", b"hello").await;

    let now = OffsetDateTime::now_utc();
    let started = Instant::now();
    let first = backup::take(&member.client, &store, Some("v1.35.4"), None, None, now)
        .await
        .unwrap();
    let took = started.elapsed();
    eprintln!(
        "snapshot {} of {} bytes at revision {} stored in {took:?}",
        first.name, first.size, first.etcd_revision
    );
    assert!(first.size > 19_000_000, "{first:?}");
    // One revision per put, after the cluster's first.
    assert_eq!(first.etcd_revision, VALUES as u64 + 2, "{first:?}");
    assert_eq!(first.etcd_version, "3.6.16");
    assert_eq!(first.kubernetes_version.as_deref(), Some("v1.35.4"));
    assert_eq!(first.member, member.etcd.client_url);
    assert_eq!(
        first.name,
        manifest::snapshot_name(now, first.etcd_revision)
    );
    assert_eq!(first.object, format!("{}.db", first.name));
    assert_eq!(
        stored_objects(&s3),
        [first.object.clone(), first.manifest_object()]
    );

    // A later one, after another write.
    member.put("/registry/after", b"x").await;
    let later = now + time::Duration::minutes(10);
    let second = backup::take(&member.client, &store, None, None, None, later)
        .await
        .unwrap();
    assert_eq!(second.etcd_revision, first.etcd_revision + 1);
    let listed = store.list().await.unwrap();
    assert_eq!(listed, vec![second.clone(), first.clone()], "newest first");

    // Downloaded, it is the stored object, whole, and upstream reads it.
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("snapshot.db");
    store.download(&first, &file).await.unwrap();
    assert_eq!(std::fs::metadata(&file).unwrap().len(), first.size);
    assert_eq!(sha256_hex(&file), first.sha256);
    assert_eq!(
        sha256_hex(&s3.object_path(s3.bucket(), &format!("{PREFIX}/{}", first.object))),
        first.sha256
    );
    // What etcdctl saves of the same database reads the same. (Not byte for
    // byte: etcd's own bookkeeping moves on between two snapshots.)
    let saved = out.path().join("etcdctl.db");
    let save = std::process::Command::new(kok_testenv::bins::bin("etcdctl").unwrap())
        .arg(format!("--endpoints={}", member.etcd.client_url))
        .arg(format!("--cacert={}", member.pki.ca_file.display()))
        .arg(format!("--cert={}", member.pki.cert_file.display()))
        .arg(format!("--key={}", member.pki.key_file.display()))
        .args(["snapshot", "save"])
        .arg(&saved)
        .output()
        .unwrap();
    assert!(
        save.status.success(),
        "etcdctl snapshot save: {}",
        String::from_utf8_lossy(&save.stderr)
    );
    let (revision, keys) = etcdutl_status(&file).unwrap();
    assert_eq!(revision, first.etcd_revision);
    assert_eq!(keys, VALUES as u64 + 1);
    let downloaded_second = out.path().join("second.db");
    store.download(&second, &downloaded_second).await.unwrap();
    assert_eq!(
        etcdutl_status(&downloaded_second).unwrap(),
        etcdutl_status(&saved).unwrap()
    );
    // Restore checks the sha256 etcd appended; it must pass without
    // --skip-hash-check.
    let restored = out.path().join("restored");
    let restore = std::process::Command::new(kok_testenv::s3::etcdutl().unwrap())
        .args(["snapshot", "restore"])
        .arg(&file)
        .arg(format!("--data-dir={}", restored.display()))
        .output()
        .unwrap();
    assert!(
        restore.status.success(),
        "etcdutl snapshot restore: {}",
        String::from_utf8_lossy(&restore.stderr)
    );
    assert!(restored.join("member").is_dir());
}

#[tokio::test]
async fn refused_unreachable_and_untrusted_storage_fail_clearly_and_delete_nothing() {
    let (member, s3, store) = member_and_store().await;
    member.put("/registry/a", b"1").await;
    let now = OffsetDateTime::now_utc();
    let good = backup::take(&member.client, &store, None, None, None, now)
        .await
        .unwrap();
    let before = stored_objects(&s3);
    let later = now + time::Duration::minutes(1);

    // A wrong secret: refused, said so, not retried for minutes.
    let mut wrong = store_config(&s3);
    wrong.secret_access_key = "not-the-secret".into();
    let wrong = SnapshotStore::new(&wrong).unwrap();
    let asked = Instant::now();
    let e = backup::take(&member.client, &wrong, None, None, None, later)
        .await
        .unwrap_err();
    assert!(
        matches!(e, BackupError::Store(StoreError::Denied { .. })),
        "{e:?}"
    );
    eprintln!("wrong secret: {e}");
    assert_eq!(e.category(), "backup-denied");
    assert!(e.to_string().contains("access key"), "{e}");
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "{:?}",
        asked.elapsed()
    );
    let listed = wrong.list().await;
    assert!(
        matches!(listed, Err(StoreError::Denied { .. })),
        "{listed:?}"
    );

    // Nothing listening on the endpoint.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut nowhere = store_config(&s3);
    nowhere.endpoint = format!("https://127.0.0.1:{port}");
    nowhere.max_retries = 1;
    nowhere.retry_timeout = Duration::from_secs(5);
    let nowhere = SnapshotStore::new(&nowhere).unwrap();
    let asked = Instant::now();
    let e = backup::take(&member.client, &nowhere, None, None, None, later)
        .await
        .unwrap_err();
    assert!(
        matches!(e, BackupError::Store(StoreError::Unreachable { .. })),
        "{e:?}"
    );
    eprintln!("nothing listening: {e}");
    assert_eq!(e.category(), "backup-unreachable");
    assert!(e.to_string().contains(&port.to_string()), "{e}");
    assert!(
        asked.elapsed() < Duration::from_secs(30),
        "{:?}",
        asked.elapsed()
    );

    // The server's certificate signed by a CA the target does not name.
    let mut untrusted = store_config(&s3);
    let other_ca = kube_on_kube_operator::pki::new_ca("other", now).unwrap();
    untrusted.ca_pem = Some(other_ca.cert_pem);
    untrusted.max_retries = 0;
    let untrusted = SnapshotStore::new(&untrusted).unwrap();
    let e = untrusted.list().await.unwrap_err();
    assert!(matches!(e, StoreError::Untrusted { .. }), "{e:?}");
    eprintln!("untrusted: {e}");
    assert_eq!(e.category(), "backup-untrusted");

    // etcd unreachable: no member to take it from.
    let mut gone = start_member().await;
    let gone_url = gone.etcd.client_url.clone();
    gone.etcd.child.kill().await.unwrap();
    let e = backup::take(&gone.client, &store, None, None, None, later)
        .await
        .unwrap_err();
    assert!(matches!(e, BackupError::NoHealthyMember { .. }), "{e:?}");
    assert!(e.to_string().contains(&gone_url), "{e}");

    assert_eq!(stored_objects(&s3), before);
    assert_eq!(store.list().await.unwrap(), vec![good]);
}

#[tokio::test]
async fn a_broken_upload_is_never_listed_and_a_damaged_object_is_refused() {
    let (member, s3, store) = member_and_store().await;
    member.put("/registry/a", &noise(300_000, 7)).await;
    let now = OffsetDateTime::now_utc();
    let good = backup::take(&member.client, &store, None, None, None, now)
        .await
        .unwrap();
    let before = stored_objects(&s3);

    // The source breaks off after some bytes: the upload is abandoned, no
    // manifest is written, nothing is listed.
    let info = SnapshotInfo {
        name: manifest::snapshot_name(now + time::Duration::minutes(1), 99),
        etcd_revision: 99,
        etcd_version: "3.6.16".into(),
        kubernetes_version: None,
        taken_at: manifest::rfc3339(now),
        member: member.etcd.client_url.clone(),
        request: None,
    };
    let broken = futures::stream::iter(vec![
        Ok(Bytes::from(noise(100_000, 3))),
        Err(std::io::Error::other("connection to etcd lost")),
    ]);
    let e = store.upload(&info, broken, None).await.unwrap_err();
    assert!(matches!(e, StoreError::Source(_)), "{e:?}");
    assert!(e.to_string().contains("connection to etcd lost"), "{e}");
    assert_eq!(store.list().await.unwrap(), vec![good.clone()]);
    let names = stored_objects(&s3);
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with(&info.name) && n.ends_with(".json")),
        "{names:?}"
    );

    // A name that exists is refused, and what exists stays as it was.
    let again = SnapshotInfo {
        name: good.name.clone(),
        ..info.clone()
    };
    let one = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from_static(b"x"))]);
    let e = store.upload(&again, one, None).await.unwrap_err();
    assert!(matches!(e, StoreError::Exists { .. }), "{e:?}");
    assert_eq!(store.list().await.unwrap(), vec![good.clone()]);

    // One byte changed on the server's disk: the download fails on the
    // checksum and leaves no file behind.
    let object = s3.object_path(s3.bucket(), &format!("{PREFIX}/{}", good.object));
    let original = std::fs::read(&object).unwrap();
    let mut damaged = original.clone();
    damaged[original.len() / 2] ^= 0x40;
    std::fs::write(&object, &damaged).unwrap();
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("snapshot.db");
    let e = store.download(&good, &file).await.unwrap_err();
    match &e {
        StoreError::Checksum {
            expected, actual, ..
        } => {
            assert_eq!(expected, &good.sha256);
            assert_ne!(actual, &good.sha256);
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
    eprintln!("damaged: {e}");
    assert_eq!(e.category(), "backup-corrupt");
    assert!(!file.exists());
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);

    // Cut short: no longer listed as complete, and refused by size.
    std::fs::write(&object, &original[..original.len() - 1000]).unwrap();
    assert!(store.list().await.unwrap().is_empty());
    let e = store.download(&good, &file).await.unwrap_err();
    assert!(matches!(e, StoreError::Size { .. }), "{e:?}");
    assert!(!file.exists());

    // Put back, it is listed and downloads again: nothing was deleted.
    std::fs::write(&object, &original).unwrap();
    assert_eq!(store.list().await.unwrap(), vec![good.clone()]);
    store.download(&good, &file).await.unwrap();
    assert_eq!(sha256_hex(&file), good.sha256);
    assert_eq!(
        stored_objects(&s3)
            .into_iter()
            .filter(|n| before.contains(n))
            .collect::<Vec<_>>(),
        before
    );
}

/// Only complete, well-formed snapshots are listed: a manifest with the
/// wrong checksum format is left out.
#[tokio::test]
async fn a_manifest_that_does_not_parse_is_not_listed() {
    let (member, s3, store) = member_and_store().await;
    let now = OffsetDateTime::now_utc();
    let good: Manifest = backup::take(&member.client, &store, None, None, None, now)
        .await
        .unwrap();
    let path = s3.object_path(s3.bucket(), &format!("{PREFIX}/{}", good.manifest_object()));
    std::fs::write(&path, b"{\"format\": 1}").unwrap();
    assert!(store.list().await.unwrap().is_empty());
    let e = store.manifest(&good.name).await.unwrap_err();
    assert!(matches!(e, StoreError::Manifest { .. }), "{e:?}");
}

/// In a three-member cluster the snapshot comes from a follower, not the
/// leader; with quorum lost no member is healthy and none is taken.
#[tokio::test]
async fn a_follower_gives_the_snapshot_and_none_is_taken_without_quorum() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut members = start_new_cluster(dir.path(), &pki, &port_pairs(3));
    let urls: Vec<String> = members.iter().map(|m| m.client_url.clone()).collect();
    let client = EtcdClient::new(urls.clone(), pki.client_tls(), REQUEST).unwrap();
    for member in &mut members {
        wait_healthy(&client, member).await;
    }
    etcdctl_put(&urls[0], &pki, "/registry/a", b"1").await;

    let s3 = S3Server::start(&S3Options::default()).unwrap();
    let store = SnapshotStore::new(&store_config(&s3)).unwrap();
    let taken = backup::take(&client, &store, None, None, None, OffsetDateTime::now_utc())
        .await
        .unwrap();
    let status = client.status(&taken.member).await.unwrap();
    assert_ne!(status.member_id, status.leader, "taken from the leader");
    assert!(urls.contains(&taken.member), "{taken:?}");

    // Two of three gone: the last one has no quorum.
    let leader = status.leader;
    let mut kept = None;
    for (member, url) in members.iter_mut().zip(&urls) {
        let id = client.status(url).await.unwrap().member_id;
        if id == leader {
            kept = Some(url.clone());
        } else {
            member.child.kill().await.unwrap();
        }
    }
    let kept = kept.unwrap();
    wait_for("the last member to lose quorum", START, async || {
        matches!(client.healthy(&kept).await, Ok(false)).then_some(())
    })
    .await;
    let e = backup::take(&client, &store, None, None, None, OffsetDateTime::now_utc())
        .await
        .unwrap_err();
    assert!(matches!(e, BackupError::NoHealthyMember { .. }), "{e:?}");
    assert!(
        e.to_string().contains(&format!("{kept}: not healthy")),
        "{e}"
    );
    assert_eq!(store.list().await.unwrap(), vec![taken]);
}

/// Resident memory of this process, in bytes.
fn rss() -> u64 {
    kok_testenv::process_memory(std::process::id(), "VmRSS").expect("VmRSS")
}

/// The bucket is the tenant's: it may hold anything under a manifest's
/// name, and any number of objects under its prefix. A 64 MiB manifest is
/// refused without being read (the process grows by far less than it),
/// and says why; a prefix holding more objects than one listing reads is
/// refused after that many; another prefix of the same bucket (another
/// Cluster's) still lists its snapshot.
#[tokio::test]
async fn oversized_objects_and_listings_are_refused_without_being_read() {
    let (member, s3, store) = member_and_store().await;
    let now = OffsetDateTime::now_utc();
    let taken: Manifest = backup::take(&member.client, &store, None, None, None, now)
        .await
        .unwrap();
    let mut other_config = store_config(&s3);
    other_config.prefix = "clusters/tenant-b/c2".into();
    let other = SnapshotStore::new(&other_config).unwrap();
    backup::take(&member.client, &other, None, None, None, now)
        .await
        .unwrap();

    let path = s3.object_path(
        s3.bucket(),
        &format!("{PREFIX}/{}", taken.manifest_object()),
    );
    let huge = noise(64 * 1024 * 1024, 7);
    std::fs::write(&path, &huge).unwrap();
    drop(huge);
    let before = rss();
    let e = store.list().await.unwrap_err();
    assert!(matches!(e, StoreError::TooLarge { .. }), "{e:?}");
    assert!(e.to_string().contains("manifest"), "{e}");
    let e = store.manifest(&taken.name).await.unwrap_err();
    assert!(matches!(e, StoreError::TooLarge { .. }), "{e:?}");
    let grown = rss().saturating_sub(before);
    assert!(
        grown < 16 * 1024 * 1024,
        "reading the oversized manifest grew the process by {grown} bytes"
    );
    assert_eq!(other.list().await.unwrap().len(), 1);

    // More objects under a prefix than one listing reads (written where
    // the server's POSIX backend keeps them).
    let mut many_config = store_config(&s3);
    many_config.prefix = "clusters/tenant-c/c3".into();
    let many = SnapshotStore::new(&many_config).unwrap();
    let dir = s3.object_path(s3.bucket(), "clusters/tenant-c/c3");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..=backup::store::MAX_LISTED_OBJECTS {
        std::fs::write(dir.join(format!("x{i}")), b"").unwrap();
    }
    let e = many.list().await.unwrap_err();
    assert!(matches!(e, StoreError::TooMany { .. }), "{e:?}");
    assert_eq!(other.list().await.unwrap().len(), 1);

    // More complete snapshots (a data object and a manifest each) than one
    // listing reads manifests of: refused before any is read, so a prefix
    // filled with fakes costs a listing, not a GET per fake (each of these
    // manifests, were it read, would only be left out as unparsable).
    let mut fakes_config = store_config(&s3);
    fakes_config.prefix = "clusters/tenant-d/c4".into();
    let fakes = SnapshotStore::new(&fakes_config).unwrap();
    let dir = s3.object_path(s3.bucket(), "clusters/tenant-d/c4");
    std::fs::create_dir_all(&dir).unwrap();
    let count = backup::store::MAX_LISTED_SNAPSHOTS + 1;
    for i in 0..count {
        let name = format!("20260101T000000Z-r{i}");
        std::fs::write(dir.join(format!("{name}.db")), b"x").unwrap();
        std::fs::write(dir.join(format!("{name}.manifest.json")), b"{").unwrap();
    }
    let e = fakes.list().await.unwrap_err();
    assert!(
        matches!(e, StoreError::TooManySnapshots { found, .. } if found == count),
        "{e:?}"
    );
    assert_eq!(e.category(), "backup-too-large");
    assert!(e.to_string().contains("remove the extra ones"), "{e}");
    assert_eq!(other.list().await.unwrap().len(), 1);
}

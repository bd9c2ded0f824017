//! etcd's snapshot stream, read from the JSON gateway and turned back into
//! the bytes `etcdctl snapshot save` writes: the database followed by its
//! sha256, which `etcdutl snapshot restore` checks.
//!
//! The gateway sends one JSON message per line:
//! `{"result":{"remaining_bytes":"…","blob":"<base64>","version":"3.6.0"}}`.
//! The data messages count `remaining_bytes` down to 0 (0 is left out of the
//! JSON); one more message then carries the sha256 of everything sent. A
//! failure after the answer started arrives as `{"error":{…}}`. The stream is
//! checked as it goes: the count must add up, the last blob must be the
//! sha256 of the data, and the stream must not stop before it, so that a
//! snapshot cut short is an error here, not a file that looks whole.

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use futures::Stream;
use http_body_util::BodyExt;
use hyper::body::Body;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::etcd::api::{EtcdClient, EtcdError, u64_from_string};

/// The longest line accepted. etcd sends 32 KiB of data a message (about
/// 44 KiB of base64); anything far longer is not its stream.
const MAX_LINE: usize = 1 << 20;

/// What is wrong with a snapshot stream itself.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// A line is not a gateway message.
    #[error("message {index} is not a snapshot message: {source}")]
    Message {
        index: usize,
        #[source]
        source: serde_json::Error,
    },
    /// A line grew past any message etcd sends.
    #[error("message {index} is longer than {MAX_LINE} bytes")]
    LineTooLong { index: usize },
    /// etcd reported an error in the middle of the stream.
    #[error("etcd stopped the snapshot: {message}")]
    Refused { message: String },
    /// A blob is not base64.
    #[error("message {index} carries a blob that is not base64: {source}")]
    Blob {
        index: usize,
        #[source]
        source: base64::DecodeError,
    },
    /// The remaining byte counts do not add up.
    #[error(
        "message {index} says {remaining} bytes remain, but {expected} should after {received} bytes"
    )]
    Count {
        index: usize,
        remaining: u64,
        expected: u64,
        received: u64,
    },
    /// The message after the data is not a sha256.
    #[error("the checksum message carries {len} bytes, not a sha256")]
    ChecksumLength { len: usize },
    /// The data does not hash to the sha256 etcd sent after it.
    #[error("the snapshot's sha256 is {actual}, etcd sent {expected}")]
    Checksum { expected: String, actual: String },
    /// A message came after the checksum.
    #[error("message {index} came after the checksum")]
    Trailing { index: usize },
    /// The stream ended before the checksum.
    #[error("the stream ended after {received} of {expected} bytes, before etcd's checksum")]
    Truncated { received: u64, expected: u64 },
}

/// Why a snapshot could not be read from etcd.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The snapshot request failed or was refused.
    #[error("starting the snapshot: {0}")]
    Start(#[source] EtcdError),
    /// The connection broke while the snapshot was being sent.
    #[error("etcd {endpoint}: reading the snapshot: {source}")]
    Read {
        endpoint: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// etcd sent nothing for too long.
    #[error("etcd {endpoint}: the snapshot stream sent nothing for {idle:?}")]
    Idle { endpoint: String, idle: Duration },
    /// The stream is not a whole, consistent snapshot.
    #[error("etcd {endpoint}: {source}")]
    Stream {
        endpoint: String,
        #[source]
        source: StreamError,
    },
}

impl SnapshotError {
    /// Short static category, used as a metric label and event reason.
    pub fn category(&self) -> &'static str {
        match self {
            SnapshotError::Start(e) => e.category(),
            SnapshotError::Read { .. } | SnapshotError::Idle { .. } => "snapshot-interrupted",
            SnapshotError::Stream { .. } => "snapshot-invalid",
        }
    }
}

/// What a whole stream turned out to hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Bytes of the database (the file is 32 bytes longer: its sha256).
    pub db_size: u64,
    /// sha256 of the database, as etcd sent it and as the data hashed to.
    pub db_sha256: [u8; 32],
    /// The storage version etcd reported (e.g. `3.6.0`), empty when none.
    pub storage_version: String,
}

#[derive(Deserialize)]
struct Line {
    #[serde(default)]
    result: Option<Chunk>,
    #[serde(default)]
    error: Option<GatewayError>,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default, deserialize_with = "u64_from_string")]
    remaining_bytes: u64,
    #[serde(default)]
    blob: String,
    #[serde(default)]
    version: String,
}

#[derive(Deserialize)]
struct GatewayError {
    #[serde(default)]
    message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Data,
    Checksum,
    Done,
}

/// Turns the gateway's bytes, in whatever pieces they arrive, into the
/// snapshot file's bytes, checking the stream as it goes. Pure: it does no
/// I/O.
pub struct Decoder {
    line: Vec<u8>,
    index: usize,
    phase: Phase,
    /// Database bytes expected in all, known from the first message.
    total: Option<u64>,
    received: u64,
    hasher: Sha256,
    digest: Option<[u8; 32]>,
    storage_version: String,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    /// A decoder at the start of a stream.
    pub fn new() -> Self {
        Decoder {
            line: Vec::new(),
            index: 0,
            phase: Phase::Data,
            total: None,
            received: 0,
            hasher: Sha256::new(),
            digest: None,
            storage_version: String::new(),
        }
    }

    /// Feeds the next bytes of the stream; returns the file bytes of every
    /// message they completed, in order.
    pub fn push(&mut self, mut input: &[u8]) -> Result<Vec<Bytes>, StreamError> {
        let mut out = Vec::new();
        while let Some(end) = input.iter().position(|&b| b == b'\n') {
            let (head, rest) = input.split_at(end);
            self.extend_line(head)?;
            input = &rest[1..];
            let line = std::mem::take(&mut self.line);
            if let Some(bytes) = self.message(&line)? {
                out.push(bytes);
            }
        }
        self.extend_line(input)?;
        Ok(out)
    }

    /// Ends the stream: the file bytes of a last message without a newline,
    /// and what the stream held, or why it is not whole.
    pub fn finish(mut self) -> Result<(Option<Bytes>, Summary), StreamError> {
        let line = std::mem::take(&mut self.line);
        let last = self.message(&line)?;
        match (self.phase, self.digest) {
            (Phase::Done, Some(db_sha256)) => Ok((
                last,
                Summary {
                    db_size: self.received,
                    db_sha256,
                    storage_version: self.storage_version,
                },
            )),
            _ => Err(StreamError::Truncated {
                received: self.received,
                expected: self.total.unwrap_or(0),
            }),
        }
    }

    fn extend_line(&mut self, bytes: &[u8]) -> Result<(), StreamError> {
        if self.line.len() + bytes.len() > MAX_LINE {
            return Err(StreamError::LineTooLong { index: self.index });
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    /// One complete line: the file bytes it adds, if any.
    fn message(&mut self, line: &[u8]) -> Result<Option<Bytes>, StreamError> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let index = self.index;
        self.index += 1;
        let parsed: Line = serde_json::from_slice(line)
            .map_err(|source| StreamError::Message { index, source })?;
        if let Some(error) = parsed.error {
            return Err(StreamError::Refused {
                message: error.message,
            });
        }
        let Some(chunk) = parsed.result else {
            return Err(StreamError::Message {
                index,
                source: serde::de::Error::custom("neither result nor error"),
            });
        };
        let blob = base64::engine::general_purpose::STANDARD
            .decode(chunk.blob.as_bytes())
            .map_err(|source| StreamError::Blob { index, source })?;
        if self.storage_version.is_empty() {
            self.storage_version = chunk.version;
        }
        match self.phase {
            Phase::Data => {
                let len = blob.len() as u64;
                let received = self.received + len;
                let total = *self.total.get_or_insert(received + chunk.remaining_bytes);
                let expected = total.saturating_sub(received);
                if chunk.remaining_bytes != expected || received > total {
                    return Err(StreamError::Count {
                        index,
                        remaining: chunk.remaining_bytes,
                        expected,
                        received,
                    });
                }
                self.received = received;
                self.hasher.update(&blob);
                if chunk.remaining_bytes == 0 {
                    self.phase = Phase::Checksum;
                }
                Ok(Some(Bytes::from(blob)))
            }
            Phase::Checksum => {
                let sent: [u8; 32] = blob
                    .as_slice()
                    .try_into()
                    .map_err(|_| StreamError::ChecksumLength { len: blob.len() })?;
                let actual: [u8; 32] = self.hasher.clone().finalize().into();
                if sent != actual {
                    return Err(StreamError::Checksum {
                        expected: hex(&sent),
                        actual: hex(&actual),
                    });
                }
                self.digest = Some(actual);
                self.phase = Phase::Done;
                Ok(Some(Bytes::from(blob)))
            }
            Phase::Done => Err(StreamError::Trailing { index }),
        }
    }
}

/// Hashes a snapshot file as it passes: its size and sha256, and whether
/// its last 32 bytes are the sha256 of the rest, as in every file etcd's
/// snapshot stream makes. Pure, and holds no more than those 32 bytes.
#[derive(Clone, Default)]
pub struct FileDigest {
    size: u64,
    file: Sha256,
    db: Sha256,
    /// The last bytes seen, up to 32: not yet known to be database bytes.
    tail: Vec<u8>,
}

/// What [`FileDigest`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSums {
    /// Bytes of the whole file.
    pub size: u64,
    /// sha256 of the whole file, lower-case hex.
    pub sha256: String,
    /// Whether the file ends with the sha256 of what comes before it.
    pub ends_with_db_sha256: bool,
}

impl FileDigest {
    /// Hashes the next bytes of the file.
    pub fn update(&mut self, bytes: &[u8]) {
        self.size += bytes.len() as u64;
        self.file.update(bytes);
        self.tail.extend_from_slice(bytes);
        if self.tail.len() > 32 {
            let spill = self.tail.len() - 32;
            self.db.update(&self.tail[..spill]);
            self.tail.drain(..spill);
        }
    }

    /// Bytes seen so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The sums of the whole file.
    pub fn finish(self) -> FileSums {
        let db: [u8; 32] = self.db.finalize().into();
        FileSums {
            size: self.size,
            sha256: hex(&self.file.finalize()),
            ends_with_db_sha256: self.tail.len() == 32 && self.tail == db,
        }
    }
}

/// Lower-case hex, as sha256 sums are written.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The snapshot file of the member behind `endpoint`, as a stream of its
/// bytes: an error ends it, and it ends without one only when etcd sent the
/// whole database and a checksum that matches it. Nothing is buffered beyond
/// the message being decoded. `idle` bounds the wait for each piece.
pub async fn stream(
    client: &EtcdClient,
    endpoint: &str,
    idle: Duration,
) -> Result<impl Stream<Item = Result<Bytes, SnapshotError>> + Send + Unpin + use<>, SnapshotError>
{
    let body = client
        .snapshot(endpoint)
        .await
        .map_err(SnapshotError::Start)?;
    Ok(Box::pin(decoded(body, endpoint.to_string(), idle)))
}

struct Reading<B> {
    body: B,
    decoder: Option<Decoder>,
    ready: std::collections::VecDeque<Bytes>,
    endpoint: String,
    idle: Duration,
}

/// The file bytes of a gateway response `body`, checked; see [`stream`].
fn decoded<B>(
    body: B,
    endpoint: String,
    idle: Duration,
) -> impl Stream<Item = Result<Bytes, SnapshotError>> + Send
where
    B: Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let state = Reading {
        body,
        decoder: Some(Decoder::new()),
        ready: Default::default(),
        endpoint,
        idle,
    };
    futures::stream::try_unfold(state, |mut state| async move {
        loop {
            if let Some(bytes) = state.ready.pop_front() {
                return Ok(Some((bytes, state)));
            }
            let Some(decoder) = state.decoder.as_mut() else {
                return Ok(None);
            };
            let invalid = |endpoint: &str, source| SnapshotError::Stream {
                endpoint: endpoint.to_string(),
                source,
            };
            let frame = tokio::time::timeout(state.idle, state.body.frame())
                .await
                .map_err(|_| SnapshotError::Idle {
                    endpoint: state.endpoint.clone(),
                    idle: state.idle,
                })?;
            match frame {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        let out = decoder
                            .push(&data)
                            .map_err(|e| invalid(&state.endpoint, e))?;
                        state.ready.extend(out);
                    }
                }
                Some(Err(source)) => {
                    return Err(SnapshotError::Read {
                        endpoint: state.endpoint.clone(),
                        source: source.into(),
                    });
                }
                None => {
                    let decoder = state.decoder.take().unwrap_or_default();
                    let (last, summary) =
                        decoder.finish().map_err(|e| invalid(&state.endpoint, e))?;
                    tracing::debug!(
                        endpoint = %state.endpoint,
                        db_size = summary.db_size,
                        storage_version = %summary.storage_version,
                        "etcd snapshot received whole"
                    );
                    state.ready.extend(last);
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// The gateway's stream for `db`, sent `chunk` bytes a message, with the
    /// checksum etcd would send (or `checksum` instead).
    fn gateway(db: &[u8], chunk: usize, checksum: Option<&[u8]>) -> Vec<u8> {
        let mut out = Vec::new();
        let mut sent = 0;
        for piece in db.chunks(chunk) {
            sent += piece.len();
            let remaining = db.len() - sent;
            let line = if remaining == 0 {
                format!(
                    r#"{{"result":{{"blob":"{}","version":"3.6.0"}}}}"#,
                    b64(piece)
                )
            } else {
                format!(
                    r#"{{"result":{{"remaining_bytes":"{remaining}","blob":"{}","version":"3.6.0"}}}}"#,
                    b64(piece)
                )
            };
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
        let digest: Vec<u8> = match checksum {
            Some(c) => c.to_vec(),
            None => Sha256::digest(db).to_vec(),
        };
        out.extend_from_slice(
            format!(
                r#"{{"result":{{"blob":"{}","version":"3.6.0"}}}}"#,
                b64(&digest)
            )
            .as_bytes(),
        );
        out.push(b'\n');
        out
    }

    /// Feeds `input` in pieces of `piece` bytes; the file and the summary.
    fn decode(input: &[u8], piece: usize) -> Result<(Vec<u8>, Summary), StreamError> {
        let mut decoder = Decoder::new();
        let mut file = Vec::new();
        for part in input.chunks(piece) {
            for bytes in decoder.push(part)? {
                file.extend_from_slice(&bytes);
            }
        }
        let (last, summary) = decoder.finish()?;
        file.extend(last.into_iter().flatten());
        Ok((file, summary))
    }

    fn db(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn the_file_is_the_database_and_its_sha256_whatever_the_pieces() {
        let db = db(100_000);
        let stream = gateway(&db, 32 * 1024, None);
        let mut expected = db.clone();
        expected.extend_from_slice(&Sha256::digest(&db));
        for piece in [1, 7, 4096, stream.len()] {
            let (file, summary) = decode(&stream, piece).unwrap();
            assert_eq!(file, expected, "pieces of {piece}");
            assert_eq!(summary.db_size, 100_000);
            assert_eq!(summary.db_sha256.to_vec(), Sha256::digest(&db).to_vec());
            assert_eq!(summary.storage_version, "3.6.0");
        }
    }

    #[test]
    fn a_database_of_exactly_one_message_and_no_final_newline() {
        let db = db(32 * 1024);
        let mut stream = gateway(&db, 32 * 1024, None);
        stream.pop();
        let (file, summary) = decode(&stream, 1000).unwrap();
        assert_eq!(file.len(), 32 * 1024 + 32);
        assert_eq!(summary.db_size, 32 * 1024);
    }

    #[test]
    fn a_stream_cut_short_is_truncated() {
        let db = db(100_000);
        let stream = gateway(&db, 32 * 1024, None);
        // Cut after the second message: two of four data messages.
        let cut = stream
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .nth(1)
            .map(|(i, _)| i + 1)
            .unwrap();
        match decode(&stream[..cut], 512) {
            Err(StreamError::Truncated { received, expected }) => {
                assert_eq!(received, 64 * 1024);
                assert_eq!(expected, 100_000);
            }
            other => panic!("expected Truncated, got {other:?}"),
        }
        // All data but no checksum.
        let without_checksum: Vec<u8> = {
            let last = stream[..stream.len() - 1]
                .iter()
                .rposition(|b| *b == b'\n')
                .unwrap();
            stream[..=last].to_vec()
        };
        assert!(matches!(
            decode(&without_checksum, 512),
            Err(StreamError::Truncated {
                received: 100_000,
                ..
            })
        ));
        // Half a line.
        assert!(matches!(
            decode(&stream[..cut + 100], 512),
            Err(StreamError::Message { .. })
        ));
    }

    #[test]
    fn a_wrong_checksum_is_refused() {
        let db = db(5000);
        let stream = gateway(&db, 1024, Some(&[0u8; 32]));
        match decode(&stream, 100) {
            Err(StreamError::Checksum { expected, actual }) => {
                assert_eq!(expected, "0".repeat(64));
                assert_eq!(actual, hex(&Sha256::digest(&db)));
            }
            other => panic!("expected Checksum, got {other:?}"),
        }
        let stream = gateway(&db, 1024, Some(b"short"));
        assert!(matches!(
            decode(&stream, 100),
            Err(StreamError::ChecksumLength { len: 5 })
        ));
    }

    #[test]
    fn counts_that_do_not_add_up_are_refused() {
        let first = format!(
            r#"{{"result":{{"remaining_bytes":"10","blob":"{}"}}}}"#,
            b64(b"abcd")
        );
        // 10 remained after 4 bytes; 3 bytes later 7 should, not 5.
        let second = format!(
            r#"{{"result":{{"remaining_bytes":"5","blob":"{}"}}}}"#,
            b64(b"efg")
        );
        let stream = format!("{first}\n{second}\n");
        match decode(stream.as_bytes(), 3) {
            Err(StreamError::Count {
                index: 1,
                remaining: 5,
                expected: 7,
                received: 7,
            }) => {}
            other => panic!("expected Count, got {other:?}"),
        }
    }

    #[test]
    fn errors_in_the_stream_are_reported() {
        let db = db(2000);
        let mut stream = gateway(&db, 1024, None);
        stream.truncate(stream.iter().position(|b| *b == b'\n').unwrap() + 1);
        stream.extend_from_slice(
            br#"{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: server stopped","http_status":"Service Unavailable"}}"#,
        );
        match decode(&stream, 64) {
            Err(StreamError::Refused { message }) => {
                assert_eq!(message, "etcdserver: server stopped")
            }
            other => panic!("expected Refused, got {other:?}"),
        }
        let bad = br#"{"result":{"blob":"not base64!"}}"#;
        assert!(matches!(
            decode(bad, 64),
            Err(StreamError::Blob { index: 0, .. })
        ));
        assert!(matches!(
            decode(b"[1,2]\n", 64),
            Err(StreamError::Message { index: 0, .. })
        ));
    }

    #[test]
    fn nothing_may_follow_the_checksum() {
        let db = db(100);
        let mut stream = gateway(&db, 1024, None);
        stream.extend_from_slice(format!(r#"{{"result":{{"blob":"{}"}}}}"#, b64(b"x")).as_bytes());
        assert!(matches!(
            decode(&stream, 64),
            Err(StreamError::Trailing { index: 2 })
        ));
    }

    #[test]
    fn endless_lines_are_refused() {
        let mut decoder = Decoder::new();
        let chunk = vec![b'a'; 64 * 1024];
        let mut failed = false;
        for _ in 0..(MAX_LINE / chunk.len() + 2) {
            if let Err(e) = decoder.push(&chunk) {
                assert!(matches!(e, StreamError::LineTooLong { index: 0 }));
                failed = true;
                break;
            }
        }
        assert!(failed);
    }

    #[test]
    fn a_file_digest_checks_the_trailing_sha256() {
        let db = db(70_000);
        let mut file = db.clone();
        file.extend_from_slice(&Sha256::digest(&db));
        for piece in [1, 31, 32, 33, 4096, file.len()] {
            let mut digest = FileDigest::default();
            for part in file.chunks(piece) {
                digest.update(part);
            }
            let sums = digest.finish();
            assert_eq!(sums.size, file.len() as u64);
            assert_eq!(sums.sha256, hex(&Sha256::digest(&file)));
            assert!(sums.ends_with_db_sha256, "pieces of {piece}");
        }
        let mut corrupt = file.clone();
        corrupt[10] ^= 1;
        let mut digest = FileDigest::default();
        digest.update(&corrupt);
        assert!(!digest.finish().ends_with_db_sha256);
        let mut digest = FileDigest::default();
        digest.update(&file[..20]);
        assert!(!digest.finish().ends_with_db_sha256);
    }

    /// A response body made of `pieces`, then `end`: nothing more
    /// (`None`), a broken connection, or a stall.
    fn body(
        pieces: Vec<Vec<u8>>,
        end: End,
    ) -> impl Body<Data = Bytes, Error = std::io::Error> + Send + Unpin {
        use futures::StreamExt;
        let frames = futures::stream::iter(
            pieces
                .into_iter()
                .map(|p| Ok(hyper::body::Frame::data(Bytes::from(p)))),
        );
        let tail = futures::stream::iter(match end {
            End::Clean => vec![],
            End::Broken => vec![Err(std::io::Error::other("connection reset"))],
            End::Stall => vec![],
        });
        let stall = futures::stream::pending().take(usize::from(end == End::Stall));
        http_body_util::StreamBody::new(frames.chain(tail).chain(stall))
    }

    #[derive(PartialEq, Eq, Clone, Copy)]
    enum End {
        Clean,
        Broken,
        Stall,
    }

    async fn read_all(
        body: impl Body<Data = Bytes, Error = std::io::Error> + Send + Unpin,
    ) -> Result<Vec<u8>, SnapshotError> {
        use futures::TryStreamExt;
        let stream = decoded(body, "https://m0:2379".into(), Duration::from_millis(200));
        let pieces: Vec<Bytes> = Box::pin(stream).try_collect().await?;
        Ok(pieces.concat())
    }

    #[tokio::test]
    async fn a_whole_response_is_the_file() {
        let db = db(70_000);
        let stream = gateway(&db, 32 * 1024, None);
        let pieces = stream.chunks(5000).map(<[u8]>::to_vec).collect();
        let file = read_all(body(pieces, End::Clean)).await.unwrap();
        assert_eq!(&file[..70_000], &db[..]);
        assert_eq!(&file[70_000..], &Sha256::digest(&db)[..]);
    }

    #[tokio::test]
    async fn a_response_that_stops_breaks_or_stalls_is_an_error() {
        let db = db(70_000);
        let stream = gateway(&db, 32 * 1024, None);
        let half = vec![stream[..stream.len() / 2].to_vec()];
        match read_all(body(half.clone(), End::Clean)).await {
            Err(SnapshotError::Stream { endpoint, source }) => {
                assert_eq!(endpoint, "https://m0:2379");
                assert!(
                    matches!(
                        source,
                        StreamError::Message { .. } | StreamError::Truncated { .. }
                    ),
                    "{source}"
                );
            }
            other => panic!("expected a stream error, got {other:?}"),
        }
        let e = read_all(body(half.clone(), End::Broken)).await.unwrap_err();
        assert!(matches!(e, SnapshotError::Read { .. }), "{e:?}");
        assert!(e.to_string().contains("connection reset"), "{e}");
        assert_eq!(e.category(), "snapshot-interrupted");
        let started = std::time::Instant::now();
        let e = read_all(body(half, End::Stall)).await.unwrap_err();
        assert!(matches!(e, SnapshotError::Idle { .. }), "{e:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn hex_is_lower_case() {
        assert_eq!(hex(&[0x00, 0xab, 0x7f]), "00ab7f");
    }
}

//! The artifact server hosts download packages from: plain HTTP GET of the
//! files a test puts in a directory, listening on the bridge's address so
//! that only the machine and its test hosts reach it.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::error::Error;
use crate::sys;

pub struct ArtifactServer {
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    /// The listening socket, shut down to stop the accept loop.
    listener: TcpListener,
    requests: Arc<Mutex<Vec<Request>>>,
    thread: Option<JoinHandle<()>>,
}

/// One request the server answered, as the request log keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The client's address: a host's own address when a host asked.
    pub from: IpAddr,
    /// The URL path, without query.
    pub path: String,
    /// Bytes of the file sent in the response body: 0 for a HEAD, a 404,
    /// a response that failed midway, or one still being sent.
    pub bytes: u64,
}

impl ArtifactServer {
    pub fn start(ip: IpAddr, dir: PathBuf) -> Result<ArtifactServer, Error> {
        let failed = |source| Error::ArtifactServer {
            addr: ip.to_string(),
            source,
        };
        let listener = TcpListener::bind((ip, 0)).map_err(failed)?;
        let addr = listener.local_addr().map_err(failed)?;
        let handle = listener.try_clone().map_err(failed)?;
        let stopping = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (stop, log) = (Arc::clone(&stopping), Arc::clone(&requests));
        let thread = std::thread::Builder::new()
            .name("kok-artifacts".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let (dir, log) = (dir.clone(), Arc::clone(&log));
                    // A slow download must not hold up the others. Without a
                    // thread, the connection is dropped and the client retries.
                    let _ = std::thread::Builder::new().spawn(move || {
                        let _ = serve(stream, &dir, &log);
                    });
                }
            })
            .map_err(failed)?;
        Ok(ArtifactServer {
            addr,
            stopping,
            listener: handle,
            requests,
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Paths requested so far, in order, whatever the answer was.
    pub fn requests(&self) -> Vec<String> {
        self.log().into_iter().map(|r| r.path).collect()
    }

    /// Every request so far, in the order they arrived, with who asked and
    /// how much of a file was sent (filled in once the response is done).
    pub fn log(&self) -> Vec<Request> {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for ArtifactServer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees the flag.
        sys::shut_down(&self.listener);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(stream: TcpStream, dir: &Path, log: &Mutex<Vec<Request>>) -> io::Result<()> {
    let from = stream.peer_addr()?.ip();
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // The headers say nothing this server acts on.
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let mut words = request_line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split(['?', '#']).next().unwrap_or("");
    let index = {
        let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
        log.push(Request {
            from,
            path: path.to_owned(),
            bytes: 0,
        });
        log.len() - 1
    };
    let mut out = stream;
    if method != "GET" && method != "HEAD" {
        return respond(&mut out, "405 Method Not Allowed", None, method == "HEAD").map(drop);
    }
    let file = resolve(dir, path).and_then(|p| {
        File::open(p)
            .ok()
            .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
    });
    let sent = match file {
        Some(file) => respond(&mut out, "200 OK", Some(file), method == "HEAD")?,
        None => respond(&mut out, "404 Not Found", None, method == "HEAD").map(|_| 0)?,
    };
    if let Some(request) = log.lock().unwrap_or_else(|p| p.into_inner()).get_mut(index) {
        request.bytes = sent;
    }
    Ok(())
}

/// The file under `dir` that a URL path names; `None` for anything that would
/// leave `dir`.
fn resolve(dir: &Path, url_path: &str) -> Option<PathBuf> {
    let decoded = percent_decode(url_path.strip_prefix('/')?)?;
    let relative = Path::new(&decoded);
    relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then(|| dir.join(relative))
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Writes the response; returns the bytes of `file` sent.
fn respond(
    out: &mut TcpStream,
    status: &str,
    file: Option<File>,
    head_only: bool,
) -> io::Result<u64> {
    let (length, kind) = match &file {
        Some(f) => (f.metadata()?.len(), "application/octet-stream"),
        None => (status.len() as u64 + 1, "text/plain"),
    };
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Length: {length}\r\nContent-Type: {kind}\r\nConnection: close\r\n\r\n"
    )?;
    let mut sent = 0;
    if !head_only {
        match file {
            Some(mut f) => sent = io::copy(&mut f, out)?,
            None => writeln!(out, "{status}")?,
        }
    }
    out.flush()?;
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_directory() {
        let dir = Path::new("/srv");
        assert_eq!(
            resolve(dir, "/a/b%20c.tgz"),
            Some(PathBuf::from("/srv/a/b c.tgz"))
        );
        assert_eq!(resolve(dir, "/../etc/passwd"), None);
        assert_eq!(resolve(dir, "/a/%2e%2e/%2e%2e/x"), None);
        assert_eq!(resolve(dir, "//etc/passwd"), None);
        assert_eq!(resolve(dir, "relative"), None);
    }
}

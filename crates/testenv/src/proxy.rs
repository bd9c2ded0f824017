//! A TCP forwarder, so programs on the SSH test hosts (in their own network
//! namespaces) reach a server that listens on the machine's loopback, such as
//! the API server of a [`crate::kube_env::KubeEnv`]. Bytes pass through
//! untouched: TLS stays end to end between the host and the server.

use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

/// Forwards every connection to its listening address on to one target.
/// Dropping it stops accepting; connections already open run to their end.
pub struct TcpProxy {
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TcpProxy {
    /// Listens on `ip` (a free port) and forwards to `target`.
    pub fn start(ip: IpAddr, target: SocketAddr) -> io::Result<TcpProxy> {
        Self::start_at(SocketAddr::new(ip, 0), target)
    }

    /// Listens on `listen` (port 0: a free one) and forwards to `target`.
    pub fn start_at(listen: SocketAddr, target: SocketAddr) -> io::Result<TcpProxy> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&stopping);
        let thread = std::thread::Builder::new()
            .name("kok-tcp-proxy".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(client) = stream else { continue };
                    let _ = std::thread::Builder::new().spawn(move || {
                        if let Ok(server) = TcpStream::connect(target) {
                            pipe(client, server);
                        }
                    });
                }
            })?;
        Ok(TcpProxy {
            addr,
            stopping,
            thread: Some(thread),
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Copies both directions until each side has closed its half.
fn pipe(client: TcpStream, server: TcpStream) {
    let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || copy(client2, server2));
    copy(server, client);
    let _ = up.join();
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn bytes_pass_both_ways() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = server.local_addr().unwrap();
        let echo = std::thread::spawn(move || {
            let (mut s, _) = server.accept().unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
        });
        let proxy = TcpProxy::start("127.0.0.1".parse().unwrap(), target).unwrap();
        let mut c = TcpStream::connect(proxy.addr()).unwrap();
        c.write_all(b"hello").unwrap();
        let mut back = [0u8; 5];
        c.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"hello");
        echo.join().unwrap();
    }
}

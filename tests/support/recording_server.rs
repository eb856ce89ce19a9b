//! A stand-in server, plain or TLS (rustls, with a certificate of the test's
//! choosing), that answers each command from a function and records what it
//! was sent: the bytes as they came off the wire, the bytes after TLS, and
//! each command's name. For servers a client must not trust: a rogue that a
//! Sentinel names, a server that says it is a replica.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::fault_proxy::frames::split_command;
use super::tls::Issued;

/// What a [`RecordingServer`] received, over all its connections.
#[derive(Default)]
pub struct Received {
    /// TCP connections accepted.
    pub connections: AtomicUsize,
    /// TLS handshakes that completed.
    pub handshakes: AtomicUsize,
    /// Every byte read from the sockets (TLS records included).
    pub wire: Mutex<Vec<u8>>,
    /// Every byte of the commands (after TLS).
    pub plain: Mutex<Vec<u8>>,
    /// The commands' names (first two words, upper-cased), in order.
    pub commands: Mutex<Vec<String>>,
}

impl Received {
    /// Whether `needle` came in, in any form (on the wire or after TLS).
    pub fn saw(&self, needle: &str) -> bool {
        let has = |b: &[u8]| b.windows(needle.len()).any(|w| w == needle.as_bytes());
        has(&self.wire.lock().unwrap()) || has(&self.plain.lock().unwrap())
    }

    /// The names of the commands received.
    pub fn commands(&self) -> Vec<String> {
        self.commands.lock().unwrap().clone()
    }
}

/// The reply (raw RESP) to a command given as its upper-cased first two words.
pub type Answer = dyn Fn(&str) -> String + Send + Sync;

/// A recording server on a loopback port; its threads end with the process.
pub struct RecordingServer {
    pub port: u16,
    pub received: Arc<Received>,
}

impl RecordingServer {
    /// Listens in plain TCP, or TLS with `cert` when given.
    pub fn start(
        cert: Option<&Issued>,
        answer: impl Fn(&str) -> String + Send + Sync + 'static,
    ) -> Self {
        let tls = cert.map(|issued| {
            let chain = CertificateDer::pem_file_iter(&issued.cert)
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(&issued.key).unwrap();
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            Arc::new(
                rustls::ServerConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_no_client_auth()
                    .with_single_cert(chain, key)
                    .unwrap(),
            )
        });
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Received::default());
        let answer: Arc<Answer> = Arc::new(answer);
        let rec = received.clone();
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                let Ok(tcp) = tcp else { return };
                rec.connections.fetch_add(1, Ordering::SeqCst);
                let (rec, answer, tls) = (rec.clone(), answer.clone(), tls.clone());
                std::thread::spawn(move || {
                    let wire = Tee {
                        tcp,
                        rec: rec.clone(),
                    };
                    match tls {
                        None => serve(wire, &rec, &*answer),
                        Some(config) => {
                            let Ok(conn) = rustls::ServerConnection::new(config) else {
                                return;
                            };
                            let mut stream = rustls::StreamOwned::new(conn, wire);
                            // The handshake, driven to its end before any command.
                            while stream.conn.is_handshaking() {
                                if stream.conn.complete_io(&mut stream.sock).is_err() {
                                    return;
                                }
                            }
                            rec.handshakes.fetch_add(1, Ordering::SeqCst);
                            serve(stream, &rec, &*answer);
                        }
                    }
                });
            }
        });
        Self { port, received }
    }
}

/// The socket, keeping a copy of every byte read from it.
struct Tee {
    tcp: TcpStream,
    rec: Arc<Received>,
}

impl Read for Tee {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.tcp.read(buf)?;
        self.rec.wire.lock().unwrap().extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

impl Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tcp.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.tcp.flush()
    }
}

fn serve(mut s: impl Read + Write, rec: &Received, answer: &Answer) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while let Some((len, name)) = split_command(&buf) {
            rec.plain.lock().unwrap().extend_from_slice(&buf[..len]);
            rec.commands.lock().unwrap().push(name.clone());
            buf.drain(..len);
            if s.write_all(answer(&name).as_bytes()).is_err() || s.flush().is_err() {
                return;
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// RESP for a bulk string.
pub fn bulk(s: &str) -> String {
    format!("${}\r\n{s}\r\n", s.len())
}

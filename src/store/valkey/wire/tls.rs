//! TLS for `rediss://` URLs: rustls with the `ring` provider, always verifying.
//!
//! There is deliberately no way to turn verification off. The trust roots are
//! the `--tls-ca-file` bundle when given, the system store otherwise.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::error::{Error, Kind};

/// PEM files for TLS (rustls). Verification is always on.
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    /// CA bundle to trust instead of the system roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain for mTLS.
    pub cert_file: Option<PathBuf>,
    /// Client private key for mTLS.
    pub key_file: Option<PathBuf>,
    /// Name to verify the server certificate against, instead of the URL host.
    pub server_name: Option<String>,
}

impl TlsFiles {
    /// True when nothing is set.
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none()
            && self.cert_file.is_none()
            && self.key_file.is_none()
            && self.server_name.is_none()
    }

    /// These settings, each one left unset taken from `fallback` (the
    /// certificate and key as a pair: both from here, or both from there).
    pub fn or(&self, fallback: &TlsFiles) -> TlsFiles {
        let own_pair = self.cert_file.is_some() || self.key_file.is_some();
        let pair = if own_pair { self } else { fallback };
        TlsFiles {
            ca_file: self.ca_file.clone().or_else(|| fallback.ca_file.clone()),
            cert_file: pair.cert_file.clone(),
            key_file: pair.key_file.clone(),
            server_name: self
                .server_name
                .clone()
                .or_else(|| fallback.server_name.clone()),
        }
    }
}

/// Builds the client TLS settings; file problems are [`Kind::Config`].
/// The server name override (`files.server_name`) is applied per connection.
pub fn client_config(files: &TlsFiles) -> Result<Arc<rustls::ClientConfig>, Error> {
    let roots = match &files.ca_file {
        Some(path) => {
            let mut roots = RootCertStore::empty();
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| invalid(format!("cannot read CA file {}: {e}", path.display())))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(invalid(format!(
                    "CA file {} holds no usable certificate",
                    path.display()
                )));
            }
            roots
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(native.certs);
            if roots.is_empty() {
                return Err(invalid(
                    "no system CA certificates found; pass --tls-ca-file".into(),
                ));
            }
            roots
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("tls: {e}")))?
        .with_root_certificates(roots);
    let config = match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| {
                    invalid(format!(
                        "cannot read client certificate {}: {e}",
                        cert.display()
                    ))
                })?;
            if chain.is_empty() {
                return Err(invalid(format!(
                    "client certificate file {} holds no certificate",
                    cert.display()
                )));
            }
            // The key's parse error is not shown: it could quote key material.
            let key_der = PrivateKeyDer::from_pem_file(key).map_err(|_| {
                invalid(format!(
                    "cannot read a PEM private key from {}",
                    key.display()
                ))
            })?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| invalid(format!("client certificate and key do not fit: {e}")))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(invalid(
                "--tls-cert-file and --tls-key-file must be given together".into(),
            ));
        }
    };
    Ok(Arc::new(config))
}

fn invalid(msg: String) -> Error {
    Error::new(Kind::Config, msg)
}

/// An I/O error as a sentence for people: a TLS failure says what went wrong
/// (never rustls's variant names), anything else is shown as it is. `name`
/// is the name the server's certificate was checked against, when known.
pub fn describe_io(e: &std::io::Error, name: Option<&str>) -> String {
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(tls) => format!("TLS: {}", sentence(tls, name)),
        None => e.to_string(),
    }
}

/// Why a TLS handshake with the server checked against `name` failed.
pub fn handshake_failure(e: &std::io::Error, name: &str) -> String {
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(tls) => format!("TLS handshake failed: {}", sentence(tls, Some(name))),
        None => format!("TLS handshake failed: {e}"),
    }
}

fn sentence(tls: &rustls::Error, name: Option<&str>) -> String {
    use rustls::{AlertDescription as Alert, CertificateError as Cert, Error};
    let name = name.map_or_else(
        || "the name it was reached by".to_owned(),
        |n| format!("name {n}"),
    );
    match tls {
        Error::InvalidCertificate(cert) => match cert {
            Cert::UnknownIssuer => {
                "the server's certificate is not signed by a trusted certificate authority \
                 (see --tls-ca-file)"
                    .to_owned()
            }
            Cert::NotValidForName => {
                format!("the server's certificate is not valid for {name} (see --tls-server-name)")
            }
            Cert::NotValidForNameContext { presented, .. } => {
                // webpki lists names as `DnsName("a.example")`: keep the names.
                let dns: Vec<&str> = presented
                    .iter()
                    .filter_map(|n| n.strip_prefix("DnsName(\"")?.strip_suffix("\")"))
                    .collect();
                let names = if dns.is_empty() {
                    String::new()
                } else {
                    format!("; it names {}", dns.join(", "))
                };
                format!(
                    "the server's certificate is not valid for {name}{names} (see --tls-server-name)"
                )
            }
            Cert::Expired | Cert::ExpiredContext { .. } => {
                "the server's certificate has expired".to_owned()
            }
            Cert::NotValidYet | Cert::NotValidYetContext { .. } => {
                "the server's certificate is not valid yet (check the clocks)".to_owned()
            }
            Cert::Revoked => "the server's certificate is revoked".to_owned(),
            Cert::BadSignature
            | Cert::UnsupportedSignatureAlgorithmContext { .. }
            | Cert::UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => {
                "the server's certificate has a signature that cannot be verified".to_owned()
            }
            Cert::InvalidPurpose | Cert::InvalidPurposeContext { .. } => {
                "the server's certificate is not meant for a TLS server".to_owned()
            }
            _ => "the server's certificate was rejected".to_owned(),
        },
        Error::AlertReceived(alert) => match alert {
            Alert::CertificateRequired => {
                "the server requires a client certificate (see --tls-cert-file and --tls-key-file)"
                    .to_owned()
            }
            Alert::UnknownCA => {
                "the server does not trust the authority that signed our client certificate"
                    .to_owned()
            }
            Alert::BadCertificate
            | Alert::UnsupportedCertificate
            | Alert::CertificateUnknown
            | Alert::CertificateExpired
            | Alert::CertificateRevoked => "the server rejected our client certificate".to_owned(),
            Alert::HandshakeFailure | Alert::ProtocolVersion | Alert::InsufficientSecurity => {
                "the server and the client share no TLS version or cipher suite".to_owned()
            }
            Alert::UnrecognisedName => {
                format!("the server does not serve {name} (see --tls-server-name)")
            }
            _ => "the server ended the TLS handshake with an error".to_owned(),
        },
        Error::InvalidMessage(_)
        | Error::InappropriateMessage { .. }
        | Error::InappropriateHandshakeMessage { .. } => {
            "the server's answer is not a valid TLS handshake (is it a TLS port?)".to_owned()
        }
        Error::NoCertificatesPresented => "the server presented no certificate".to_owned(),
        Error::PeerIncompatible(_) => {
            "the server and the client share no TLS version or cipher suite".to_owned()
        }
        _ => "the TLS handshake failed".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_failures_read_as_sentences() {
        let io = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let cases = [
            (
                io(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::UnknownIssuer,
                )),
                "not signed by a trusted certificate authority",
            ),
            (
                io(rustls::Error::AlertReceived(
                    rustls::AlertDescription::CertificateRequired,
                )),
                "requires a client certificate",
            ),
            (
                io(rustls::Error::AlertReceived(
                    rustls::AlertDescription::UnknownCA,
                )),
                "does not trust the authority",
            ),
        ];
        for (e, want) in cases {
            let said = describe_io(&e, Some("valkey.test"));
            assert!(said.contains(want), "{said}");
            for debug_name in ["UnknownIssuer", "CertificateRequired", "UnknownCA", "Alert"] {
                assert!(!said.contains(debug_name), "{said}");
            }
        }
        let mismatch = io(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForNameContext {
                expected: rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap(),
                presented: vec!["DnsName(\"valkey.test\")".into()],
            },
        ));
        assert_eq!(
            describe_io(&mismatch, Some("127.0.0.1")),
            "TLS: the server's certificate is not valid for name 127.0.0.1; \
             it names valkey.test (see --tls-server-name)"
        );
        assert!(handshake_failure(&mismatch, "127.0.0.1").starts_with(
            "TLS handshake failed: the server's certificate is not valid for name 127.0.0.1"
        ));
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        assert_eq!(describe_io(&plain, None), "reset by peer");
    }
}

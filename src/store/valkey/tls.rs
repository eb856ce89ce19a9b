//! TLS for `rediss://` URLs: rustls with the `ring` provider, always verifying.
//!
//! There is deliberately no way to turn verification off. The trust roots are
//! the `--tls-ca-file` bundle when given, the system store otherwise.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::config::TlsFiles;
use crate::store::StoreError;

/// Builds the client TLS settings; file problems are [`StoreError::Invalid`].
/// The server name override (`files.server_name`) is applied per connection.
pub fn client_config(files: &TlsFiles) -> Result<Arc<rustls::ClientConfig>, StoreError> {
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

fn invalid(msg: String) -> StoreError {
    StoreError::Invalid(msg)
}

//! What a [`ValkeyConfig`] means for connections, decided once before
//! anything connects: the parsed URL, TLS for the data nodes and for the
//! Sentinels, and who logs in where. Settings that do not fit the URL (TLS
//! files without a TLS URL, Sentinel settings without Sentinels, TLS through
//! Sentinels with the system roots alone) are refused here.

use super::wire::dial::{Dialer, Tls};
use super::wire::endpoint::{self, Endpoint};
use super::wire::tls;
use super::{ValkeyConfig, redact_url};
use crate::store::StoreError;

/// TLS settings from `files`; files that cannot be used are [`StoreError::Invalid`].
fn tls_config(files: &super::TlsFiles) -> Result<std::sync::Arc<rustls::ClientConfig>, StoreError> {
    tls::client_config(files).map_err(|e| StoreError::Invalid(e.detail))
}

/// The parsed URL and how to open connections for it (credentials, TLS).
pub(super) fn prepare(cfg: &ValkeyConfig) -> Result<(Endpoint, Dialer), StoreError> {
    let endpoint = endpoint::parse(&cfg.url).map_err(|why| {
        StoreError::Invalid(format!("bad valkey url {}: {why}", redact_url(&cfg.url)))
    })?;
    let tls = if endpoint.tls {
        Some(Tls {
            config: tls_config(&cfg.tls)?,
            server_name: cfg.tls.server_name.clone(),
        })
    } else if cfg.tls.ca_file.is_some()
        || cfg.tls.cert_file.is_some()
        || cfg.tls.server_name.is_some()
    {
        return Err(StoreError::Invalid(format!(
            "bad valkey url {}: TLS files or a TLS server name were given but the URL does not use TLS (rediss://)",
            redact_url(&cfg.url)
        )));
    } else {
        None
    };
    if endpoint.tls
        && matches!(endpoint.topology, endpoint::Topology::Sentinel { .. })
        && cfg.tls.ca_file.is_none()
        && cfg.tls.server_name.is_none()
    {
        // The primary's address comes from a Sentinel: with the system roots
        // and the name it gives, any server with a public certificate for a
        // name of the Sentinel's choosing would be sent the password.
        return Err(StoreError::Invalid(format!(
            "bad valkey url {}: TLS through Sentinels needs --tls-ca-file (the CA of the data \
             nodes) or --tls-server-name (the name their certificates carry): with the system \
             roots alone, a Sentinel could name any server holding a public certificate for a \
             name of its choosing, and that server would be sent the password",
            redact_url(&cfg.url)
        )));
    }
    if (cfg.sentinel_username.is_some() || cfg.sentinel_password.is_some())
        && !matches!(endpoint.topology, endpoint::Topology::Sentinel { .. })
    {
        return Err(StoreError::Invalid(format!(
            "bad valkey url {}: Sentinel credentials were given but the URL does not use Sentinel (redis-sentinel://)",
            redact_url(&cfg.url)
        )));
    }
    let sentinel_tls = match (&endpoint.topology, &tls) {
        (endpoint::Topology::Sentinel { .. }, Some(data)) if cfg.sentinel_tls.is_empty() => {
            Some(data.clone())
        }
        (endpoint::Topology::Sentinel { .. }, Some(_)) => {
            let files = cfg.sentinel_tls.or(&cfg.tls);
            Some(Tls {
                config: tls_config(&files)?,
                server_name: files.server_name,
            })
        }
        _ if !cfg.sentinel_tls.is_empty() => {
            return Err(StoreError::Invalid(format!(
                "bad valkey url {}: Sentinel TLS settings (--sentinel-tls-*) were given but the \
                 URL does not use Sentinels over TLS (valkeys-sentinel://)",
                redact_url(&cfg.url)
            )));
        }
        _ => None,
    };
    let dialer = Dialer {
        tls,
        sentinel_tls,
        username: cfg.username.clone().or_else(|| endpoint.username.clone()),
        password: cfg.password.clone(),
        sentinel_username: cfg.sentinel_username.clone(),
        sentinel_password: cfg.sentinel_password.clone(),
        db: endpoint.db,
    };
    Ok((endpoint, dialer))
}

//! Connection flags shared by every command that talks to the store.
//!
//! Each flag has a `TARGETLEASE_…` environment fallback and is parsed once
//! into a [`StoreConfig`] (the URL's scheme picks Valkey or etcd); nothing
//! below the CLI reads the environment.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::output::io_reason;
use crate::operator::config_error::ConfigError;
use crate::store::etcd::{EtcdConfig, EtcdStore, is_etcd_url};
use crate::store::metrics::StoreMetrics;
use crate::store::valkey::{Durability, Secret, TlsFiles, ValkeyConfig, ValkeyStore, check_url};
use crate::store::{LeaseStore, StoreError};

/// The store URL when none is given.
pub const DEFAULT_STORE_URL: &str = "redis://127.0.0.1:6379";

/// The flag a bad URL is blamed on (it has two names).
const URL_FLAG: &str = "--store-url (--valkey-url)";
const DEFAULT_POOL_SIZE: usize = 1;
const DEFAULT_DURABLE_POOL_SIZE: usize = 16;
const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// How to reach the store.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Connection")]
pub struct ConnectionArgs {
    /// Store URL. Valkey: valkey:// or redis://, valkeys:// or rediss://
    /// (TLS), valkey-cluster:// (extra seeds as ?node=host:port&node=…),
    /// valkey-sentinel://; a `-cluster`/`-sentinel` scheme ending in `s` uses
    /// TLS. etcd: etcd://host:port[,host:port…], etcds://… (TLS).
    /// A user name may be in it (`valkey://user@host`), a password may not:
    /// use --password-file. [default: redis://127.0.0.1:6379]
    #[arg(
        long = "store-url",
        visible_alias = "valkey-url",
        env = "TARGETLEASE_STORE_URL",
        hide_env_values = true
    )]
    pub store_url: Option<String>,
    /// `TARGETLEASE_VALKEY_URL`, the variable of the `--valkey-url` spelling
    /// (an alias of --store-url): read when neither --store-url nor
    /// TARGETLEASE_STORE_URL is given.
    #[arg(
        long = "valkey-url-variable",
        hide = true,
        env = "TARGETLEASE_VALKEY_URL",
        hide_env_values = true
    )]
    pub valkey_url_variable: Option<String>,
    /// ACL user name (Valkey), or etcd user name.
    #[arg(long, env = "TARGETLEASE_USERNAME")]
    pub username: Option<String>,
    /// File holding the ACL (or etcd) password (never pass the password itself as a flag).
    #[arg(long, env = "TARGETLEASE_PASSWORD_FILE")]
    pub password_file: Option<PathBuf>,
    /// ACL user of the Sentinels (redis-sentinel:// only).
    #[arg(long, env = "TARGETLEASE_SENTINEL_USERNAME")]
    pub sentinel_username: Option<String>,
    /// File holding the Sentinels' password (redis-sentinel:// only). Without
    /// it the Sentinels get no AUTH; the data nodes' password is never sent to them.
    #[arg(long, env = "TARGETLEASE_SENTINEL_PASSWORD_FILE")]
    pub sentinel_password_file: Option<PathBuf>,
    /// Prefix of every key (Valkey's ACL key pattern is `<prefix>:*`; etcd
    /// keys are `<prefix>/…`).
    #[arg(long, env = "TARGETLEASE_KEY_PREFIX", default_value = "targetlease")]
    pub key_prefix: String,
    /// Deadline for one operation, e.g. 500ms or 2s.
    #[arg(long, env = "TARGETLEASE_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Deadline for connecting (TLS handshake included).
    #[arg(long, env = "TARGETLEASE_CONNECT_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
    /// Shared connections per server (1 to 128); each call goes to the least
    /// loaded one, another is opened when every open one is busy.
    #[arg(long, env = "TARGETLEASE_POOL_SIZE", default_value_t = DEFAULT_POOL_SIZE)]
    pub pool_size: usize,
    /// Connections per server for durable writes (with --durability), in
    /// use or kept warm for reuse (1 to 64).
    #[arg(long, env = "TARGETLEASE_DURABLE_POOL_SIZE", default_value_t = DEFAULT_DURABLE_POOL_SIZE)]
    pub durable_pool_size: usize,
    /// Requests queued or awaiting a reply on one connection; one more is
    /// refused at once, never sent (1 to 65536).
    #[arg(long, env = "TARGETLEASE_MAX_IN_FLIGHT", default_value_t = DEFAULT_MAX_IN_FLIGHT)]
    pub max_in_flight: usize,
    /// PEM CA bundle to trust for TLS instead of the system roots.
    #[arg(long, env = "TARGETLEASE_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate chain for mTLS.
    #[arg(long, env = "TARGETLEASE_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM client private key for mTLS.
    #[arg(long, env = "TARGETLEASE_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// Name to verify the server certificate against, instead of the URL host.
    #[arg(long, env = "TARGETLEASE_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
    /// PEM CA bundle to trust for the Sentinels (valkeys-sentinel:// only);
    /// default: --tls-ca-file. A CA of their own keeps a Sentinel's
    /// certificate from passing for a data node's, and the other way round.
    #[arg(long, env = "TARGETLEASE_SENTINEL_TLS_CA_FILE")]
    pub sentinel_tls_ca_file: Option<PathBuf>,
    /// PEM client certificate chain for mTLS to the Sentinels; default:
    /// --tls-cert-file.
    #[arg(
        long,
        env = "TARGETLEASE_SENTINEL_TLS_CERT_FILE",
        requires = "sentinel_tls_key_file"
    )]
    pub sentinel_tls_cert_file: Option<PathBuf>,
    /// PEM client private key for mTLS to the Sentinels; default: --tls-key-file.
    #[arg(
        long,
        env = "TARGETLEASE_SENTINEL_TLS_KEY_FILE",
        requires = "sentinel_tls_cert_file"
    )]
    pub sentinel_tls_key_file: Option<PathBuf>,
    /// Name to verify the Sentinels' certificates against, instead of their
    /// host in the URL; default: --tls-server-name.
    #[arg(long, env = "TARGETLEASE_SENTINEL_TLS_SERVER_NAME")]
    pub sentinel_tls_server_name: Option<String>,
    /// What must hold before an acquire is reported: none, replicas:N or aof
    /// (the primary's append-only file; it survives a power cut only with
    /// `appendfsync always` on the server, see docs/consistency.md).
    #[arg(long, env = "TARGETLEASE_DURABILITY", default_value = "none")]
    pub durability: Durability,
}

/// Where the store is, parsed: the URL's scheme decides the backend.
#[derive(Clone, Debug)]
pub enum StoreConfig {
    /// Valkey (standalone, Sentinel or Cluster).
    Valkey(ValkeyConfig),
    /// An etcd cluster.
    Etcd(EtcdConfig),
}

impl StoreConfig {
    /// The deadline of one operation.
    pub fn timeout(&self) -> Duration {
        match self {
            StoreConfig::Valkey(c) => c.timeout,
            StoreConfig::Etcd(c) => c.timeout,
        }
    }

    /// The backend's name, for messages.
    pub fn backend(&self) -> &'static str {
        match self {
            StoreConfig::Valkey(_) => "valkey",
            StoreConfig::Etcd(_) => "etcd",
        }
    }

    /// Connects the store (for Valkey: its scripts loaded).
    pub async fn connect(&self) -> Result<Arc<dyn LeaseStore>, StoreError> {
        Ok(match self {
            StoreConfig::Valkey(c) => Arc::new(ValkeyStore::connect(c).await?),
            StoreConfig::Etcd(c) => Arc::new(EtcdStore::connect(c).await?),
        })
    }
}

impl StoreConfig {
    /// Connects the store, with the metrics its backend offers (Valkey
    /// counts the connections it opens).
    pub async fn connect_with_metrics(
        &self,
    ) -> Result<(Arc<dyn LeaseStore>, StoreMetrics), StoreError> {
        match self {
            StoreConfig::Valkey(c) => {
                let valkey = ValkeyStore::connect(c).await?;
                let metrics =
                    StoreMetrics::default().with_connections_opened(valkey.connections_counter());
                Ok((Arc::new(valkey), metrics))
            }
            StoreConfig::Etcd(_) => Ok((self.connect().await?, StoreMetrics::default())),
        }
    }
}

impl ConnectionArgs {
    /// The store URL as given (flag, `TARGETLEASE_STORE_URL`, then
    /// `TARGETLEASE_VALKEY_URL`), or the default.
    pub fn url(&self) -> &str {
        self.store_url
            .as_deref()
            .or(self.valkey_url_variable.as_deref())
            .unwrap_or(DEFAULT_STORE_URL)
    }

    /// The typed config of whichever store the URL names; reads the
    /// password file. Settings only one backend has are refused for the
    /// other, here, before anything connects.
    pub fn to_store_config(&self) -> Result<StoreConfig, ConfigError> {
        if !is_etcd_url(self.url()) {
            return self.to_config().map(StoreConfig::Valkey);
        }
        crate::store::etcd::check_url(self.url()).map_err(|why| ConfigError::of(URL_FLAG, why))?;
        if self.sentinel_username.is_some()
            || self.sentinel_password_file.is_some()
            || self.sentinel_tls_ca_file.is_some()
            || self.sentinel_tls_cert_file.is_some()
            || self.sentinel_tls_server_name.is_some()
        {
            return Err(ConfigError::new(
                "Sentinel credentials and TLS settings are for redis-sentinel:// URLs, not etcd",
            ));
        }
        if self.durability != Durability::None {
            return Err(ConfigError::of(
                "--durability",
                "is for Valkey: etcd acknowledges a write once a quorum has it",
            ));
        }
        for (flag, given, default) in [
            ("--pool-size", self.pool_size, DEFAULT_POOL_SIZE),
            (
                "--durable-pool-size",
                self.durable_pool_size,
                DEFAULT_DURABLE_POOL_SIZE,
            ),
            ("--max-in-flight", self.max_in_flight, DEFAULT_MAX_IN_FLIGHT),
        ] {
            if given != default {
                return Err(ConfigError::of(
                    flag,
                    "is for Valkey: the etcd client multiplexes every call over one connection per member",
                ));
            }
        }
        self.check_common()?;
        let password = match &self.password_file {
            Some(path) => Some(read_secret(path, "password file")?),
            None => None,
        };
        Ok(StoreConfig::Etcd(EtcdConfig {
            url: self.url().to_owned(),
            username: self.username.clone(),
            password,
            key_prefix: self.key_prefix.clone(),
            timeout: self.timeout,
            connect_timeout: self.connect_timeout,
            tls: self.tls_files(),
        }))
    }

    fn tls_files(&self) -> TlsFiles {
        TlsFiles {
            ca_file: self.tls_ca_file.clone(),
            cert_file: self.tls_cert_file.clone(),
            key_file: self.tls_key_file.clone(),
            server_name: self.tls_server_name.clone(),
        }
    }

    fn check_common(&self) -> Result<(), ConfigError> {
        if self.timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(ConfigError::new(
                "--timeout and --connect-timeout must be positive",
            ));
        }
        Ok(())
    }

    /// The Valkey config; reads the password file. A URL that cannot be
    /// used (one with a password inside, above all) is refused here, before
    /// anything connects; so is an etcd URL (for the Valkey-only paths).
    pub fn to_config(&self) -> Result<ValkeyConfig, ConfigError> {
        if is_etcd_url(self.url()) {
            return Err(ConfigError::of(
                URL_FLAG,
                "this needs a Valkey URL, not etcd",
            ));
        }
        check_url(self.url()).map_err(|why| ConfigError::of(URL_FLAG, why))?;
        let password = match &self.password_file {
            Some(path) => Some(read_secret(path, "password file")?),
            None => None,
        };
        let sentinel_password = match &self.sentinel_password_file {
            Some(path) => Some(read_secret(path, "Sentinel password file")?),
            None => None,
        };
        self.check_common()?;
        if self.pool_size == 0 || self.pool_size > 128 {
            return Err(ConfigError::of("--pool-size", "must be between 1 and 128"));
        }
        if self.durable_pool_size == 0 || self.durable_pool_size > 64 {
            return Err(ConfigError::of(
                "--durable-pool-size",
                "must be between 1 and 64",
            ));
        }
        if self.max_in_flight == 0 || self.max_in_flight > 65536 {
            return Err(ConfigError::of(
                "--max-in-flight",
                "must be between 1 and 65536",
            ));
        }
        Ok(ValkeyConfig {
            url: self.url().to_owned(),
            username: self.username.clone(),
            password,
            sentinel_username: self.sentinel_username.clone(),
            sentinel_password,
            key_prefix: self.key_prefix.clone(),
            timeout: self.timeout,
            connect_timeout: self.connect_timeout,
            pool_size: self.pool_size,
            durable_pool_size: self.durable_pool_size,
            max_in_flight: self.max_in_flight,
            tls: self.tls_files(),
            sentinel_tls: TlsFiles {
                ca_file: self.sentinel_tls_ca_file.clone(),
                cert_file: self.sentinel_tls_cert_file.clone(),
                key_file: self.sentinel_tls_key_file.clone(),
                server_name: self.sentinel_tls_server_name.clone(),
            },
            durability: self.durability,
        })
    }

    /// These settings as the `TARGETLEASE_*` variables that give them to
    /// another `targetlease` (`run --export-connection`): file paths, never
    /// the secrets in them.
    pub fn exported(&self) -> Vec<(&'static str, String)> {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let duration = |d: Duration| humantime::format_duration(d).to_string();
        let vars = [
            ("TARGETLEASE_STORE_URL", Some(self.url().to_owned())),
            // The variable of the `--valkey-url` spelling, for a child that reads that one.
            ("TARGETLEASE_VALKEY_URL", Some(self.url().to_owned())),
            ("TARGETLEASE_USERNAME", self.username.clone()),
            ("TARGETLEASE_PASSWORD_FILE", path(&self.password_file)),
            (
                "TARGETLEASE_SENTINEL_USERNAME",
                self.sentinel_username.clone(),
            ),
            (
                "TARGETLEASE_SENTINEL_PASSWORD_FILE",
                path(&self.sentinel_password_file),
            ),
            ("TARGETLEASE_KEY_PREFIX", Some(self.key_prefix.clone())),
            ("TARGETLEASE_TIMEOUT", Some(duration(self.timeout))),
            (
                "TARGETLEASE_CONNECT_TIMEOUT",
                Some(duration(self.connect_timeout)),
            ),
            ("TARGETLEASE_POOL_SIZE", Some(self.pool_size.to_string())),
            (
                "TARGETLEASE_DURABLE_POOL_SIZE",
                Some(self.durable_pool_size.to_string()),
            ),
            (
                "TARGETLEASE_MAX_IN_FLIGHT",
                Some(self.max_in_flight.to_string()),
            ),
            ("TARGETLEASE_TLS_CA_FILE", path(&self.tls_ca_file)),
            ("TARGETLEASE_TLS_CERT_FILE", path(&self.tls_cert_file)),
            ("TARGETLEASE_TLS_KEY_FILE", path(&self.tls_key_file)),
            ("TARGETLEASE_TLS_SERVER_NAME", self.tls_server_name.clone()),
            (
                "TARGETLEASE_SENTINEL_TLS_CA_FILE",
                path(&self.sentinel_tls_ca_file),
            ),
            (
                "TARGETLEASE_SENTINEL_TLS_CERT_FILE",
                path(&self.sentinel_tls_cert_file),
            ),
            (
                "TARGETLEASE_SENTINEL_TLS_KEY_FILE",
                path(&self.sentinel_tls_key_file),
            ),
            (
                "TARGETLEASE_SENTINEL_TLS_SERVER_NAME",
                self.sentinel_tls_server_name.clone(),
            ),
            ("TARGETLEASE_DURABILITY", Some(self.durability.to_string())),
        ];
        vars.into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect()
    }
}

/// Reads a secret file; one trailing newline is not part of the secret.
/// `what` names the kind of file in the error (`password file`).
pub fn read_secret(path: &std::path::Path, what: &str) -> Result<Secret, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new(format!(
            "cannot read {what} {}: {}",
            path.display(),
            io_reason(&e)
        ))
    })?;
    let value = text.strip_suffix('\n').unwrap_or(&text);
    let value = value.strip_suffix('\r').unwrap_or(value);
    Ok(Secret::new(value))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        conn: ConnectionArgs,
    }

    #[test]
    fn sentinel_credentials_are_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let (data, sentinel) = (dir.path().join("data"), dir.path().join("sentinel"));
        std::fs::write(&data, "data-pw\n").unwrap();
        std::fs::write(&sentinel, "sentinel-pw\n").unwrap();
        let cli = Cli::parse_from([
            "t",
            "--password-file",
            data.to_str().unwrap(),
            "--sentinel-username",
            "watcher",
            "--sentinel-password-file",
            sentinel.to_str().unwrap(),
        ]);
        let cfg = cli.conn.to_config().unwrap();
        assert_eq!(cfg.password, Some(Secret::new("data-pw")));
        assert_eq!(cfg.sentinel_username.as_deref(), Some("watcher"));
        assert_eq!(cfg.sentinel_password, Some(Secret::new("sentinel-pw")));
        // By default the Sentinels get no credentials at all.
        let cfg = Cli::parse_from(["t", "--password-file", data.to_str().unwrap()])
            .conn
            .to_config()
            .unwrap();
        assert_eq!((cfg.sentinel_username, cfg.sentinel_password), (None, None));
    }

    #[test]
    fn valkey_connection_settings_are_refused_for_etcd() {
        let etcd = ["t", "--store-url", "etcd://127.0.0.1:2379"];
        assert!(Cli::parse_from(etcd).conn.to_store_config().is_ok());
        for (flag, value) in [
            ("--pool-size", "4"),
            ("--durable-pool-size", "2"),
            ("--max-in-flight", "10"),
            ("--durability", "aof"),
        ] {
            let cli = Cli::parse_from(etcd.into_iter().chain([flag, value]));
            let err = cli.conn.to_store_config().unwrap_err().to_string();
            assert!(
                err.contains(flag) && err.contains("Valkey"),
                "{flag}: {err}"
            );
            // The same setting is taken with a Valkey URL.
            let valkey = ["t", "--store-url", "redis://127.0.0.1:6379", flag, value];
            assert!(
                Cli::parse_from(valkey).conn.to_store_config().is_ok(),
                "{flag}"
            );
        }
    }
}

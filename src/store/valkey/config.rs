//! How to reach Valkey: one typed config shared by the CLI and the operator.

use std::fmt;
use std::time::Duration;

pub use super::wire::dial::Secret;
pub use super::wire::tls::TlsFiles;

/// Connection settings for [`super::ValkeyStore`]. Its `Debug` shows the
/// URL with any password in it redacted.
#[derive(Clone)]
pub struct ValkeyConfig {
    /// `redis://`, `rediss://`, `redis-cluster://`, `rediss-cluster://` or `redis-sentinel://`.
    pub url: String,
    /// ACL user name (the URL's user is used when absent).
    pub username: Option<String>,
    /// ACL password, read from a file by the caller.
    pub password: Option<Secret>,
    /// ACL user of the Sentinels (`redis-sentinel://` only).
    pub sentinel_username: Option<String>,
    /// Password of the Sentinels (`redis-sentinel://` only). None: the
    /// Sentinels get no `AUTH`. The data nodes' credentials are never sent
    /// to a Sentinel.
    pub sentinel_password: Option<Secret>,
    /// Prefix of every key; the ACL key pattern is `<prefix>:*`.
    pub key_prefix: String,
    /// Deadline for one operation, reply included.
    pub timeout: Duration,
    /// Deadline for establishing a connection, TLS handshake included.
    pub connect_timeout: Duration,
    /// Shared connections per server (each pipelines many calls; a call
    /// goes to the least loaded, another is opened when all are busy).
    pub pool_size: usize,
    /// Connections per server for durable writes (script, then `WAIT` or
    /// `WAITAOF` on the same connection), in use or kept warm; 1 to 64.
    pub durable_pool_size: usize,
    /// Requests queued or awaiting a reply on one connection; one more is
    /// refused at once (`backend_unavailable`, never sent).
    pub max_in_flight: usize,
    /// TLS material; used with `rediss://` and `rediss-cluster://` URLs.
    pub tls: TlsFiles,
    /// TLS material for the Sentinels (`valkeys-sentinel://` only): each
    /// setting left unset is the data nodes' one in [`Self::tls`] (the
    /// certificate and key as a pair).
    pub sentinel_tls: TlsFiles,
    /// What must hold before an acquire is reported as held.
    pub durability: Durability,
}

impl fmt::Debug for ValkeyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured, so a new field cannot be left out unseen.
        let Self {
            url,
            username,
            password,
            sentinel_username,
            sentinel_password,
            key_prefix,
            timeout,
            connect_timeout,
            pool_size,
            durable_pool_size,
            max_in_flight,
            tls,
            sentinel_tls,
            durability,
        } = self;
        f.debug_struct("ValkeyConfig")
            .field("url", &redact_url(url))
            .field("username", username)
            .field("password", password)
            .field("sentinel_username", sentinel_username)
            .field("sentinel_password", sentinel_password)
            .field("key_prefix", key_prefix)
            .field("timeout", timeout)
            .field("connect_timeout", connect_timeout)
            .field("pool_size", pool_size)
            .field("durable_pool_size", durable_pool_size)
            .field("max_in_flight", max_in_flight)
            .field("tls", tls)
            .field("sentinel_tls", sentinel_tls)
            .field("durability", durability)
            .finish()
    }
}

/// How durable an acquired lease must be before it is reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Acknowledged by the primary's memory (the default; lost on failover).
    #[default]
    None,
    /// Acknowledged by at least N replicas (`WAIT`).
    Replicas(u32),
    /// Written to the primary's append-only file (`WAITAOF`). Under
    /// `appendfsync everysec` Valkey may answer before the write is fsynced,
    /// so only `appendfsync always` makes it survive a power cut.
    Aof,
}

impl std::str::FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Durability::None),
            "aof" => Ok(Durability::Aof),
            other => match other.strip_prefix("replicas:").map(str::parse::<u32>) {
                Some(Ok(n)) if n > 0 => Ok(Durability::Replicas(n)),
                _ => Err(format!(
                    "durability must be none, aof or replicas:N (N >= 1), not {other:?}"
                )),
            },
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Durability::None => f.write_str("none"),
            Durability::Replicas(n) => write!(f, "replicas:{n}"),
            Durability::Aof => f.write_str("aof"),
        }
    }
}

impl Default for ValkeyConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".into(),
            username: None,
            password: None,
            sentinel_username: None,
            sentinel_password: None,
            key_prefix: "targetlease".into(),
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            pool_size: 1,
            durable_pool_size: 16,
            max_in_flight: 1024,
            tls: TlsFiles::default(),
            sentinel_tls: TlsFiles::default(),
            durability: Durability::None,
        }
    }
}

/// The URL with any embedded password replaced, safe to log: the password,
/// a `node=` value with a user or password in it, and every query key the
/// client does not know (key and value: either may be a secret).
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("redacted"));
            }
            let shown =
                |k: &str, v: &str| k == "sentinelServiceName" || (k == "node" && !v.contains('@'));
            if u.query_pairs().any(|(k, v)| !shown(&k, &v)) {
                let pairs: Vec<(String, String)> = u
                    .query_pairs()
                    .map(|(k, v)| match (shown(&k, &v), k.as_ref()) {
                        (true, _) => (k.into_owned(), v.into_owned()),
                        (false, "node") => ("node".into(), "redacted".into()),
                        (false, _) => ("redacted".into(), "redacted".into()),
                    })
                    .collect();
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            u.to_string()
        }
        Err(_) => "<unparsable url>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_password() {
        let cfg = ValkeyConfig {
            password: Some(Secret::new("hunter2")),
            ..ValkeyConfig::default()
        };
        assert!(!format!("{cfg:?}").contains("hunter2"));
    }

    #[test]
    fn debug_never_shows_a_password_in_the_url() {
        for url in [
            "redis://u:hunter2@h:1/",
            "rediss-cluster://u:hunter2@h:1?node=h:2",
            "redis-sentinel://:hunter2@h:26379/0?sentinelServiceName=m",
            "redis://u:hunter2@h:1,h:2/",
            "redis-cluster://h:1?node=u:hunter2@h:2&node=h:3",
            "redis-cluster://h:1?node=%3Ahunter2%40h%3A2",
            "redis://h:1?password=hunter2",
            "redis://h:1?hunter2",
        ] {
            let cfg = ValkeyConfig {
                url: url.into(),
                ..ValkeyConfig::default()
            };
            let shown = format!("{cfg:?}");
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("ValkeyConfig { url: "), "{shown}");
        }
        assert_eq!(
            redact_url("redis://u:hunter2@h:1/"),
            "redis://u:redacted@h:1/"
        );
        // What names no secret is shown as written.
        let plain = "redis-sentinel://s:1?sentinelServiceName=m&node=s2:2";
        assert_eq!(redact_url(plain), plain);
        assert_eq!(
            redact_url("redis-cluster://h:1?node=u:hunter2@h:2&node=h:3"),
            "redis-cluster://h:1?node=redacted&node=h%3A3"
        );
    }
}

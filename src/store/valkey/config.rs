//! How to reach Valkey: one typed config shared by the CLI and the operator.

use std::fmt;
use std::time::Duration;

/// A secret string whose `Debug` and `Display` never show the value.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Connection settings for [`super::ValkeyStore`].
#[derive(Clone, Debug)]
pub struct ValkeyConfig {
    /// `redis://`, `rediss://`, `redis-cluster://`, `rediss-cluster://` or `redis-sentinel://`.
    pub url: String,
    /// ACL user name (the URL's user is used when absent).
    pub username: Option<String>,
    /// ACL password, read from a file by the caller.
    pub password: Option<Secret>,
    /// Prefix of every key; the ACL key pattern is `<prefix>:*`.
    pub key_prefix: String,
    /// Deadline for one operation, reply included.
    pub timeout: Duration,
    /// Deadline for establishing a connection, TLS handshake included.
    pub connect_timeout: Duration,
    /// Number of pooled connections.
    pub pool_size: usize,
}

impl Default for ValkeyConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".into(),
            username: None,
            password: None,
            key_prefix: "targetlease".into(),
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            pool_size: 1,
        }
    }
}

/// The URL with any embedded password replaced, safe to log.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("redacted"));
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
        assert_eq!(
            redact_url("redis://u:hunter2@h:1/"),
            "redis://u:redacted@h:1/"
        );
    }
}

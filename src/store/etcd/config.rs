//! Connection settings for [`super::EtcdStore`] and its URL:
//! `etcd://host:port[,host:port…]`, or `etcds://…` for TLS.

use std::fmt;
use std::time::Duration;

use crate::store::valkey::{Secret, TlsFiles};

/// The port etcd serves clients on when a URL names none.
pub const DEFAULT_PORT: u16 = 2379;

/// Connection settings for [`super::EtcdStore`].
#[derive(Clone)]
pub struct EtcdConfig {
    /// `etcd://host:port[,host:port…]` or `etcds://…` (TLS).
    pub url: String,
    /// etcd user name (the URL's user is used when absent).
    pub username: Option<String>,
    /// etcd password, read from a file by the caller.
    pub password: Option<Secret>,
    /// Prefix of every key; an etcd role's key range is `<prefix>/` with `--prefix`.
    pub key_prefix: String,
    /// Deadline for one operation, every round trip of it included.
    pub timeout: Duration,
    /// Deadline for connecting and the first probe.
    pub connect_timeout: Duration,
    /// TLS material; used with `etcds://` URLs.
    pub tls: TlsFiles,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        Self {
            url: format!("etcd://127.0.0.1:{DEFAULT_PORT}"),
            username: None,
            password: None,
            key_prefix: "targetlease".into(),
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            tls: TlsFiles::default(),
        }
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured, so a new field cannot be left out unseen.
        let Self {
            url,
            username,
            password,
            key_prefix,
            timeout,
            connect_timeout,
            tls,
        } = self;
        f.debug_struct("EtcdConfig")
            .field("url", &redacted(url))
            .field("username", username)
            .field("password", password)
            .field("key_prefix", key_prefix)
            .field("timeout", timeout)
            .field("connect_timeout", connect_timeout)
            .field("tls", tls)
            .finish()
    }
}

/// `url` safe to show: a password in it (refused when parsed, but a
/// config may be built by hand) replaced.
fn redacted(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((user, hosts)) if user.contains(':') => {
                let name = user.split(':').next().unwrap_or_default();
                format!("{scheme}://{name}:redacted@{hosts}")
            }
            _ => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// A parsed `etcd://` or `etcds://` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoints {
    /// `host:port` of each member, in the URL's order.
    pub members: Vec<String>,
    /// `etcds://`: TLS to every member.
    pub tls: bool,
    /// The user named in the URL (`etcd://user@host:port`).
    pub username: Option<String>,
}

impl Endpoints {
    /// The members as the gRPC client takes them (`http://…` or `https://…`).
    pub fn uris(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.members
            .iter()
            .map(|m| format!("{scheme}://{m}"))
            .collect()
    }
}

/// True when `url` names etcd (`etcd://` or `etcds://`), whatever else it holds.
pub fn is_etcd_url(url: &str) -> bool {
    let lower = url.trim_start().to_ascii_lowercase();
    lower.starts_with("etcd://") || lower.starts_with("etcds://")
}

/// Parses an etcd URL. The reason never quotes the URL (it could hold a password).
pub fn parse(url: &str) -> Result<Endpoints, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or("the URL has no scheme (etcd:// or etcds://)")?;
    let tls = match scheme.to_ascii_lowercase().as_str() {
        "etcd" => false,
        "etcds" => true,
        _ => return Err("the scheme is not etcd:// or etcds://".into()),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#']) {
        return Err(
            "an etcd URL has no path, query or fragment: etcd://host:port[,host:port…]".into(),
        );
    }
    let (user, hosts) = match rest.rsplit_once('@') {
        Some((user, hosts)) => (Some(user), hosts),
        None => (None, rest),
    };
    let username = match user {
        Some(u) if u.contains(':') => {
            return Err(
                "a password inside the URL is refused (it would show in process lists and logs): \
                 use --password-file"
                    .into(),
            );
        }
        Some("") => return Err("the URL's user name is empty".into()),
        Some(u) => Some(u.to_owned()),
        None => None,
    };
    let members = hosts
        .split(',')
        .map(member)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Endpoints {
        members,
        tls,
        username,
    })
}

/// `host:port` (port defaulted), checked.
fn member(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("a member of the URL is empty (etcd://host:port[,host:port…])".into());
    }
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let (addr, after) = v6.split_once(']').ok_or("an IPv6 address lacks its ']'")?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("junk after an IPv6 address")?),
        };
        (format!("[{addr}]"), port)
    } else {
        match text.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (text.to_owned(), None),
        }
    };
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("a member of the URL has no usable host".into());
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or("a member's port is not a number from 1 to 65535")?,
    };
    Ok(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_schemes_and_users_parse() {
        let e = parse("etcd://10.0.0.1:2379,10.0.0.2:2380,[::1]:2381,etcd-0").unwrap();
        assert_eq!(
            e.members,
            [
                "10.0.0.1:2379",
                "10.0.0.2:2380",
                "[::1]:2381",
                "etcd-0:2379"
            ]
        );
        assert!(!e.tls);
        assert_eq!(e.uris()[0], "http://10.0.0.1:2379");
        let e = parse("ETCDS://app@etcd.example:2379/").unwrap();
        assert!(e.tls);
        assert_eq!(e.username.as_deref(), Some("app"));
        assert_eq!(e.uris(), ["https://etcd.example:2379"]);
        assert!(is_etcd_url("etcds://x") && is_etcd_url("etcd://x") && !is_etcd_url("redis://x"));
    }

    /// A config built by hand with a password in its URL (parsing refuses
    /// one) does not show it.
    #[test]
    fn debug_never_shows_a_password_in_the_url() {
        for url in ["etcd://u:s3cret@h:1", "etcds://u:p@s3cret@h:1,h:2"] {
            let cfg = EtcdConfig {
                url: url.into(),
                ..EtcdConfig::default()
            };
            let shown = format!("{cfg:?}");
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains("u:redacted@h:1"), "{shown}");
        }
        let plain = "etcd://app@h:1,h:2";
        assert_eq!(redacted(plain), plain);
    }

    #[test]
    fn bad_urls_are_refused_without_quoting_them() {
        for bad in [
            "redis://h:1",
            "etcd://",
            "etcd://h:1,",
            "etcd://h:0",
            "etcd://h:99999",
            "etcd://h:1/db",
            "etcd://h:1?x=y",
            "etcd://u:s3cret@h:1",
            "etcd://@h:1",
            "etcd://[::1",
            "h:1",
        ] {
            let why = parse(bad).expect_err(bad);
            assert!(!why.contains("s3cret"), "{bad}: {why}");
        }
        assert!(
            parse("etcd://u:s3cret@h:1")
                .unwrap_err()
                .contains("--password-file")
        );
    }
}

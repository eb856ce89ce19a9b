//! What a `--valkey-url` names: one server, a Sentinel-managed primary, or a
//! Cluster, plus TLS and the ACL user. Parsed once, before anything connects.
//!
//! ```text
//! redis[s]://[user@]host[:6379][/db]
//! redis[s]-cluster://[user@]host:port[?node=host:port&node=…]
//! redis[s]-sentinel://[user@]host[:26379][/db]?sentinelServiceName=NAME[&node=host:port…]
//! ```
//!
//! A password inside the URL is refused: a URL travels in flags and
//! environment variables, which the process table, shell histories and
//! manifests show to others. The password comes from a file instead
//! (`--password-file`). A user name alone is accepted: it is not a secret.

use std::fmt;

/// A `host:port`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Addr {
    /// Host name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl Addr {
    /// Parses `host:port` (IPv6 hosts in brackets).
    pub fn parse(s: &str) -> Option<Addr> {
        let (host, port) = s.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return None;
        }
        Some(Addr {
            host: host.to_owned(),
            port: port.parse().ok()?,
        })
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// How the servers are arranged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Topology {
    /// One server.
    Standalone(Addr),
    /// Sentinels that name the primary of `service`.
    Sentinel {
        /// Sentinels to ask, in order.
        sentinels: Vec<Addr>,
        /// The monitored primary's name.
        service: String,
    },
    /// Seed nodes of a Valkey Cluster.
    Cluster(Vec<Addr>),
}

/// Everything the URL says. It holds no secret: a URL with a password is
/// refused by [`parse`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Where the servers are.
    pub topology: Topology,
    /// `rediss…` schemes.
    pub tls: bool,
    /// ACL user from the URL.
    pub username: Option<String>,
    /// Database to `SELECT` (standalone and Sentinel only).
    pub db: Option<u32>,
}

/// Why a URL with a password is refused, and what to do instead.
pub const PASSWORD_IN_URL: &str = "a password inside the URL is refused (the process table, \
     logs and manifests would show it): remove it from the URL and put it in a file named by \
     --password-file (TARGETLEASE_PASSWORD_FILE; with the Helm chart, store.auth.existingSecret)";

/// Parses a Valkey URL; the error says why, without echoing a password.
pub fn parse(url: &str) -> Result<Endpoint, String> {
    let (scheme, _) = url.split_once("://").ok_or("no scheme")?;
    // Valkey's own clients document valkey:// and valkeys://; redis:// and
    // rediss:// mean the same.
    let (tls, kind) = match scheme {
        "redis" | "valkey" => (false, ""),
        "rediss" | "valkeys" => (true, ""),
        "redis-cluster" | "valkey-cluster" => (false, "cluster"),
        "rediss-cluster" | "valkeys-cluster" => (true, "cluster"),
        "redis-sentinel" | "valkey-sentinel" => (false, "sentinel"),
        "rediss-sentinel" | "valkeys-sentinel" => (true, "sentinel"),
        other => {
            return Err(format!(
                "unsupported scheme {other:?}; use valkey (or redis), valkeys (or rediss, TLS), \
                 valkey-cluster, valkeys-cluster, valkey-sentinel or valkeys-sentinel"
            ));
        }
    };
    let parsed = url::Url::parse(url).map_err(|e| format!("unparsable ({e})"))?;
    // Before anything else is read from it: no later message may quote it.
    if parsed.password().is_some() {
        return Err(PASSWORD_IN_URL.into());
    }
    let host = parsed
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or("no host")?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let default_port = if kind == "sentinel" { 26379 } else { 6379 };
    let port = parsed.port().unwrap_or(default_port);
    let first = Addr { host, port };
    let decode = |s: &str| {
        percent_decode(s)
            .ok_or_else(|| "the user name is not valid percent-encoded UTF-8".to_owned())
    };
    let username = Some(decode(parsed.username())?).filter(|u| !u.is_empty());
    let mut nodes = Vec::new();
    let mut service = None;
    for (k, v) in parsed.query_pairs() {
        match (k.as_ref(), kind) {
            ("node", "cluster" | "sentinel") => nodes.push(node(&v, nodes.len() + 1)?),
            ("node", _) => {
                return Err(
                    "the query key node is for more Cluster seeds or more Sentinels \
                            (valkey-cluster://, valkey-sentinel://); a valkey:// URL names one \
                            server"
                        .into(),
                );
            }
            ("sentinelServiceName", "sentinel") if service.is_some() => {
                return Err("the query key sentinelServiceName is given twice".into());
            }
            ("sentinelServiceName", "sentinel") if v.is_empty() => {
                return Err("the query key sentinelServiceName needs a name".into());
            }
            ("sentinelServiceName", "sentinel") => service = Some(v.into_owned()),
            ("sentinelServiceName", _) => {
                return Err("the query key sentinelServiceName is for Sentinel URLs \
                            (valkey-sentinel://) only"
                    .into());
            }
            (other, _) => return Err(unknown_key(other)),
        }
    }
    let db = match parsed.path().trim_matches('/') {
        "" => None,
        d => Some(
            d.parse::<u32>()
                .map_err(|_| format!("database {d:?} is not a number"))?,
        ),
    };
    let topology = match kind {
        "cluster" => Topology::Cluster(std::iter::once(first).chain(nodes).collect()),
        "sentinel" => Topology::Sentinel {
            sentinels: std::iter::once(first).chain(nodes).collect(),
            service: service.ok_or("a sentinel URL needs ?sentinelServiceName=NAME")?,
        },
        _ => Topology::Standalone(first),
    };
    let db = if matches!(topology, Topology::Cluster(_)) {
        None
    } else {
        db
    };
    Ok(Endpoint {
        topology,
        tls,
        username,
        db,
    })
}

/// The `which`th `node=` value, a plain `host:port`. The reason never quotes
/// the value: one written as `user:password@host:port` holds a password.
fn node(value: &str, which: usize) -> Result<Addr, String> {
    if value.contains('@') {
        return Err(format!(
            "node= value number {which} holds a user or a password (it has an `@`), which is \
             refused: give it as host:port; the URL's user and --password-file apply to every \
             node"
        ));
    }
    let host_char = |c: char| c.is_ascii_alphanumeric() || ".-_:%".contains(c);
    Addr::parse(value)
        .filter(|a| a.host.chars().all(host_char))
        .ok_or_else(|| {
            format!(
                "node= value number {which} is not host:port (a host name or IP address and a port)"
            )
        })
}

/// Why an unknown query key is refused. The key is named when it is a plain
/// word (a query such as `?s3cret` is not quoted back).
fn unknown_key(key: &str) -> String {
    let word = !key.is_empty()
        && key.len() <= 40
        && key.starts_with(|c: char| c.is_ascii_alphabetic())
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let named = if word {
        format!("the query key {key:?} is unknown")
    } else {
        "a query key that is not a plain word is unknown".to_owned()
    };
    let lower = key.to_ascii_lowercase();
    let hint = if ["pass", "auth", "secret", "token", "cred"]
        .iter()
        .any(|w| lower.contains(w))
    {
        format!("; {PASSWORD_IN_URL}")
    } else {
        String::new()
    };
    format!(
        "{named}: a URL takes only node (more Cluster seeds or Sentinels) and \
         sentinelServiceName (Sentinel){hint}"
    )
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(s.get(i + 1..i + 3)?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(h: &str, p: u16) -> Addr {
        Addr {
            host: h.into(),
            port: p,
        }
    }

    #[test]
    fn standalone_with_a_user_and_database() {
        let e = parse("rediss://u%40x@db.example:6380/2").unwrap();
        assert_eq!(e.topology, Topology::Standalone(addr("db.example", 6380)));
        assert!(e.tls);
        assert_eq!(e.username.as_deref(), Some("u@x"));
        assert_eq!(e.db, Some(2));
        let e = parse("redis://127.0.0.1").unwrap();
        assert_eq!(e.topology, Topology::Standalone(addr("127.0.0.1", 6379)));
        assert_eq!((e.tls, e.db, e.username), (false, None, None));
        let e = parse("redis://h:80").unwrap();
        assert_eq!(e.topology, Topology::Standalone(addr("h", 80)));
    }

    #[test]
    fn cluster_and_sentinel() {
        let e = parse("redis-cluster://a:7000?node=b:7001&node=[::1]:7002").unwrap();
        assert_eq!(
            e.topology,
            Topology::Cluster(vec![addr("a", 7000), addr("b", 7001), addr("::1", 7002)])
        );
        let e = parse("redis-sentinel://s1?sentinelServiceName=mymaster&node=s2:26380").unwrap();
        assert_eq!(
            e.topology,
            Topology::Sentinel {
                sentinels: vec![addr("s1", 26379), addr("s2", 26380)],
                service: "mymaster".into()
            }
        );
        assert!(parse("redis-sentinel://s1").is_err());
    }

    #[test]
    fn valkey_schemes_mean_what_the_redis_ones_do() {
        for (valkey, redis) in [
            ("valkey://u@h:7/1", "redis://u@h:7/1"),
            ("valkeys://h", "rediss://h"),
            (
                "valkey-cluster://a:1?node=b:2",
                "redis-cluster://a:1?node=b:2",
            ),
            ("valkeys-cluster://a:1", "rediss-cluster://a:1"),
            (
                "valkey-sentinel://s?sentinelServiceName=m",
                "redis-sentinel://s?sentinelServiceName=m",
            ),
            (
                "valkeys-sentinel://s?sentinelServiceName=m",
                "rediss-sentinel://s?sentinelServiceName=m",
            ),
        ] {
            assert_eq!(parse(valkey).unwrap(), parse(redis).unwrap(), "{valkey}");
        }
        assert!(parse("valkeyss://h").is_err());
    }

    #[test]
    fn bad_urls_are_refused() {
        assert!(parse("http://x").is_err());
        assert!(parse("no-scheme").is_err());
        assert!(parse("redis://h/notanumber").is_err());
        assert!(parse("redis-cluster://a?node=b").is_err());
    }

    /// A `node=` value with a user or password, and every query key the
    /// client does not know, are refused; the reason names the key and
    /// quotes neither the value nor the URL.
    #[test]
    fn a_password_in_a_node_and_unknown_query_keys_are_refused_without_showing_them() {
        for url in [
            "redis-cluster://a:7000?node=u:s3cret-canary@b:7001",
            "redis-cluster://a:7000?node=b:7001&node=:s3cret-canary@c:7002",
            "valkeys-cluster://a:7000?node=u%3As3cret-canary%40b%3A7001",
            "redis-sentinel://s1?sentinelServiceName=m&node=u:s3cret-canary@s2:26379",
        ] {
            let why = parse(url).expect_err(url);
            assert!(!why.contains("s3cret"), "{url}: {why}");
            assert!(
                why.contains("node=") && why.contains("password"),
                "{url}: {why}"
            );
            assert!(why.contains("--password-file"), "{url}: {why}");
        }
        let why = parse("redis-cluster://a:7000?node=b:7001&node=c/s3cret-canary:1").unwrap_err();
        assert!(
            why.contains("number 2") && why.contains("not host:port"),
            "{why}"
        );
        assert!(!why.contains("s3cret"), "{why}");

        for (url, key) in [
            ("redis://h:1?password=s3cret-canary", "password"),
            (
                "redis-cluster://a:1?node=b:2&sentinelPassword=s3cret-canary",
                "sentinelPassword",
            ),
            ("redis://h:1?protocol=3", "protocol"),
            (
                "redis-sentinel://s?sentinelServiceName=m&sentinelservicename=n",
                "sentinelservicename",
            ),
            ("redis://h:1?tls=true", "tls"),
        ] {
            let why = parse(url).expect_err(url);
            assert!(why.contains(&format!("{key:?}")), "{url}: {why}");
            assert!(why.contains("is unknown"), "{url}: {why}");
            assert!(!why.contains("s3cret"), "{url}: {why}");
        }
        let why = parse("redis://h:1?password=x").unwrap_err();
        assert!(why.contains("--password-file"), "{why}");
        let why = parse("redis://h:1?s3cret-canary!").unwrap_err();
        assert!(
            !why.contains("s3cret") && why.contains("is unknown"),
            "{why}"
        );

        // Known keys where they do not apply, or twice.
        for (url, words) in [
            ("redis://a:1?node=b:2", "node is for"),
            (
                "redis-cluster://a:1?sentinelServiceName=m",
                "for Sentinel URLs",
            ),
            (
                "redis-sentinel://s?sentinelServiceName=m&sentinelServiceName=n",
                "twice",
            ),
            ("redis-sentinel://s?sentinelServiceName=", "needs a name"),
        ] {
            let why = parse(url).expect_err(url);
            assert!(why.contains(words), "{url}: {why}");
        }
    }

    /// A password in any scheme's URL, with or without a user, percent-encoded
    /// or not, is refused with a message that names `--password-file` and
    /// quotes nothing of the URL; an empty password shows no secret and is
    /// not refused, nor is a user name alone.
    #[test]
    fn a_password_inside_the_url_is_refused_without_showing_it() {
        for url in [
            "redis://:s3cret-canary@h:1",
            "redis://u:s3cret-canary@h:1/0",
            "valkeys://u:s3cret%2Dcanary@h",
            "rediss-cluster://u:s3cret-canary@h:1?node=h:2",
            "valkey-cluster://:s3cret-canary@h:1",
            "redis-sentinel://u:s3cret-canary@h?sentinelServiceName=m",
            "valkeys-sentinel://:s3cret-canary@h:26379/0?sentinelServiceName=m&node=x:1",
            // Refused before the rest is read: a later mistake does not
            // make the message quote the URL.
            "redis://u:s3cret-canary@h:1/notanumber",
            "redis-cluster://u:s3cret-canary@h:1?node=s3cret-canary",
        ] {
            let why = parse(url).expect_err(url);
            assert_eq!(why, PASSWORD_IN_URL, "{url}");
            assert!(!why.contains("s3cret"), "{url}: {why}");
            assert!(why.contains("--password-file"), "{why}");
        }
        for url in ["redis://u@h:1", "redis://u:@h:1", "redis://:@h:1"] {
            let e = parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(e.topology, Topology::Standalone(addr("h", 1)), "{url}");
        }
    }
}

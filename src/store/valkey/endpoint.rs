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
     --password-file (TARGETLEASE_PASSWORD_FILE; with the Helm chart, valkey.auth.existingSecret)";

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
        match k.as_ref() {
            "node" => nodes.push(Addr::parse(&v).ok_or(format!("node {v:?} is not host:port"))?),
            "sentinelServiceName" => service = Some(v.into_owned()),
            _ => {}
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

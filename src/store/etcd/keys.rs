//! Key layout. Each kind of key has its own subtree, so that listing the
//! lease records is one range read that touches nothing else:
//!
//! ```text
//! <prefix>/fence/<ns>/<target>                      fencing counter, a decimal (no etcd lease, never deleted)
//! <prefix>/lease/<ns>/<target>                      the lease record, on the acquisition's own etcd lease
//! <prefix>/q/<ns>/<target>/<op>/<scope>/<req hash>  request cache entry, on a shared time-bucket lease
//! <prefix>/c/<ns>/<target>/<key>                    the last fenced commit under <key> (no etcd lease)
//! ```
//!
//! Namespace, target, scope (the owner, or empty) and commit key are escaped
//! so that `%` and `/` never appear raw: `("a/b", "c")` and `("a", "b/c")`
//! cannot collide, and escaping keeps prefixes (a target prefix escapes to a
//! key prefix). The request id is stored only as a hash (it is a capability).

use crate::store::{StoreError, Target};

/// Builds the keys of every target under one prefix.
#[derive(Clone, Debug)]
pub struct KeySpace {
    prefix: String,
}

impl KeySpace {
    /// A key space under `prefix`: 1 to 128 bytes, no control characters.
    pub fn new(prefix: &str) -> Result<Self, StoreError> {
        if prefix.is_empty() || prefix.len() > 128 || prefix.chars().any(char::is_control) {
            return Err(StoreError::Invalid(
                "key prefix must be 1 to 128 bytes without control characters".into(),
            ));
        }
        Ok(Self {
            prefix: prefix.to_owned(),
        })
    }

    /// The key prefix as configured.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn under(&self, kind: &str, t: &Target) -> String {
        format!(
            "{}/{kind}/{}/{}",
            self.prefix,
            escape(&t.namespace),
            escape(&t.name)
        )
    }

    /// The target's fencing counter.
    pub fn fence(&self, t: &Target) -> String {
        self.under("fence", t)
    }

    /// The target's lease record.
    pub fn lease(&self, t: &Target) -> String {
        self.under("lease", t)
    }

    /// The request cache entry of one operation, scope (owner or "") and request id.
    pub fn request(&self, t: &Target, op: &str, scope: &str, request_id: &str) -> String {
        format!(
            "{}/{op}/{}/{}",
            self.under("q", t),
            escape(scope),
            request_hash(request_id)
        )
    }

    /// The fenced commit of `key` under the target.
    pub fn commit(&self, t: &Target, key: &str) -> String {
        format!("{}/{}", self.under("c", t), escape(key))
    }

    /// The key prefix of every `kind` ("lease" or "fence") key of
    /// `namespace` (every namespace when `None`) whose target starts with
    /// `target_prefix` (only when a namespace is given; otherwise the caller
    /// filters).
    pub fn range_prefix(&self, kind: &str, namespace: Option<&str>, target_prefix: &str) -> String {
        match namespace {
            Some(ns) => format!(
                "{}/{kind}/{}/{}",
                self.prefix,
                escape(ns),
                escape(target_prefix)
            ),
            None => format!("{}/{kind}/", self.prefix),
        }
    }

    /// The target a `kind` key belongs to; `None` for any key
    /// [`KeySpace::under`] cannot have built.
    pub fn target_of(&self, kind: &str, key: &[u8]) -> Option<Target> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix('/')?
            .strip_prefix(kind)?
            .strip_prefix('/')?;
        let (ns, name) = rest.split_once('/')?;
        let target = Target::new(unescape(ns)?, unescape(name)?);
        (self.under(kind, &target) == key).then_some(target)
    }

    /// Where the target's state lies: its counter and lease record (exact
    /// keys), then the prefixes of its request cache entries and commits.
    pub fn target_keys(&self, t: &Target) -> [String; 4] {
        [
            self.fence(t),
            self.lease(t),
            format!("{}/", self.under("q", t)),
            format!("{}/", self.under("c", t)),
        ]
    }

    /// A key no operation writes, read by the health probe.
    pub fn health(&self) -> String {
        format!("{}/health", self.prefix)
    }
}

/// The stored form of a request id: a hash, so whoever reads the store
/// cannot learn the id (a lease id the store derives follows from it).
fn request_hash(request_id: &str) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(b"targetlease request id v1\0");
    ctx.update(request_id.as_bytes());
    hex(&ctx.finish().as_ref()[..16])
}

/// Lowercase hex of `bytes`.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

/// The inverse of [`escape`]; `None` for text `escape` cannot produce.
fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        out.push(match rest.get(at + 1..at + 3)? {
            "25" => '%',
            "2F" => '/',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ks() -> KeySpace {
        KeySpace::new("tl").unwrap()
    }

    #[test]
    fn keys_name_their_target_back_and_never_collide() {
        for t in [
            Target::new("ns", "db"),
            Target::new("a/b%", "c/d"),
            Target::new("x", "%2F"),
        ] {
            assert_eq!(ks().target_of("lease", ks().lease(&t).as_bytes()), Some(t));
        }
        assert_ne!(
            ks().lease(&Target::new("a/b", "c")),
            ks().lease(&Target::new("a", "b/c"))
        );
        assert_eq!(ks().lease(&Target::new("a/b", "c")), "tl/lease/a%2Fb/c");
        assert_eq!(ks().target_of("lease", b"tl/lease/ns/a/b"), None);
        assert_eq!(ks().target_of("lease", b"tl/lease/ns/a%2fb"), None);
        assert_eq!(ks().target_of("fence", b"tl/lease/ns/a"), None);
        assert_eq!(
            ks().range_prefix("lease", Some("n/s"), "job/"),
            "tl/lease/n%2Fs/job%2F"
        );
    }

    #[test]
    fn the_request_id_is_not_stored() {
        let t = Target::new("ns", "t");
        let key = ks().request(&t, "renew", "o/1", "secret-request-id");
        assert!(key.starts_with("tl/q/ns/t/renew/o%2F1/"), "{key}");
        assert!(!key.contains("secret"), "{key}");
        assert_ne!(key, ks().request(&t, "renew", "o/1", "secret-request-id2"));
        assert_ne!(
            ks().request(&t, "acquire", "a/b", "c"),
            ks().request(&t, "acquire", "a", "b/c")
        );
    }
}

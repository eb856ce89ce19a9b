//! Key layout: every key of one target shares one hash tag, so one cluster slot.
//!
//! ```text
//! <prefix>:{<ns>:<target>}:lease                 lease record (hash, TTL = lease expiry)
//! <prefix>:{<ns>:<target>}:fence                 fencing counter (string, no TTL, never deleted)
//! <prefix>:{<ns>:<target>}:req:<op>:<scope>:<id> request cache (string, TTL = idempotency window)
//! <prefix>:{<ns>:<target>}:commit:<key>          fenced commit (hash, no TTL)
//! ```
//!
//! Namespace, target, owner, request id and commit key are escaped so that
//! `%`, `:`, `{` and `}` never appear raw: `("a:b", "c")` and `("a", "b:c")`
//! cannot collide, and no user string can end the hash tag early.

use crate::store::{StoreError, Target};

/// Builds the keys of every target under one prefix.
#[derive(Clone, Debug)]
pub struct KeySpace {
    prefix: String,
}

impl KeySpace {
    /// A key space under `prefix`, which must not be empty nor contain `{` or `}`.
    pub fn new(prefix: &str) -> Result<Self, StoreError> {
        if prefix.is_empty() || prefix.len() > 128 {
            return Err(StoreError::Invalid(
                "key prefix must be 1 to 128 bytes".into(),
            ));
        }
        if prefix.contains(['{', '}']) || prefix.chars().any(char::is_control) {
            return Err(StoreError::Invalid(
                "key prefix must not contain '{', '}' or control characters".into(),
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

    fn base(&self, t: &Target) -> String {
        format!(
            "{}:{{{}:{}}}",
            self.prefix,
            escape(&t.namespace),
            escape(&t.name)
        )
    }

    /// The lease record.
    pub fn lease(&self, t: &Target) -> String {
        format!("{}:lease", self.base(t))
    }

    /// The fencing counter.
    pub fn fence(&self, t: &Target) -> String {
        format!("{}:fence", self.base(t))
    }

    /// The request cache entry of one operation, scoped (owner or "") and request id.
    pub fn request(&self, t: &Target, op: &str, scope: &str, request_id: &str) -> String {
        format!(
            "{}:req:{op}:{}:{}",
            self.base(t),
            escape(scope),
            escape(request_id)
        )
    }

    /// The fenced commit record of `key`.
    pub fn commit(&self, t: &Target, key: &str) -> String {
        format!("{}:commit:{}", self.base(t), escape(key))
    }
}

/// Percent-escapes the characters that carry meaning in a key.
impl KeySpace {
    /// A SCAN pattern for the lease records of `namespace` (every namespace
    /// when `None`) whose target names start with `target_prefix`.
    pub fn lease_pattern(&self, namespace: Option<&str>, target_prefix: &str) -> String {
        let ns = namespace.map_or_else(|| "*".to_owned(), |n| glob_escape(&escape(n)));
        format!(
            "{}:{{{ns}:{}*}}:lease",
            glob_escape(&self.prefix),
            glob_escape(&escape(target_prefix))
        )
    }

    /// The target a lease record's key belongs to (`None` for any other key,
    /// also one [`KeySpace::lease`] cannot have built, such as a raw `:` or
    /// `{` in the target: no lease operation reads or writes that key).
    pub fn target_of_lease_key(&self, key: &str) -> Option<Target> {
        let target = parse_base(&self.prefix, key.strip_suffix(":lease")?)?;
        (self.lease(&target) == key).then_some(target)
    }
}

/// Reads a key base `<prefix>:{<ns>:<target>}` (what the release and revoke
/// scripts publish) back into its target; `None` for text [`escape`] cannot
/// produce.
pub fn parse_base(prefix: &str, base: &str) -> Option<Target> {
    let tag = base
        .strip_prefix(prefix)?
        .strip_prefix(":{")?
        .strip_suffix('}')?;
    let (ns, name) = tag.split_once(':')?;
    Some(Target::new(unescape(ns)?, unescape(name)?))
}

/// `s` with SCAN's glob characters escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The inverse of [`escape`]; `None` for text `escape` cannot produce.
fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 3)?;
        out.push(match code {
            "25" => '%',
            "3A" => ':',
            "7B" => '{',
            "7D" => '}',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            ':' => out.push_str("%3A"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ks() -> KeySpace {
        KeySpace::new("tl").unwrap()
    }

    #[test]
    fn lease_keys_name_their_target_back_and_patterns_escape_globs() {
        for t in [
            Target::new("ns", "db"),
            Target::new("a:b%", "{c}:d"),
            Target::new("x", "*?[]\\"),
        ] {
            assert_eq!(ks().target_of_lease_key(&ks().lease(&t)), Some(t));
        }
        assert_eq!(ks().target_of_lease_key("tl:{ns:db}:fence"), None);
        assert_eq!(ks().target_of_lease_key("tl:{ns:d%ZZb}:lease"), None);
        assert_eq!(ks().target_of_lease_key("tl:{ns:a:b}:lease"), None);
        assert_eq!(ks().target_of_lease_key("tl:{ns:a{b}:lease"), None);
        assert_eq!(ks().target_of_lease_key("tl:{ns:%3a}:lease"), None);
        assert_eq!(ks().lease_pattern(None, ""), "tl:{*:*}:lease");
        assert_eq!(
            ks().lease_pattern(Some("team:a"), "job*"),
            "tl:{team%3Aa:job\\**}:lease"
        );
    }

    #[test]
    fn namespace_and_target_never_collide() {
        let a = ks().lease(&Target::new("a:b", "c"));
        let b = ks().lease(&Target::new("a", "b:c"));
        assert_ne!(a, b);
        assert_eq!(a, "tl:{a%3Ab:c}:lease");
    }

    #[test]
    fn every_key_of_a_target_shares_one_hash_tag() {
        let t = Target::new("ns}x", "{weird}");
        let tag = |k: &str| {
            let open = k.find('{').unwrap();
            let close = open + k[open..].find('}').unwrap();
            k[open + 1..close].to_owned()
        };
        let ks = ks();
        let lease = tag(&ks.lease(&t));
        assert_eq!(lease, tag(&ks.fence(&t)));
        assert_eq!(lease, tag(&ks.request(&t, "acquire", "o}", "r{")));
        assert_eq!(lease, tag(&ks.commit(&t, "k}")));
        assert_eq!(lease, "ns%7Dx:%7Bweird%7D");
    }

    #[test]
    fn prefix_with_braces_is_refused() {
        assert!(KeySpace::new("a{b").is_err());
        assert!(KeySpace::new("").is_err());
    }
}

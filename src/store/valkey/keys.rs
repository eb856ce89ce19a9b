//! Key layout: one hash per target, so a target's state always lives in one
//! key (one cluster slot, and a slot migration never splits it).
//!
//! ```text
//! <prefix>:{<ns>:<target>}          the target's hash (no key expiry, never deleted)
//!   fence                           fencing counter (no field expiry)
//!   lease                           the live lease (field expiry = lease expiry)
//!   q:<op>:<scope>:<request id>     request cache (field expiry = idempotency window)
//!   c:<key>                         fenced commit (no field expiry)
//! ```
//!
//! The fields' contents are described in `lua/lib.lua`. Namespace, target,
//! owner, request id and commit key are escaped so that `%`, `:`, `{` and `}`
//! never appear raw: `("a:b", "c")` and `("a", "b:c")` cannot collide, and no
//! user string can end the hash tag early.

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

    /// The target's hash: every field of one target lives in it.
    pub fn target(&self, t: &Target) -> String {
        self.base(t)
    }
}

/// The request cache field of one operation, scoped (owner or "") and request
/// id. The request id is hashed: it is a capability (a lease id the store
/// picks follows from it), and whoever reads the store must not learn it.
pub fn request_field(op: &str, scope: &str, request_id: &str) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(b"targetlease request id v1\0");
    ctx.update(request_id.as_bytes());
    let hashed: String = ctx.finish().as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("q:{op}:{}:{hashed}", escape(scope))
}

/// The fenced commit field of `key`.
pub fn commit_field(key: &str) -> String {
    format!("c:{}", escape(key))
}

/// Percent-escapes the characters that carry meaning in a key.
impl KeySpace {
    /// A SCAN pattern for the target keys of `namespace` (every namespace
    /// when `None`) whose target names start with `target_prefix`.
    pub fn target_pattern(&self, namespace: Option<&str>, target_prefix: &str) -> String {
        let ns = namespace.map_or_else(|| "*".to_owned(), |n| glob_escape(&escape(n)));
        format!(
            "{}:{{{ns}:{}*}}",
            glob_escape(&self.prefix),
            glob_escape(&escape(target_prefix))
        )
    }

    /// The target a key belongs to (`None` for any other key, also one
    /// [`KeySpace::target`] cannot have built, such as a raw `:` or `{` in
    /// the target: no lease operation reads or writes that key).
    pub fn target_of_key(&self, key: &str) -> Option<Target> {
        let target = parse_base(&self.prefix, key)?;
        (self.target(&target) == key).then_some(target)
    }
}

/// Reads a target key `<prefix>:{<ns>:<target>}` (what the release and
/// revoke scripts publish) back into its target; `None` for text [`escape`]
/// cannot produce.
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
    fn target_keys_name_their_target_back_and_patterns_escape_globs() {
        for t in [
            Target::new("ns", "db"),
            Target::new("a:b%", "{c}:d"),
            Target::new("x", "*?[]\\"),
        ] {
            assert_eq!(ks().target_of_key(&ks().target(&t)), Some(t));
        }
        assert_eq!(ks().target_of_key("tl:{ns:db}:fence"), None);
        assert_eq!(ks().target_of_key("tl:{ns:d%ZZb}"), None);
        assert_eq!(ks().target_of_key("tl:{ns:a:b}"), None);
        assert_eq!(ks().target_of_key("tl:{ns:a{b}"), None);
        assert_eq!(ks().target_of_key("tl:{ns:%3a}"), None);
        assert_eq!(ks().target_of_key("other:{ns:db}"), None);
        assert_eq!(ks().target_pattern(None, ""), "tl:{*:*}");
        assert_eq!(
            ks().target_pattern(Some("team:a"), "job*"),
            "tl:{team%3Aa:job\\**}"
        );
    }

    #[test]
    fn namespace_and_target_never_collide() {
        let a = ks().target(&Target::new("a:b", "c"));
        let b = ks().target(&Target::new("a", "b:c"));
        assert_ne!(a, b);
        assert_eq!(a, "tl:{a%3Ab:c}");
    }

    #[test]
    fn fields_escape_what_separates_them() {
        assert_ne!(
            request_field("acquire", "a:b", "c"),
            request_field("acquire", "a", "b:c")
        );
        let field = request_field("renew", "o:1", "secret-request-id");
        assert!(field.starts_with("q:renew:o%3A1:"), "{field}");
        assert!(
            !field.contains("secret"),
            "the request id is not stored: {field}"
        );
        assert_eq!(field, request_field("renew", "o:1", "secret-request-id"));
        assert_ne!(field, request_field("renew", "o:1", "secret-request-id2"));
        assert_eq!(commit_field("k:v"), "c:k%3Av");
    }

    #[test]
    fn prefix_with_braces_is_refused() {
        assert!(KeySpace::new("a{b").is_err());
        assert!(KeySpace::new("").is_err());
    }
}

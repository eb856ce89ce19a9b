//! The Lua scripts, compiled into the binary and called by hash.
//!
//! Each script is the part of `lua/lib.lua` it uses (the helpers its header
//! lists on `-- uses:` lines, and those they name in turn: every helper is a
//! closure created on each call, so unused ones cost time) followed by
//! `lua/<op>.lua`, behind a `#!lua`
//! shebang: with the shebang the server refuses a writing script up front
//! under OOM, on a read-only replica or with too few replicas, instead of
//! failing half way. Flags relax that where it matters: `get` is
//! `no-writes` (called with `EVALSHA_RO`, it runs whatever the write state),
//! `release` and `revoke` are `allow-oom` (freeing a lease must work on a
//! full server).

use std::sync::LazyLock;

/// One compiled-in script and its SHA-1.
#[derive(Debug)]
pub struct Script {
    /// Operation name, for logs and metrics.
    pub name: &'static str,
    /// Full source as sent to the server.
    pub source: String,
    /// Hex SHA-1 of `source`, as EVALSHA wants it.
    pub sha: String,
    /// Declared `no-writes`: sent with `EVALSHA_RO`/`EVAL_RO`.
    pub read_only: bool,
    /// The script's own text (its header is the KEYS/ARGV contract).
    pub body: &'static str,
}

impl Script {
    fn new(name: &'static str, flags: &str, body: &'static str) -> Self {
        let shebang = match flags {
            "" => "#!lua".to_owned(),
            f => format!("#!lua flags={f}"),
        };
        let source = format!(
            "{shebang}\n{}\n{}",
            library_for(include_str!("../../../lua/lib.lua"), &uses(body)),
            body
        );
        let sha = sha1_smol::Sha1::from(source.as_bytes())
            .digest()
            .to_string();
        Self {
            name,
            source,
            sha,
            read_only: flags == "no-writes",
            body,
        }
    }
}

/// The name a lib.lua helper defines on its first line, if it starts one:
/// `local function NAME(` or `local NAME =`.
fn defines(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("local ")?;
    let rest = rest.strip_prefix("function ").unwrap_or(rest);
    let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
    (end > 0).then(|| &rest[..end])
}

/// Whether `text` uses the identifier `name` (not as part of a longer one).
fn names(text: &str, name: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(name)
        .any(|(at, _)| !text[..at].ends_with(ident) && !text[at + name.len()..].starts_with(ident))
}

/// The lib.lua helpers a script's header lists on its `-- uses:` lines
/// (comma-separated, several lines allowed), in order.
pub(super) fn uses(body: &str) -> Vec<&str> {
    body.lines()
        .take_while(|l| l.starts_with("--"))
        .filter_map(|l| l.strip_prefix("-- uses:"))
        .flat_map(|l| l.split(','))
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect()
}

/// The lib.lua helpers that the code of `body` (not its comments) names, in
/// lib order: what its `-- uses:` lines must list.
#[cfg(test)]
pub(super) fn helpers_named(body: &str) -> Vec<&'static str> {
    let code: Vec<&str> = body
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect();
    include_str!("../../../lua/lib.lua")
        .lines()
        .filter_map(defines)
        .filter(|name| code.iter().any(|l| names(l, name)))
        .collect()
}

/// The helpers of `lib` named in `uses`, and those they name in turn, in
/// lib order. A helper is its defining line, what follows up to the next
/// helper, and the comment lines just above it; the lib's opening comment
/// is kept.
fn library_for(lib: &str, uses: &[&str]) -> String {
    let lines: Vec<&str> = lib.lines().collect();
    let starts: Vec<usize> = (0..lines.len())
        .filter(|&i| defines(lines[i]).is_some())
        .map(|i| {
            let mut s = i;
            while s > 0 && lines[s - 1].starts_with("--") {
                s -= 1;
            }
            s
        })
        .collect();
    let Some(&first) = starts.first() else {
        return lib.to_owned();
    };
    let blocks: Vec<(&str, String)> = starts
        .iter()
        .enumerate()
        .map(|(k, &s)| {
            let end = starts.get(k + 1).copied().unwrap_or(lines.len());
            let text = lines[s..end].join("\n");
            let name = lines[s..end].iter().find_map(|l| defines(l)).unwrap_or("");
            (name, text)
        })
        .collect();
    let mut needed = vec![false; blocks.len()];
    let mut changed = true;
    while changed {
        changed = false;
        for k in 0..blocks.len() {
            if needed[k] {
                continue;
            }
            let used = uses.contains(&blocks[k].0)
                || (0..blocks.len()).any(|j| needed[j] && names(&blocks[j].1, blocks[k].0));
            if used {
                needed[k] = true;
                changed = true;
            }
        }
    }
    let mut out = lines[..first].join("\n");
    for (k, (_, text)) in blocks.iter().enumerate() {
        if needed[k] {
            out.push('\n');
            out.push_str(text);
        }
    }
    out
}

/// Every script the store runs.
#[derive(Debug)]
pub struct Scripts {
    /// `lua/acquire.lua`.
    pub acquire: Script,
    /// `lua/renew.lua`.
    pub renew: Script,
    /// `lua/release.lua`.
    pub release: Script,
    /// `lua/get.lua`.
    pub get: Script,
    /// `lua/revoke.lua`.
    pub revoke: Script,
    /// `lua/commit.lua`.
    pub commit: Script,
    /// `lua/read.lua`.
    pub read: Script,
}

impl Scripts {
    /// All scripts, for preloading.
    pub fn all(&self) -> [&Script; 7] {
        [
            &self.acquire,
            &self.renew,
            &self.release,
            &self.get,
            &self.revoke,
            &self.commit,
            &self.read,
        ]
    }
}

/// The scripts, built once.
pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new("acquire", "", include_str!("../../../lua/acquire.lua")),
    renew: Script::new("renew", "", include_str!("../../../lua/renew.lua")),
    release: Script::new(
        "release",
        "allow-oom",
        include_str!("../../../lua/release.lua"),
    ),
    get: Script::new("get", "no-writes", include_str!("../../../lua/get.lua")),
    revoke: Script::new(
        "revoke",
        "allow-oom",
        include_str!("../../../lua/revoke.lua"),
    ),
    commit: Script::new("commit", "", include_str!("../../../lua/commit.lua")),
    read: Script::new("read", "no-writes", include_str!("../../../lua/read.lua")),
});

/// Why a server that answered `INFO server` with `info` cannot run the
/// scripts, if it cannot ([`lacks_field_expiry_in`]).
pub(super) fn lacks_field_expiry(info: &str) -> Option<String> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    lacks_field_expiry_in(field("valkey_version"), field("redis_version"))
}

/// Why a server of these versions (`INFO server`'s `valkey_version` and
/// `redis_version`) cannot run the scripts, if it cannot: they keep each
/// lease and request cache entry as a hash field with its own expiry
/// (`HSETEX`, `HPEXPIRETIME`, `HPEXPIRE`), which Valkey has since 9.0 (and
/// Redis since 8.0). A server that hides its version is given the benefit of
/// the doubt (its first script would fail before it wrote).
pub fn lacks_field_expiry_in(valkey: Option<&str>, redis: Option<&str>) -> Option<String> {
    let (server, version, needed) = match (valkey, redis) {
        (Some(v), _) => ("Valkey", v, 9),
        (None, Some(v)) => ("Redis", v, 8),
        (None, None) => return None,
    };
    let major: u32 = version.split('.').next()?.parse().ok()?;
    (major < needed).then(|| {
        format!(
            "runs {server} {version}: targetlease needs hash-field expiry, \
             Valkey 9.0 or newer"
        )
    })
}

#[cfg(test)]
mod version_tests {
    use super::lacks_field_expiry;

    #[test]
    fn servers_without_hash_field_expiry_are_named() {
        let valkey = |v: &str| format!("# Server\r\nredis_version:7.2.4\r\nvalkey_version:{v}\r\n");
        assert_eq!(lacks_field_expiry(&valkey("9.0.0")), None);
        assert_eq!(lacks_field_expiry(&valkey("9.1.2")), None);
        let old = lacks_field_expiry(&valkey("8.1.1")).unwrap();
        assert!(
            old.contains("Valkey 8.1.1") && old.contains("9.0 or newer"),
            "{old}"
        );
        let redis = lacks_field_expiry("redis_version:7.0.15\r\n").unwrap();
        assert!(redis.contains("Redis 7.0.15"), "{redis}");
        assert_eq!(lacks_field_expiry("redis_version:8.2.0\r\n"), None);
        assert_eq!(lacks_field_expiry("# Server\r\n"), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MAX_METADATA_DEPTH;

    #[test]
    fn the_scripts_check_metadata_depth_with_the_clients_limit() {
        let lib = include_str!("../../../lua/lib.lua");
        let depth: usize = lib
            .lines()
            .find_map(|l| l.strip_prefix("local META_DEPTH = "))
            .and_then(|n| n.trim().parse().ok())
            .expect("lib.lua declares META_DEPTH");
        assert_eq!(depth, MAX_METADATA_DEPTH);
    }

    #[test]
    fn the_scripts_bound_lease_records_by_the_clients_limits() {
        let lib = include_str!("../../../lua/lib.lua");
        let bound = lib
            .lines()
            .find_map(|l| l.strip_prefix("local RECORD_BYTES = "))
            .expect("lib.lua declares RECORD_BYTES");
        assert_eq!(
            bound.trim(),
            format!(
                "{} + {} + 200",
                crate::store::MAX_NAME_BYTES,
                crate::store::MAX_METADATA_BYTES
            )
        );
        // What acquire accepts from a caller: the same limits.
        let limit = |name: &str| -> usize {
            lib.lines()
                .find_map(|l| l.strip_prefix(&format!("local {name} = ")))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("lib.lua declares {name}"))
        };
        assert_eq!(limit("NAME_BYTES"), crate::store::MAX_NAME_BYTES);
        assert_eq!(limit("META_BYTES"), crate::store::MAX_METADATA_BYTES);
    }

    #[test]
    fn each_script_carries_only_the_helpers_it_uses() {
        let s = &*SCRIPTS;
        assert!(s.acquire.source.contains("local function dec_incr("));
        assert!(s.acquire.source.contains("local function replay("));
        assert!(!s.get.source.contains("local function replay("));
        assert!(!s.get.source.contains("local function dec_incr("));
        // What read_lease needs comes along with it.
        assert!(s.get.source.contains("local function is_metadata("));
        assert!(s.get.source.contains("local META_DEPTH = "));
        // Every helper a script's text names is defined in it.
        for script in s.all() {
            let lib = include_str!("../../../lua/lib.lua");
            for name in lib.lines().filter_map(defines) {
                let defined = script.source.lines().any(|l| defines(l) == Some(name));
                let used = script
                    .source
                    .lines()
                    .filter(|l| defines(l) != Some(name) && !l.trim_start().starts_with("--"))
                    .any(|l| names(l, name));
                assert!(!used || defined, "{} uses {name} without it", script.name);
            }
        }
    }

    #[test]
    fn flags_match_what_each_operation_does() {
        let s = &*SCRIPTS;
        for read in [&s.get, &s.read] {
            assert!(read.source.starts_with("#!lua flags=no-writes\n") && read.read_only);
        }
        for free in [&s.release, &s.revoke] {
            assert!(
                free.source.starts_with("#!lua flags=allow-oom\n"),
                "{}",
                free.name
            );
            assert!(!free.read_only);
        }
        for write in [&s.acquire, &s.renew, &s.commit] {
            assert!(write.source.starts_with("#!lua\n"), "{}", write.name);
        }
    }
}

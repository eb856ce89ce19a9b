//! The Lua scripts, compiled into the binary and called by hash.
//!
//! Each script is `lua/lib.lua` followed by `lua/<op>.lua`, behind a `#!lua`
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
            include_str!("../../../lua/lib.lua"),
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
}

impl Scripts {
    /// All scripts, for preloading.
    pub fn all(&self) -> [&Script; 6] {
        [
            &self.acquire,
            &self.renew,
            &self.release,
            &self.get,
            &self.revoke,
            &self.commit,
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
});

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
    fn flags_match_what_each_operation_does() {
        let s = &*SCRIPTS;
        assert!(s.get.source.starts_with("#!lua flags=no-writes\n") && s.get.read_only);
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

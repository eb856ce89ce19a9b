//! The Lua scripts, compiled into the binary and called by hash.
//!
//! Each script is `lua/lib.lua` followed by `lua/<op>.lua`, behind a `#!lua`
//! shebang: with the shebang the server refuses a writing script up front
//! under OOM or on a read-only replica, instead of failing half way.

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
}

impl Script {
    fn new(name: &'static str, body: &str) -> Self {
        let source = format!("#!lua\n{}\n{}", include_str!("../../../lua/lib.lua"), body);
        let sha = sha1_smol::Sha1::from(source.as_bytes())
            .digest()
            .to_string();
        Self { name, source, sha }
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
    acquire: Script::new("acquire", include_str!("../../../lua/acquire.lua")),
    renew: Script::new("renew", include_str!("../../../lua/renew.lua")),
    release: Script::new("release", include_str!("../../../lua/release.lua")),
    get: Script::new("get", include_str!("../../../lua/get.lua")),
    revoke: Script::new("revoke", include_str!("../../../lua/revoke.lua")),
    commit: Script::new("commit", include_str!("../../../lua/commit.lua")),
});

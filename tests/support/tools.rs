//! The one rule for finding tools, as the scripts follow it
//! (`scripts/lib/tools.sh`): every program a test runs that the project
//! installs or builds — the control plane, kubectl, helm, the node's
//! binaries, valkey-server, redis-server, stunnel, PostgreSQL, libfaketime —
//! is taken from the tools directory (`$TARGETLEASE_TOOLS_DIR`, default
//! `~/.cache/targetlease/bin`) and nowhere else. `scripts/setup.sh` builds or
//! links every one of them there, so a program that happens to be on PATH
//! (a packaged `kubectl` of another minor version, say) never changes what a
//! test runs. A missing tool fails the test that needs it, with the way to
//! get it: tests never skip.

use std::path::PathBuf;

/// The tools directory.
pub fn tools_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TARGETLEASE_TOOLS_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home =
        std::env::var_os("HOME").expect("HOME is not set and TARGETLEASE_TOOLS_DIR is not set");
    PathBuf::from(home).join(".cache/targetlease/bin")
}

/// The path of tool `name` in the tools directory, or a panic that says how
/// to get it.
pub fn tool(name: &str) -> PathBuf {
    let path = tools_dir().join(name);
    assert!(
        path.exists(),
        "missing {}: run scripts/setup.sh, which builds or links every tool the tests use into {} \
         (TARGETLEASE_TOOLS_DIR). Tests take tools from there only, never from PATH, and never skip.",
        path.display(),
        tools_dir().display()
    );
    path
}

/// `PATH` with the tools directory first, for scripts a test runs that call
/// tools by name (the fencing recipe calls `kubectl` and `jq`).
pub fn path_with_tools() -> std::ffi::OsString {
    let mut dirs = vec![tools_dir()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).expect("PATH entries hold no separator")
}

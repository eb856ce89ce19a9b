//! When a build names its commit (used by build.rs, checked by
//! tests/cli/install.rs).

/// Whether a build asks git for the commit it was built from: every release
/// build (`cargo install`, the Dockerfile) and any build of cargo's own
/// checkout of a git source (`cargo install --git`, also with `--debug`).
/// Other debug builds do not: watching HEAD would recompile the crate after
/// every commit of a working tree.
pub fn asks_git(profile: Option<&str>, manifest_dir: Option<&str>) -> bool {
    profile == Some("release") || manifest_dir.is_some_and(|d| d.contains("/git/checkouts/"))
}

//! The release pipeline (`.github/workflows/release.yml`): checked by
//! actionlint (built from its Go module by `scripts/build-controlplane.sh`),
//! and holding what a release must do: a multi-arch image from bases pinned
//! by digest, with OCI labels, an SBOM, provenance and a signature, and the
//! chart pushed as a signed OCI artifact; every action pinned by commit.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn actionlint() -> PathBuf {
    crate::support::tools::tool("actionlint")
}

fn lint(file: &Path) -> std::process::Output {
    Command::new(actionlint())
        .arg("-no-color")
        .arg(file)
        .current_dir(repo())
        .output()
        .expect("run actionlint")
}

#[test]
fn the_release_workflow_passes_actionlint_and_a_broken_copy_does_not() {
    let workflow = repo().join(".github/workflows/release.yml");
    let out = lint(&workflow);
    assert!(
        out.status.success(),
        "actionlint: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The check can fail: an undefined step output and an unknown runner key.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("release.yml");
    let text = std::fs::read_to_string(&workflow).unwrap();
    let text = text
        .replace("steps.build.outputs.digest", "steps.nowhere.outputs.digest")
        .replace("runs-on: ubuntu-24.04", "runs_on: ubuntu-24.04");
    std::fs::write(&broken, text).unwrap();
    let out = lint(&broken);
    assert!(
        !out.status.success(),
        "actionlint accepted a broken workflow"
    );
}

#[test]
fn a_release_builds_signs_and_describes_every_artifact() {
    let workflow = std::fs::read_to_string(repo().join(".github/workflows/release.yml")).unwrap();
    for needed in [
        "platforms: linux/amd64,linux/arm64",
        "sbom: true",
        "provenance: mode=max",
        "RUST_IMAGE=${{ steps.bases.outputs.rust }}",
        "RUNTIME_IMAGE=${{ steps.bases.outputs.runtime }}",
        "imagetools inspect",
        "docker/metadata-action",
        "org.opencontainers.image.base.name",
        "cosign sign --yes \"${IMAGE}@${DIGEST}\"",
        "helm push dist/targetlease-*.tgz \"$CHARTS\"",
        "CHARTS: oci://",
        "id-token: write",
    ] {
        assert!(workflow.contains(needed), "release.yml lacks {needed:?}");
    }
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    for needed in [
        "FROM ${RUST_IMAGE} AS build",
        "FROM ${RUNTIME_IMAGE}",
        "org.opencontainers.image.licenses=\"Apache-2.0\"",
        "USER 65532:65532",
        // jemalloc built for 64 KiB pages on arm64 (it refuses larger pages
        // than it was built for, and arm64 kernels use 4, 16 or 64 KiB).
        "ARG TARGETARCH",
        "if [ \"$TARGETARCH\" = arm64 ]; then export JEMALLOC_SYS_WITH_LG_PAGE=16; fi",
    ] {
        assert!(dockerfile.contains(needed), "Dockerfile lacks {needed:?}");
    }
}

/// Every action the workflow runs is pinned by its full commit SHA (a tag
/// like `v4` can be moved to other code by whoever controls the action's
/// repository); the comment names the release it is.
#[test]
fn every_action_is_pinned_by_commit() {
    let workflow = std::fs::read_to_string(repo().join(".github/workflows/release.yml")).unwrap();
    let uses: Vec<&str> = workflow
        .lines()
        .filter_map(|l| {
            l.trim_start()
                .trim_start_matches("- ")
                .strip_prefix("uses:")
        })
        .map(str::trim)
        .collect();
    assert!(uses.len() >= 8, "{uses:?}");
    for u in uses {
        let (action, rest) = u.split_once('@').unwrap_or_else(|| panic!("{u}: no ref"));
        let (sha, comment) = rest.split_once(" # ").unwrap_or((rest, ""));
        assert!(
            sha.len() == 40 && sha.bytes().all(|b| b.is_ascii_hexdigit()),
            "{action} is pinned by {sha:?}, not a commit"
        );
        assert!(
            comment.starts_with('v'),
            "{action}@{sha}: name its release in a comment"
        );
    }
}

/// The image build copies every file the compile reads: each member of the
/// workspace (cargo reads every member's manifest, and build.rs uses
/// `build/`) and what the sources pull in by `include_str!`, by top
/// directory, each COPYed by the Dockerfile and not left out by
/// .dockerignore (no Docker engine here to build it; a missing file would
/// fail only the release).
#[test]
fn the_image_build_copies_every_file_the_compile_reads() {
    let root = repo();
    let mut needed = std::collections::BTreeSet::new();
    let mut note = |from: &std::path::Path, rel: &str| {
        let path = from.parent().unwrap().join(rel);
        let path =
            std::fs::canonicalize(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let top = path
            .strip_prefix(std::fs::canonicalize(root).unwrap())
            .unwrap()
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        needed.insert(top);
    };
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = manifest
        .lines()
        .find_map(|l| l.strip_prefix("members = ["))
        .expect("Cargo.toml lists the workspace's members on one line");
    let mut copied: Vec<String> = members
        .trim_end_matches(']')
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty() && m != ".")
        .collect();
    let mut dirs = vec![root.join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (at, _) in text.match_indices("include_str!(\"") {
                    let rel = text[at + "include_str!(\"".len()..]
                        .split('"')
                        .next()
                        .unwrap();
                    note(&path, rel);
                }
            }
        }
    }
    assert!(needed.contains("lua"), "{needed:?}");
    assert!(
        copied.iter().any(|m| m == "build") && copied.iter().any(|m| m == "tests/support"),
        "{copied:?}"
    );
    copied.extend(needed);
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    let ignored = std::fs::read_to_string(root.join(".dockerignore")).unwrap();
    for path in &copied {
        assert!(
            dockerfile.lines().any(|l| l.starts_with("COPY ")
                && !l.contains("--from")
                && l.split_whitespace().any(|w| w == path)),
            "the Dockerfile does not COPY {path}"
        );
        // The last pattern naming the path or a directory above it decides
        // (a `!` before it brings the path back).
        let decided = ignored.lines().map(str::trim).rfind(|l| {
            let pattern = l.trim_start_matches('!').trim_end_matches('/');
            !l.starts_with('#')
                && !pattern.is_empty()
                && (path == pattern || path.starts_with(&format!("{pattern}/")))
        });
        assert!(
            decided.is_none_or(|l| l.starts_with('!')),
            ".dockerignore leaves out {path} ({decided:?})"
        );
    }
}

//! The three parts depend one way (docs/architecture.md): the CLI uses the
//! operator and the store, the operator uses the store, the store uses
//! neither and names no Kubernetes type.

use std::path::{Path, PathBuf};

/// Every Rust file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out
}

/// The places in `part` that name one of `above` (comments aside).
fn upward(part: &str, above: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let mut files = sources(&root.join("src").join(part));
    files.push(root.join("src").join(format!("{part}.rs")));
    for file in files.iter().filter(|f| f.is_file()) {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for name in above {
                if code.contains(name) {
                    found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    found
}

#[test]
fn the_store_names_neither_the_operator_nor_the_cli_nor_kubernetes() {
    let found = upward(
        "store",
        &["crate::operator", "crate::cli", "kube::", "k8s_openapi"],
    );
    assert!(
        found.is_empty(),
        "the store reaches up:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_operator_never_names_the_cli() {
    let found = upward("operator", &["crate::cli"]);
    assert!(
        found.is_empty(),
        "the operator reaches up:\n{}",
        found.join("\n")
    );
}

/// Every Rust file of the workspace reads in one sitting (at most 500
/// lines), and every module is found where Rust looks for it: no `#[path]`
/// (the fuzz workspace aside: it compiles the RESP decoder's two files
/// alone, without the crate around them).
#[test]
fn every_file_is_short_and_every_module_where_rust_looks_for_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches", "build"] {
        files.extend(sources(&root.join(dir)));
    }
    files.retain(|f| !f.components().any(|c| c.as_os_str() == "target"));
    assert!(files.len() > 100, "{} files", files.len());
    let mut long = Vec::new();
    let mut by_path = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let lines = text.lines().count();
        if lines > 500 {
            long.push(format!("{} ({lines} lines)", file.display()));
        }
        let attribute = ["#[", "path"].concat();
        if text.lines().any(|l| l.trim_start().starts_with(&attribute)) {
            by_path.push(file.display().to_string());
        }
    }
    assert_eq!(long, Vec::<String>::new(), "files over 500 lines");
    assert_eq!(by_path, Vec::<String>::new(), "modules pulled in by path");
}

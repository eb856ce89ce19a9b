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

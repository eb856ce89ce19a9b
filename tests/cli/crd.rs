//! The committed CRD must be exactly what `targetlease crd` prints.

#[test]
fn committed_crd_matches_the_generated_one() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crds/targetlease.dev_targetleases.yaml"
    );
    let committed = std::fs::read_to_string(path).expect("crds/targetlease.dev_targetleases.yaml");
    let generated = targetlease::cli::crd::yaml();
    assert!(
        committed == generated,
        "crds/ drifted from the code: run `cargo run -- crd > crds/targetlease.dev_targetleases.yaml`"
    );
}

#[test]
fn the_binary_prints_the_same_crd() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_targetlease"))
        .arg("crd")
        .output()
        .expect("run targetlease crd");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        targetlease::cli::crd::yaml()
    );
}

/// docs/architecture.md stays true: every file it names exists, and every
/// `Type::function`, `module::function` or `module::submodule` it names is
/// defined in the source.
#[test]
fn the_architecture_doc_names_only_things_that_exist() {
    let root = env!("CARGO_MANIFEST_DIR");
    let doc = std::fs::read_to_string(format!("{root}/docs/architecture.md")).unwrap();
    let mut sources = String::new();
    let mut stack = vec![std::path::PathBuf::from(format!("{root}/src"))];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                sources.push_str(&std::fs::read_to_string(path).unwrap());
            }
        }
    }
    let mut missing = Vec::new();
    for quoted in doc.split('`').skip(1).step_by(2) {
        let name = quoted.trim_end_matches("()");
        if name.ends_with(".rs") || name.ends_with(".lua") {
            let candidates = [
                format!("{root}/{name}"),
                format!("{root}/src/{name}"),
                format!("{root}/src/store/{name}"),
            ];
            if !candidates.iter().any(|c| std::path::Path::new(c).exists()) {
                missing.push(name.to_string());
            }
        } else if let Some((_, item)) = name.rsplit_once("::")
            && item.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && item.chars().next().is_some_and(|c| c.is_ascii_lowercase())
            && !sources.contains(&format!("fn {item}("))
            && !sources.contains(&format!("fn {item}<"))
            && !sources.contains(&format!("mod {item};"))
        {
            missing.push(name.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md names what does not exist: {missing:?}"
    );
}

/// Where a doc names the test that holds a promise (`path/file.rs::name`),
/// that file exists and defines `fn name`: a moved or renamed test fails
/// here, not silently in the docs.
#[test]
fn every_test_a_doc_names_exists_where_it_says() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec![root.join("README.md")];
    let mut stack = vec![root.join("docs")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                docs.push(path);
            }
        }
    }
    let mut named = 0;
    let mut missing = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        for quoted in text.split('`').skip(1).step_by(2) {
            let Some((file, item)) = quoted.split_once(".rs::") else {
                continue;
            };
            if file.contains(' ') || !item.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            named += 1;
            let source = std::fs::read_to_string(root.join(format!("{file}.rs")));
            let defined = source.is_ok_and(|s| s.contains(&format!("fn {item}(")));
            if !defined {
                missing.push(format!("{}: {quoted}", doc.display()));
            }
        }
    }
    assert!(named > 20, "only {named} tests named in the docs");
    assert_eq!(
        missing,
        Vec::<String>::new(),
        "tests the docs name that are not there"
    );
}

//! The justfile is the index of every entry point: each script in scripts/
//! and each test target has a recipe there, with a one-line comment saying
//! what it is for, and every recipe runs something that exists.

use std::collections::BTreeSet;
use std::path::Path;

/// The justfile's recipes: (comment above it, name, commands).
fn recipes(text: &str) -> Vec<(Option<String>, String, Vec<String>)> {
    let mut out: Vec<(Option<String>, String, Vec<String>)> = Vec::new();
    let mut comment = None;
    for line in text.lines() {
        if let Some(body) = line.strip_prefix("    ") {
            let last = out.last_mut().expect("a command belongs to a recipe");
            last.2.push(body.trim().to_owned());
        } else if let Some(c) = line.strip_prefix('#') {
            comment = Some(c.trim().to_owned());
        } else if line.trim().is_empty() {
            comment = None;
        } else {
            let (head, _) = line
                .split_once(':')
                .unwrap_or_else(|| panic!("justfile: {line:?} is not a recipe"));
            let name = head.split_whitespace().next().unwrap().to_owned();
            out.push((comment.take(), name, Vec::new()));
        }
    }
    out
}

/// The test targets cargo builds: `tests/NAME.rs`, `tests/NAME/main.rs`,
/// and the `[[test]]` entries of Cargo.toml.
fn test_targets(repo: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(repo.join("tests")).unwrap().flatten() {
        let path = entry.path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.extension().is_some_and(|e| e == "rs") || path.join("main.rs").is_file() {
            names.insert(name);
        }
    }
    let manifest = std::fs::read_to_string(repo.join("Cargo.toml")).unwrap();
    let mut in_test = false;
    for line in manifest.lines() {
        if line.starts_with('[') {
            in_test = line == "[[test]]";
        } else if in_test && let Some(name) = line.strip_prefix("name = ") {
            names.insert(name.trim_matches('"').to_owned());
        }
    }
    names
}

/// The workspace's members other than the root package whose library has
/// tests of its own (no `test = false`): their package names.
fn members_with_tests(repo: &Path) -> BTreeSet<String> {
    let manifest = std::fs::read_to_string(repo.join("Cargo.toml")).unwrap();
    let list = manifest
        .lines()
        .find_map(|l| l.strip_prefix("members = "))
        .expect("the root manifest lists the workspace's members");
    let mut names = BTreeSet::new();
    for member in list.trim_matches(['[', ']']).split(',') {
        let member = member.trim().trim_matches('"');
        if member == "." || member.is_empty() {
            continue;
        }
        let text = std::fs::read_to_string(repo.join(member).join("Cargo.toml")).unwrap();
        if text.lines().any(|l| l.trim() == "test = false") {
            continue;
        }
        let name = text
            .lines()
            .find_map(|l| l.strip_prefix("name = "))
            .expect("a member's manifest names its package");
        names.insert(name.trim_matches('"').to_owned());
    }
    names
}

/// The scripts a person runs: every `*.sh` and `*.py` in scripts/ (not the
/// libraries in scripts/lib/) and anywhere under tests/ and examples/, as
/// repository paths.
fn scripts(repo: &Path) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut dirs = vec![
        repo.join("scripts"),
        repo.join("tests"),
        repo.join("examples"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let rel = path
                .strip_prefix(repo)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if path.is_dir() {
                if rel != "scripts/lib" && !rel.ends_with("/target") {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "sh" || e == "py") {
                found.insert(rel);
            }
        }
    }
    found
}

#[test]
fn the_justfile_lists_every_script_and_test_target() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(repo.join("justfile")).unwrap();
    let recipes = recipes(&text);
    let mut commands = Vec::new();
    for (comment, name, body) in &recipes {
        assert!(
            comment.as_deref().is_some_and(|c| !c.is_empty()),
            "justfile: the recipe {name} has no comment line above it"
        );
        assert!(!body.is_empty(), "justfile: the recipe {name} runs nothing");
        commands.extend(body.iter().map(String::as_str));
    }
    let words: Vec<&str> = commands.iter().flat_map(|c| c.split_whitespace()).collect();

    // Each script and each test target is run by some recipe.
    let scripts = scripts(repo);
    assert!(
        scripts.contains("scripts/test.sh")
            && scripts.contains("tests/controlplane/gen-replaces.sh")
            && scripts.contains("examples/fencing/kubernetes.sh"),
        "{scripts:?}"
    );
    for script in &scripts {
        assert!(
            words.contains(&script.as_str()),
            "justfile: no recipe runs {script}"
        );
    }
    let targets = test_targets(repo);
    assert!(
        targets.contains("e2e") && targets.contains("faults"),
        "{targets:?}"
    );
    let tested: BTreeSet<&str> = words
        .windows(2)
        .filter(|w| w[0] == "--test")
        .map(|w| w[1])
        .collect();
    for target in &targets {
        assert!(
            tested.contains(target.as_str()),
            "justfile: no recipe runs `cargo test --test {target}`"
        );
    }

    // The product's unit tests, and each fuzz target.
    assert!(
        commands.iter().any(|c| c.starts_with("cargo test --lib")),
        "justfile: no recipe runs the unit tests (`cargo test --lib`)"
    );
    for entry in std::fs::read_dir(repo.join("fuzz/fuzz_targets"))
        .unwrap()
        .flatten()
    {
        let name = entry
            .path()
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(
            commands
                .iter()
                .any(|c| c.contains("cargo fuzz run") && c.split_whitespace().any(|w| w == name)),
            "justfile: no recipe runs the fuzz target {name}"
        );
    }

    // Each bench target.
    let manifest = std::fs::read_to_string(repo.join("Cargo.toml")).unwrap();
    let benches: Vec<&str> = manifest
        .split("[[bench]]")
        .skip(1)
        .filter_map(|table| {
            let line = table.lines().find(|l| l.starts_with("name = "))?;
            Some(line.trim_start_matches("name = ").trim_matches('"'))
        })
        .collect();
    assert!(benches.contains(&"targetlease"), "{benches:?}");
    let benched: BTreeSet<&str> = words
        .windows(2)
        .filter(|w| w[0] == "--bench")
        .map(|w| w[1])
        .collect();
    for bench in &benches {
        assert!(
            benched.contains(bench),
            "justfile: no recipe runs `cargo bench --bench {bench}`"
        );
    }

    // CI's entry point, and each workspace member with tests of its own
    // (`cargo test -p NAME`).
    assert!(
        words.contains(&".ci/run"),
        "justfile: no recipe runs .ci/run"
    );
    let members = members_with_tests(repo);
    assert!(members.contains("targetlease-faults"), "{members:?}");
    let packages: BTreeSet<&str> = words
        .windows(2)
        .filter(|w| w[0] == "-p")
        .map(|w| w[1])
        .collect();
    for member in &members {
        assert!(
            packages.contains(member.as_str()),
            "justfile: no recipe runs `cargo test -p {member}`"
        );
    }
    for package in &packages {
        assert!(
            members.contains(*package),
            "justfile: there is no workspace member {package} with tests"
        );
    }

    // And every recipe runs something that exists.
    for word in &words {
        let script = word.ends_with(".sh") || word.ends_with(".py");
        let ours = ["scripts/", "tests/", "examples/"];
        if script && ours.iter().any(|dir| word.starts_with(dir)) {
            assert!(scripts.contains(*word), "justfile: {word} does not exist");
        }
    }
    for target in &tested {
        assert!(
            targets.contains(*target),
            "justfile: there is no test target {target}"
        );
    }
}

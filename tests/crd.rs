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

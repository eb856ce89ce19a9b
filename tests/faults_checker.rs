//! Unit tests of the fault matrix's checker (`tests/faults/check/`): every
//! property on clean synthetic histories and on the synthetic positive
//! controls (a reissued token, an unguarded table, a lost write, a lying
//! store, a second Held status, two marked pods). The matrix itself runs as
//! the `faults` test target (`scripts/faults.sh`).

#[path = "faults/args.rs"]
mod args;
#[path = "faults/check/mod.rs"]
mod check;
#[path = "faults/history.rs"]
mod history;

/// The matrix's command line: libtest flags and their values are not
/// filters, `--skip` drops scenarios and never turns on long mode.
#[test]
fn the_command_line_ignores_libtest_flags_and_their_values() {
    let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let a = argv(&[
        "--test-threads",
        "1",
        "--nocapture",
        "holder",
        "--skip",
        "long",
    ]);
    assert_eq!(
        args::words(&a),
        args::Words {
            words: vec!["holder"],
            skips: vec!["long"],
        }
    );
    let a = argv(&["long", "--skip=operator", "--format", "terse", "oom"]);
    assert_eq!(
        args::words(&a),
        args::Words {
            words: vec!["long", "oom"],
            skips: vec!["operator"],
        }
    );
}

//! Unit tests of the fault matrix's checker (`tests/faults/check/`): every
//! property on clean synthetic histories and on synthetic versions of what
//! the positive controls break (a reissued token, an unguarded table, a
//! lost write, lies of every operation, a second Held status, two marked
//! pods, marks the status does not name, Held kept after the lease ended,
//! watch gaps). The matrix itself runs as the `faults` test target
//! (`scripts/faults.sh`, built with the product's fail points).

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
    let a = argv(&["--shuffle-seed", "1", "--skip=", "--skip"]);
    assert_eq!(
        args::words(&a),
        args::Words {
            words: vec![],
            skips: vec![],
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

/// A scenario's whole name chooses it alone; any other word chooses every
/// name that contains it; `--skip` words drop the same way.
#[test]
fn a_whole_name_chooses_one_scenario_and_a_word_every_name_containing_it() {
    let all = || {
        vec![
            "restart-aof-everysec",
            "restart-aof-everysec-durability-aof",
            "apiserver-restart",
            "baseline",
        ]
    };
    let choose = |w: &[&str], s: &[&str]| args::choose(all(), |n| n, w, s);
    assert_eq!(
        choose(&["restart-aof-everysec"], &[]),
        ["restart-aof-everysec"]
    );
    assert_eq!(
        choose(&["restart"], &[]),
        [
            "restart-aof-everysec",
            "restart-aof-everysec-durability-aof",
            "apiserver-restart"
        ]
    );
    assert_eq!(choose(&[], &["restart"]), ["baseline"]);
    assert_eq!(
        choose(&["restart"], &["restart-aof-everysec"]),
        ["restart-aof-everysec-durability-aof", "apiserver-restart"]
    );
    assert_eq!(choose(&[], &[]), all());
    // In the order of the words that choose them, each once.
    assert_eq!(
        choose(&["baseline", "restart-aof-everysec", "aof"], &[]),
        [
            "baseline",
            "restart-aof-everysec",
            "restart-aof-everysec-durability-aof"
        ]
    );
}

//! Unit tests of the fault matrix's checker (`tests/faults/check/`): every
//! property on clean synthetic histories and on synthetic versions of what
//! the positive controls break (a reissued token, an unguarded table, a
//! lost write, lies of every operation, a second Held status, two marked
//! pods, marks the status does not name, Held kept after the lease ended,
//! watch gaps), and the power cut's record of what is on the disk (the
//! shim preloaded into real processes). The matrix itself runs as the
//! `faults` test target (`scripts/faults.sh`, built with the product's fail
//! points).

#[path = "faults/args.rs"]
mod args;
#[path = "faults/check/mod.rs"]
mod check;
#[path = "faults/history.rs"]
mod history;
#[allow(dead_code)] // the matrix uses the rest
#[path = "faults/valkey/powerloss.rs"]
mod powerloss;

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

/// Writes `bytes` to `file` with dd under the power-loss shim, fsynced
/// (`conv=fsync`) or not, appending when the file exists.
fn dd_under_shim(log: &std::path::Path, file: &std::path::Path, bytes: usize, fsync: bool) {
    let mut cmd = std::process::Command::new("dd");
    cmd.arg("if=/dev/zero")
        .arg(format!("of={}", file.display()))
        .arg(format!("bs={bytes}"))
        .arg("count=1")
        .arg("status=none");
    if file.exists() {
        cmd.args(["oflag=append", "conv=notrunc"]);
        if fsync {
            cmd.arg("conv=notrunc,fsync");
        }
    } else if fsync {
        cmd.arg("conv=fsync");
    }
    let status = cmd.envs(powerloss::env(log)).status().expect("run dd");
    assert!(status.success(), "dd failed");
}

/// A cut keeps what was fsynced and nothing after it: the shim, preloaded
/// into real processes, records each file's fsynced length by inode (so a
/// rename keeps it), a file never fsynced is emptied, files it never saw
/// stay whole.
#[test]
fn a_power_cut_keeps_what_was_fsynced_and_nothing_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let aof = dir.path().join("appendonlydir");
    std::fs::create_dir(&aof).unwrap();
    let log = dir.path().join("durable.log");
    let incr = aof.join("appendonly.aof.1.incr.aof");
    dd_under_shim(&log, &incr, 100, true);
    dd_under_shim(&log, &incr, 50, false);
    // Fsynced under a temporary name, then renamed: still on the disk.
    let tmp = aof.join("temp-manifest");
    dd_under_shim(&log, &tmp, 30, true);
    let manifest = aof.join("appendonly.aof.manifest");
    std::fs::rename(&tmp, &manifest).unwrap();
    let never = aof.join("appendonly.aof.2.incr.aof");
    dd_under_shim(&log, &never, 20, false);
    // Written without the shim: not an append-only file it saw.
    let other = aof.join("other");
    std::fs::write(&other, [0u8; 40]).unwrap();

    let cut = powerloss::cut(dir.path(), &log, powerloss::Disk::Honest);
    let len = |p: &std::path::Path| std::fs::metadata(p).unwrap().len();
    assert_eq!(len(&incr), 100, "the unsynced append is gone");
    assert_eq!(len(&manifest), 30, "the renamed file keeps its fsync");
    assert_eq!(len(&never), 0, "a file never fsynced keeps nothing");
    assert_eq!(len(&other), 40);
    assert_eq!(cut.tracked, 3);
    assert_eq!(cut.bytes, 50 + 20);
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "",
        "the log starts again"
    );

    // A disk whose cache loses its last second loses the fsync too.
    dd_under_shim(&log, &incr, 10, true);
    let cut = powerloss::cut(dir.path(), &log, powerloss::Disk::CacheLosesFsyncs);
    assert_eq!(len(&incr), 100);
    assert_eq!(cut.bytes, 10);
}

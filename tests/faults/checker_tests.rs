//! Unit tests of the fault matrix's checker (`check/`): every
//! property on clean synthetic histories and on synthetic versions of what
//! the positive controls break (a reissued token, an unguarded table, a
//! lost write, lies of every operation, a second Held status, two marked
//! pods, marks the status does not name, Held kept after the lease ended,
//! watch gaps), recovery per part, the packed form histories are kept in,
//! and the power cut's record of what is on the disk and its slow disk
//! (the shim preloaded into real processes). The matrix itself runs as the
//! root package's `faults` test target (`scripts/faults.sh`, built with the
//! product's fail points).

use crate::valkey::powerloss;
use crate::{args, check, history, pack};

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

/// A packed history reads back as the history it was, its request ids
/// renamed consistently (the checker compares them only with each other):
/// the checker finds the same violations in both.
#[test]
fn a_packed_history_reads_back_whole_and_is_judged_the_same() {
    use check::fixtures::{H, said, view};
    use history::{Answer, Sink};
    let (a, b) = (
        "0b8d4c8e-6a3f-4c1e-9d2a-5f7e8a9b0c1d",
        "7f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0",
    );
    let h = H::new()
        .at(1_796_410_000_000)
        .acquired("lib0", "t0", a, 7, 1_796_410_000_001, 1_796_410_010_001)
        .acquire_answer(
            "lib1",
            "t0",
            b,
            said("held"),
            Some(view("lib0", 7, a, 1, 9)),
            5,
        )
        .acquire_answer("cli0", "t1", "r3", Answer::Unknown, None, 0)
        .renew(
            "lib0",
            "t0",
            (a, 7),
            said("renewed"),
            1_796_410_000_050,
            1_796_410_010_050,
        )
        .write(Sink::Postgres, "t0", 7, "lib0-1", said("accepted"), 0)
        .write(
            Sink::Commit,
            "t0",
            7,
            "lib0-1",
            said("committed"),
            1_796_410_000_060,
        )
        // The same token granted again: a violation the packed form must keep.
        .acquired("lib1", "t0", b, 7, 1_796_410_000_070, 1_796_410_010_070)
        .look("t0", None, 1_796_410_000_080)
        .read("t0", Some((7, "lib0-1")), 1_796_410_000_090)
        .publish("x", "op", 3, Some(2), Some(("first-x", 100, 900)))
        .pod("p1", 4, &[("el", 2, 900)])
        .lossy_fault()
        .fault("restart", 1_796_410_000_100, 1_796_410_000_200)
        .rows(&[("t0", 1, 7, "lib0-1")])
        .commits(&[("t0", 7, "lib0-1")])
        .stopped(1_796_410_009_000)
        .build();
    let packed = pack::pack(&h);
    let text = serde_json::to_string(&packed).unwrap();
    assert!(
        !text.contains(a) && !text.contains(b),
        "request ids renamed"
    );
    let back = pack::unpack(serde_json::from_str(&text).unwrap()).expect("unpack");
    let mut want = serde_json::to_value(&h).unwrap();
    let ids = [(a, "~0"), (b, "~1")];
    fn renamed(v: &mut serde_json::Value, ids: &[(&str, &str)]) {
        match v {
            serde_json::Value::String(s) => {
                if let Some((_, to)) = ids.iter().find(|(from, _)| from == s) {
                    *s = to.to_string();
                }
            }
            serde_json::Value::Array(x) => x.iter_mut().for_each(|x| renamed(x, ids)),
            serde_json::Value::Object(m) => m.values_mut().for_each(|x| renamed(x, ids)),
            _ => {}
        }
    }
    renamed(&mut want, &ids);
    assert_eq!(serde_json::to_value(&back).unwrap(), want);
    let counts = |h: &history::History| check::check(h).counts();
    assert!(!counts(&h).is_empty());
    assert_eq!(counts(&back), counts(&h));
}

/// The slow disk of the `restart-slow-fsync-*` rows: every fsync of an
/// append-only file takes the shim's delay, other files' fsyncs do not.
#[test]
fn a_slow_disk_takes_its_time_over_each_fsync_of_an_append_only_file() {
    let dir = tempfile::tempdir().unwrap();
    let aof = dir.path().join("appendonlydir");
    std::fs::create_dir(&aof).unwrap();
    let log = dir.path().join("durable.log");
    let timed = |file: &std::path::Path| {
        let started = std::time::Instant::now();
        let status = std::process::Command::new("dd")
            .arg("if=/dev/zero")
            .arg(format!("of={}", file.display()))
            .args(["bs=10", "count=1", "status=none", "conv=fsync"])
            .envs(powerloss::env_on(&log, powerloss::Disk::SlowFsync))
            .status()
            .expect("run dd");
        assert!(status.success());
        started.elapsed()
    };
    let slow = timed(&aof.join("appendonly.aof.1.incr.aof"));
    assert!(slow >= powerloss::SLOW_FSYNC, "{slow:?}");
    let other = timed(&dir.path().join("other"));
    assert!(other < powerloss::SLOW_FSYNC, "{other:?}");
}

/// Which records of an older checker count as judged by the current one:
/// those whose rules did not change for their store, or in which the older
/// checker found nothing the newer one could find more of.
#[test]
fn an_older_record_counts_only_where_the_rules_are_the_same_or_it_found_nothing() {
    use history::Dating::{ClientBeforeSend, Store};
    assert_eq!(check::CHECKER, 7);
    assert_eq!(check::counts_as(6, Store, 3), 7);
    assert_eq!(check::counts_as(6, ClientBeforeSend, 0), 7);
    assert_eq!(check::counts_as(6, ClientBeforeSend, 1), 6);
    assert_eq!(check::counts_as(5, Store, 0), 5);
    assert_eq!(check::counts_as(7, ClientBeforeSend, 2), 7);
    let dating = |name: &str| {
        crate::scenarios::all()
            .into_iter()
            .find(|s| s.name == name)
            .map(|s| s.backend.dating())
    };
    assert_eq!(dating("etcd-baseline"), Some(ClientBeforeSend));
    assert_eq!(dating("etcd-operator-kill"), Some(ClientBeforeSend));
    // The API server's etcd compacted under an operator on Valkey.
    assert_eq!(dating("apiserver-compaction"), Some(Store));
    assert_eq!(dating("baseline"), Some(Store));
}

/// The page's rows and `fill`'s count read records through that rule: an
/// etcd record of 6 with a violation stays in a row of its own, marked
/// older, one without counts with the current version's runs.
#[test]
fn records_of_an_older_checker_are_counted_or_kept_apart_by_the_rule() {
    use crate::check::{Property, Scope};
    use crate::{parts, report, scenarios};
    let dir = std::env::temp_dir().join(format!("faults-parts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let s = scenarios::all()
        .into_iter()
        .find(|s| s.name == "etcd-baseline")
        .unwrap();
    let record = |checker: u32, violations: usize| {
        let mut fig = report::Figures::default();
        if violations > 0 {
            fig.violations
                .insert((Property::Honesty, Scope::Lease), violations);
        }
        let failures = if violations > 0 {
            vec!["a violation".to_string()]
        } else {
            Vec::new()
        };
        parts::Record {
            checker,
            ..parts::Record::new(300, &fig, false, &failures)
        }
    };
    parts::rewrite(
        &dir,
        &s,
        &[record(6, 0), record(6, 1), record(7, 0), record(5, 0)],
    );
    assert_eq!(parts::current_runs(&dir, &s, 300), 2);
    let rows = parts::rows(&dir, std::slice::from_ref(&s));
    let versions: Vec<(Option<u32>, usize, usize)> = rows
        .iter()
        .map(|r| (r.checker, r.runs.len(), r.failed))
        .collect();
    assert_eq!(
        versions,
        vec![(Some(7), 2, 0), (Some(6), 1, 1), (Some(5), 1, 0)]
    );
    assert_eq!(rows[0].carried.get(&6), Some(&1));
    std::fs::remove_dir_all(&dir).unwrap();
}

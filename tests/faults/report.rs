//! Judging runs: which violations fail, which are only measured, whether a
//! control was caught, whether the fault and the workload actually did
//! something, whether every part recovered (rendered by `page.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::check::{Property, Scope, liveness, recovery};
use crate::history::{Answer, Sink};
use crate::run::RunResult;
use crate::scenarios::{Backend, Fault, Scenario};

/// The figures of one run (recorded per run in long mode: parts.rs).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Figures {
    pub elapsed: Duration,
    pub ops: usize,
    pub writes: usize,
    pub faults: usize,
    pub refused_stale: usize,
    /// Operations and writes answered `outcome_unknown` / `backend_unavailable`.
    pub unknown: usize,
    pub unavailable: usize,
    /// Calls that outlived their deadline by far (each fails the run).
    pub hangs: usize,
    /// TargetLease and pod versions the watches recorded, and their relists.
    pub published: usize,
    pub relists: u64,
    #[serde(with = "violation_list")]
    pub violations: BTreeMap<(Property, Scope), usize>,
    /// The checker's windows in ms (`Report::windows`); runs recorded
    /// before they were measured have none.
    #[serde(default, with = "violation_list")]
    pub windows: BTreeMap<(Property, Scope), usize>,
    /// What the fault did, as the servers and the harness counted it.
    #[serde(default)]
    pub effects: BTreeMap<String, u64>,
    /// Per healed fault after which every part succeeded again before the
    /// next fault: ms until the last of them did.
    #[serde(default)]
    pub recovery_ms: Vec<u64>,
    /// Healed faults after which some part had not succeeded again when the
    /// next fault began (or the run ended).
    #[serde(default)]
    pub unrecovered: usize,
    /// Healed faults followed by at least the recovery bound without another
    /// fault: those the bound judged.
    #[serde(default)]
    pub judged: usize,
}

/// The effect a fault must show, as (what, counter or check); `None` for
/// faults judged elsewhere (the paused holder's refused writes, relists).
fn required_effect(fault: Fault) -> &'static [&'static str] {
    match fault {
        Fault::None | Fault::PauseHolder | Fault::EtcdCompaction => &[],
        Fault::SentinelFailover => &["Sentinel promotions", crate::scenarios::LAG_RENEWALS],
        Fault::Restart => &["restarts (a new server process)"],
        Fault::KillUnwritten => &[
            "restarts (a new server process)",
            crate::scenarios::POSTPONED_KILLS,
            crate::scenarios::UNWRITTEN,
        ],
        Fault::PowerCut => &["power cuts (restarted from the fsynced AOF)"],
        Fault::ClockJump => &["Valkey TIME moved forward (ms)"],
        Fault::FunctionFlush => &["FUNCTION FLUSH done", "failed FCALLs", "FUNCTION LOADs"],
        Fault::Busy => &["1.5 s scripts run", "BUSY errors", "BUSY answers"],
        Fault::Oom => &["maxmemory 1 set and reset", "OOM errors", "OOM answers"],
        Fault::ProxyCut => &["proxy cuts"],
        Fault::ProxyDelay
        | Fault::ProxyDropReplies
        | Fault::ProxyBlackhole
        | Fault::ProxyLoseWrites => &["unknown or unavailable answers"],
        Fault::OperatorKill => &["operators killed and started again"],
        Fault::OperatorPause => &["leading operators paused past their leadership"],
        Fault::ApiserverRestart => &["kube-apiserver restarted (a new process)"],
        Fault::ValkeyLossOperatorDown => &["Valkey flushed while the operator was down"],
        Fault::EtcdLeaderKill => &[
            "etcd leaders killed and started again",
            "new etcd leaders elected",
        ],
        Fault::EtcdLeaderKillBehind => &[
            BEHIND_KILLS,
            "new etcd leaders elected",
            KILLS_BEHIND,
            crate::scenarios::LAG_RENEWALS,
        ],
        Fault::EtcdLeaderPause => &[
            "etcd leaders stopped past the election timeout",
            "new etcd leaders elected while the old one was stopped",
        ],
        Fault::EtcdPartitionLeader => &[
            "etcd leaders cut off from their peers",
            "new etcd leaders elected while the old one was cut off",
        ],
    }
}

/// What the held-behind leader kill counts of itself.
pub const BEHIND_KILLS: &str = "etcd leaders killed with a follower held behind";
/// Every held-behind kill must come after the others committed without it.
pub const KILLS_BEHIND: &str =
    "held-behind kills after which the others had committed without the follower";
/// New leaders that were the member held behind: any fails the run.
pub const HELD_BEHIND_LED: &str = "new etcd leaders that had been held behind";
/// Holds after which no leader was seen: they end without a kill.
pub const HOLDS_WITHOUT_LEADER: &str = "holds ended without a leader seen (no kill)";
/// Kills of the member to hold behind when it led, and new leaders after.
pub const BEHIND_LED: &str =
    "etcd leaders killed alone before a hold (the follower to hold back led)";
pub const AFTER_BEHIND_LED: &str = "new etcd leaders elected after those lone kills";

/// For the etcd leader faults: the effects counting the faults and the
/// ones counting the new leaders seen after them, which must be equal.
fn leader_changes(fault: Fault) -> Vec<(&'static str, &'static str)> {
    let mut pairs = match required_effect(fault) {
        [done, seen, ..]
            if matches!(
                fault,
                Fault::EtcdLeaderKill
                    | Fault::EtcdLeaderKillBehind
                    | Fault::EtcdLeaderPause
                    | Fault::EtcdPartitionLeader
            ) =>
        {
            vec![(*done, *seen)]
        }
        _ => Vec::new(),
    };
    if fault == Fault::EtcdLeaderKillBehind {
        pairs.push((BEHIND_LED, AFTER_BEHIND_LED));
    }
    pairs
}

/// Effects that fail a run of `fault` if any was counted.
fn never(fault: Fault) -> &'static [&'static str] {
    match fault {
        Fault::EtcdLeaderKillBehind => &[HELD_BEHIND_LED],
        _ => &[],
    }
}

/// Every effect a run of `s` must show: its fault's and its own.
fn required(s: &Scenario) -> impl Iterator<Item = &'static str> + '_ {
    required_effect(s.fault).iter().chain(s.effects).copied()
}

/// Effects published with the required ones, whatever their count: what a
/// power cut removed is shown for `appendfsync always` too, where it is
/// little or nothing and need not be more.
fn shown(s: &Scenario) -> impl Iterator<Item = &'static str> + '_ {
    let also: &[&str] = match s.fault {
        Fault::PowerCut => &[crate::scenarios::UNSYNCED_CUT],
        // 0 with `replicas:1`, and that is the point.
        Fault::SentinelFailover => &[crate::scenarios::LAG_RENEWED, crate::scenarios::LAG_GRANTED],
        Fault::EtcdLeaderKillBehind => &[BEHIND_LED, AFTER_BEHIND_LED, HOLDS_WITHOUT_LEADER],
        _ => &[],
    };
    // On etcd: how long the store kept targets taken past their holders'
    // deadlines (a leader change restarts every lease's TTL).
    let etcd = matches!(s.backend, Backend::Etcd(_)).then_some(LINGERED);
    required(s)
        .chain(also.iter().copied())
        .chain(never(s.fault).iter().copied())
        .chain(etcd)
}

/// The longest an observer saw a lease past its holder's deadline (the
/// store keeps the target taken until its record goes: on etcd, the TTL
/// rounded up to whole seconds, the 500 ms expiry ticker, and a leader
/// change restarting the TTL).
const LINGERED: &str = "longest a lease was seen past its deadline (ms)";

/// Whether the effect `name` is a run's maximum (several runs' figures are
/// then their maximum, not their sum, as the other effects are counts).
pub fn is_maximum(name: &str) -> bool {
    name == LINGERED
}

/// From the time each sighting carries: on etcd the client's clock before
/// the read was sent, so the figure there is a lower bound.
fn lingered(h: &crate::history::History) -> u64 {
    h.sightings
        .iter()
        .filter_map(|s| s.server_ms.checked_sub(s.lease.as_ref()?.expires_at_ms))
        .max()
        .unwrap_or(0)
}

/// Counts (or windows) per property and scope as a list of `[property,
/// scope, n]` (JSON keys are strings, not pairs).
mod violation_list {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::check::{Property, Scope};

    type Counts = BTreeMap<(Property, Scope), usize>;

    pub fn serialize<S: Serializer>(counts: &Counts, s: S) -> Result<S::Ok, S::Error> {
        let list: Vec<(Property, Scope, usize)> =
            counts.iter().map(|(&(p, sc), &n)| (p, sc, n)).collect();
        list.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Counts, D::Error> {
        let list = Vec::<(Property, Scope, usize)>::deserialize(d)?;
        Ok(list.into_iter().map(|(p, sc, n)| ((p, sc), n)).collect())
    }
}

fn answers(h: &crate::history::History, a: &Answer) -> usize {
    h.ops.iter().filter(|o| &o.answer == a).count()
        + h.writes.iter().filter(|w| &w.answer == a).count()
}

/// Judges one run: the figures and every reason it fails (none: it passes).
pub fn judge(s: &Scenario, r: &RunResult) -> (Figures, Vec<String>) {
    let h = &r.history;
    let mut effects = h.effects.clone();
    let answered = |word: &str| h.ops.iter().filter(|o| o.detail.contains(word)).count() as u64;
    effects.insert("BUSY answers".into(), answered("BUSY"));
    effects.insert("OOM answers".into(), answered("OOM"));
    effects.insert(LINGERED.into(), lingered(h));
    effects.insert(
        "unknown or unavailable answers".into(),
        (answers(h, &Answer::Unknown) + answers(h, &Answer::Unavailable)) as u64,
    );
    let parts = liveness::Parts {
        operator: s.backend.operator().is_some(),
        sinks_may_fail: s.is_control(),
    };
    let bound = s.recovery_bound().as_millis() as u64;
    let recovered = recovery::recovery(h, parts, bound);
    let fig = Figures {
        elapsed: r.elapsed,
        ops: h.ops.len(),
        writes: h.writes.len(),
        faults: h.faults.len(),
        refused_stale: h
            .writes
            .iter()
            .filter(|w| w.sink == Sink::Postgres && w.answer.is("refused"))
            .count(),
        unknown: answers(h, &Answer::Unknown),
        unavailable: answers(h, &Answer::Unavailable),
        hangs: h.hangs.len(),
        published: h.publications.len() + h.pods.len(),
        relists: h.relists,
        violations: r.report.counts(),
        windows: r.report.windows.clone(),
        effects: shown(s)
            .map(|k| (k.to_string(), effects.get(k).copied().unwrap_or(0)))
            .collect(),
        recovery_ms: recovered.times,
        unrecovered: recovered.unrecovered,
        judged: recovered.judged,
    };
    let mut failures = Vec::new();
    if s.is_control() {
        for e in s.expect.iter().filter(|e| e.count(&r.report) == 0) {
            failures.push(format!(
                "control not caught: expected a violation {}",
                e.describe()
            ));
        }
    } else {
        for v in &r.report.violations {
            if !s.measured.contains(&(v.property, v.scope)) {
                failures.push(format!("violation: {v}"));
            }
        }
    }
    for &(p, scope) in s.must_show {
        if r.report.count(p, scope) == 0 {
            failures.push(format!(
                "the lossy mode showed no cost: ({}) in {} is 0 (a run that shows none \
                 tested nothing)",
                p.letter(),
                scope.name()
            ));
        }
    }
    for idle in liveness::idle(h, parts) {
        failures.push(format!("the workload did nothing: {idle}"));
    }
    if let Some(invalid) = liveness::first_invalid(h) {
        failures.push(format!(
            "a request the store rejected as invalid ({invalid})"
        ));
    }
    if s.fault != Fault::None && fig.faults == 0 {
        failures.push("the fault was never injected".into());
    }
    for what in required(s) {
        if fig.effects.get(what).copied().unwrap_or(0) == 0 {
            failures.push(format!("the fault had no effect: no {what}"));
        }
    }
    // Each leader killed or stopped must be followed by another leading,
    // not only one of them per run.
    let count = |what| fig.effects.get(what).copied().unwrap_or(0);
    for (done, seen) in leader_changes(s.fault) {
        if count(done) != count(seen) {
            failures.push(format!(
                "{} {done} but {} {seen}: a leader fault without its new leader",
                count(done),
                count(seen)
            ));
        }
    }
    if s.fault == Fault::EtcdLeaderKillBehind && count(BEHIND_KILLS) != count(KILLS_BEHIND) {
        failures.push(format!(
            "{} {BEHIND_KILLS} but {} {KILLS_BEHIND}: a follower not held behind",
            count(BEHIND_KILLS),
            count(KILLS_BEHIND)
        ));
    }
    for what in never(s.fault) {
        if count(what) > 0 {
            failures.push(format!("{} {what}", count(what)));
        }
    }
    // Where the fault wipes the counters, PostgreSQL rightly refuses the
    // tokens issued again until the counter passes the highest it accepted,
    // as high as it climbed in the schedule's fault-free gap: that takes
    // about the gap, just past the bound by construction. Shown in the
    // figures, not failed on.
    let refusing_by_design = |u: &String| s.wipes_counters && u.starts_with("PostgreSQL");
    for u in recovered.failures.iter().filter(|u| !refusing_by_design(u)) {
        failures.push(format!("no recovery: {u}"));
    }
    for hang in &h.hangs {
        failures.push(format!("hang: {hang}"));
    }
    if s.fault == Fault::EtcdCompaction && h.relists == 0 {
        failures.push("no watch had to relist: the compaction did not bite".into());
    }
    if s.fault == Fault::PauseHolder && s.control.is_none() {
        let stale = h.writes.iter().any(|w| {
            w.client == "paused"
                && w.sink == Sink::Postgres
                && w.answer == Answer::Said("refused".into())
        });
        if !stale {
            failures.push("the paused holder never had a stale write refused".into());
        }
    }
    (fig, failures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::fixtures::{H, said};

    /// Every client is back at once after a restart; PostgreSQL refuses
    /// every write after it (the tokens issued again are below its floor)
    /// until the run ends, 19 s later.
    fn sink_refusing_after_a_restart() -> RunResult {
        let succeed = |h: H, at: u64, pg: &str| {
            h.at(at)
                .acquire_answer("lib0", "t", &format!("a{at}"), said("held"), None, 0)
                .acquire_answer("lib1", "t", &format!("b{at}"), said("held"), None, 0)
                .acquire_answer("cli0", "t", &format!("c{at}"), said("held"), None, 0)
                .write(Sink::Postgres, "t", 1, &format!("p{at}"), said(pg), 0)
                .write(
                    Sink::Commit,
                    "t",
                    1,
                    &format!("k{at}"),
                    said("committed"),
                    0,
                )
        };
        let h = succeed(H::new(), 100, "accepted")
            .fault("restart", 900, 1000)
            .pipe(|h| succeed(h, 1500, "refused"))
            .stopped(20_000)
            .build();
        RunResult {
            report: crate::check::check(&h),
            history: h,
            elapsed: Duration::from_secs(20),
        }
    }

    fn scenario(name: &str) -> Scenario {
        crate::scenarios::all()
            .into_iter()
            .find(|s| s.name == name)
            .expect("a scenario")
    }

    fn judged(name: &str) -> (Figures, Vec<String>) {
        judge(&scenario(name), &sink_refusing_after_a_restart())
    }

    /// The failures that say `sink` did not recover.
    fn sink_failures(failures: &[String], sink: &str) -> usize {
        let prefix = format!("no recovery: {sink}");
        failures.iter().filter(|f| f.starts_with(&prefix)).count()
    }

    /// The sinks must come back within the bound, whatever the mode may
    /// lose, except PostgreSQL where the fault wipes the counters; its
    /// recovery still shows in the figures there.
    #[test]
    fn sinks_are_held_to_the_bound_except_postgresql_where_the_counters_are_wiped() {
        for held in [
            "restart-aof-always",
            "failover-durability-none",
            "powerloss-aof-everysec",
            "operator-valkey-data-loss",
        ] {
            let (_, failures) = judged(held);
            assert_eq!(sink_failures(&failures, "PostgreSQL"), 1, "{held}");
        }
        let (fig, failures) = judged("restart-no-persistence");
        assert_eq!(sink_failures(&failures, "PostgreSQL"), 0);
        assert_eq!(
            fig.unrecovered, 1,
            "PostgreSQL is still counted in the figures"
        );
    }

    /// `lease commit` is held to the bound everywhere: its value and the
    /// counter are lost together, so a commit's token never falls below it.
    #[test]
    fn lease_commit_is_held_to_the_bound_where_the_counters_are_wiped() {
        let mut run = sink_refusing_after_a_restart();
        for w in run.history.writes.iter_mut() {
            if w.complete_ms > 1000 {
                w.answer = said(if w.sink == Sink::Postgres {
                    "accepted"
                } else {
                    "refused"
                });
            }
        }
        let s = scenario("restart-no-persistence");
        let (_, failures) = judge(&s, &run);
        assert_eq!(sink_failures(&failures, "lease commit"), 1);
    }

    /// The held-behind kill fails a run whose new leader was the member
    /// held behind, and one whose plain kill saw no new leader; counted as
    /// they should be, its effects fail nothing.
    #[test]
    fn the_member_held_behind_must_never_lead() {
        let s = scenario("etcd-leader-kill-one-behind");
        let failures_with = |counts: &[(&str, u64)]| {
            let mut run = sink_refusing_after_a_restart();
            for &(what, n) in counts {
                run.history.effects.insert(what.into(), n);
            }
            let (fig, failures) = judge(&s, &run);
            assert!(fig.effects.contains_key(HELD_BEHIND_LED), "shown, even 0");
            failures
        };
        let about =
            |failures: &[String], what: &str| failures.iter().filter(|f| f.contains(what)).count();
        let sound = [
            (BEHIND_KILLS, 3),
            ("new etcd leaders elected", 3),
            (KILLS_BEHIND, 3),
            (BEHIND_LED, 1),
            (AFTER_BEHIND_LED, 1),
        ];
        let failures = failures_with(&sound);
        assert_eq!(about(&failures, "held behind"), 0, "{failures:?}");
        assert_eq!(about(&failures, "without its new leader"), 0);

        let mut led = sound.to_vec();
        led.push((HELD_BEHIND_LED, 1));
        let failures = failures_with(&led);
        assert_eq!(about(&failures, HELD_BEHIND_LED), 1, "{failures:?}");

        let mut unseen = sound.to_vec();
        unseen[4] = (AFTER_BEHIND_LED, 0);
        let failures = failures_with(&unseen);
        assert_eq!(
            about(&failures, "without its new leader"),
            1,
            "{failures:?}"
        );

        let mut level = sound.to_vec();
        level[2] = (KILLS_BEHIND, 2);
        let failures = failures_with(&level);
        assert_eq!(about(&failures, "not held behind"), 1, "{failures:?}");
    }
}

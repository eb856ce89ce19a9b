//! Judging runs (which violations fail, which are only measured, whether a
//! control was caught, whether the fault and the workload actually did
//! something) and rendering the figures as `docs/faults.md`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::check::{Property, Scope, liveness};
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
    /// Per healed fault, ms until every part had succeeded again.
    #[serde(default)]
    pub recovery_ms: Vec<u64>,
}

/// The effect a fault must show, as (what, counter or check); `None` for
/// faults judged elsewhere (the paused holder's refused writes, relists).
fn required_effect(fault: Fault) -> &'static [&'static str] {
    match fault {
        Fault::None | Fault::PauseHolder | Fault::EtcdCompaction => &[],
        Fault::SentinelFailover => &["Sentinel promotions"],
        Fault::Restart => &["restarts (a new server process)"],
        Fault::PowerCut => &["power cuts (restarted from the fsynced AOF)"],
        Fault::ClockJump => &["Valkey TIME moved forward (ms)"],
        Fault::ScriptFlush => &["SCRIPT FLUSH done", "NOSCRIPT errors", "EVAL calls"],
        Fault::Busy => &["1.5 s scripts run", "BUSY errors", "BUSY answers"],
        Fault::Oom => &["maxmemory 1 set and reset", "OOM errors", "OOM answers"],
        Fault::ProxyCut => &["proxy cuts"],
        Fault::ProxyDelay | Fault::ProxyDropReplies | Fault::ProxyBlackhole => {
            &["unknown or unavailable answers"]
        }
        Fault::OperatorKill => &["operators killed and started again"],
        Fault::OperatorPause => &["leading operators paused past their leadership"],
        Fault::ApiserverRestart => &["kube-apiserver restarted (a new process)"],
        Fault::ValkeyLossOperatorDown => &["Valkey flushed while the operator was down"],
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
        _ => &[],
    };
    required(s).chain(also.iter().copied())
}

/// How long every part may take to succeed again after a fault heals.
pub fn recovery_bound(s: &Scenario) -> u64 {
    s.ttl.as_millis() as u64 + 4000
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

/// One scenario's line in docs/faults.md.
#[derive(Clone, Debug)]
pub struct Row {
    pub scenario: Scenario,
    /// The run length asked for; 0 when nothing is recorded.
    pub secs: u64,
    pub runs: Vec<Figures>,
    /// Runs in which a control's expected violation was reported.
    pub caught: usize,
    /// Runs that failed (a promised property violated, a control not
    /// caught, a fault that never fired, a hang, an idle workload).
    pub failed: usize,
    /// The commits the runs were built from (empty when not recorded).
    pub commits: String,
    /// Recorded runs of other lengths, not in the figures: how many, and
    /// how many of them failed (a failure is never hidden).
    pub other_runs: usize,
    pub other_failed: usize,
    /// The most harness processes that ran at once beside any of the runs.
    pub at_once: usize,
    /// Record lines that could not be read (runs whose figures are lost).
    pub unreadable: usize,
    /// Which checker versions judged the runs: (version, runs, with a kept history).
    pub checkers: Vec<(u32, usize, usize)>,
}

impl Row {
    /// `10 x 300 s`, with the failed runs and the commits when known.
    fn runs_cell(&self) -> String {
        if self.runs.is_empty() && self.unreadable == 0 {
            return "none recorded yet".into();
        }
        let mut cell = if self.runs.is_empty() {
            "none readable".to_string()
        } else {
            format!("{} x {} s", self.runs.len(), self.secs)
        };
        if self.failed > 0 {
            cell += &format!(" (**{} failed**)", self.failed);
        }
        if self.other_runs > 0 {
            cell += &format!(
                "<br>not in the figures: {} run(s) of other lengths",
                self.other_runs
            );
            if self.other_failed > 0 {
                cell += &format!(" (**{} failed**)", self.other_failed);
            }
        }
        if !self.commits.is_empty() {
            cell += &format!("<br>at {}", self.commits);
        }
        if self.unreadable > 0 {
            cell += &format!("<br>**{} unreadable record line(s)**", self.unreadable);
        }
        if self.at_once > 1 {
            cell += &format!("<br>up to {} scenarios at once", self.at_once);
        }
        for (v, n, kept) in &self.checkers {
            cell += &format!("<br>checker v{v}: {n} run(s), {kept} with a kept history");
        }
        cell
    }
}

/// Judges one run: the figures and every reason it fails (none: it passes).
pub fn judge(s: &Scenario, r: &RunResult) -> (Figures, Vec<String>) {
    let h = &r.history;
    let mut effects = h.effects.clone();
    let answered = |word: &str| h.ops.iter().filter(|o| o.detail.contains(word)).count() as u64;
    effects.insert("BUSY answers".into(), answered("BUSY"));
    effects.insert("OOM answers".into(), answered("OOM"));
    effects.insert(
        "unknown or unavailable answers".into(),
        (answers(h, &Answer::Unknown) + answers(h, &Answer::Unavailable)) as u64,
    );
    let parts = liveness::Parts {
        operator: matches!(s.backend, Backend::Operator { .. }),
        sinks_may_fail: s.expect.is_some(),
    };
    let (recovery_ms, unrecovered) = liveness::recovery(h, parts, recovery_bound(s));
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
        recovery_ms,
    };
    let mut failures = Vec::new();
    if let Some(expect) = s.expect {
        if s.caught(&r.report) == 0 {
            failures.push(format!(
                "control not caught: expected a ({}) violation in {}{}",
                expect.0.letter(),
                expect.1.name(),
                if s.expect_words.is_empty() {
                    String::new()
                } else {
                    format!(" of a {}", s.expect_words.join(" or "))
                }
            ));
        }
    } else {
        for v in &r.report.violations {
            if !s.measured.contains(&(v.property, v.scope)) {
                failures.push(format!("violation: {v}"));
            }
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
    for u in unrecovered {
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

/// Sums the figures of several runs.
pub fn total(runs: &[Figures]) -> Figures {
    let mut t = Figures::default();
    for f in runs {
        t.elapsed += f.elapsed;
        t.ops += f.ops;
        t.writes += f.writes;
        t.faults += f.faults;
        t.refused_stale += f.refused_stale;
        t.unknown += f.unknown;
        t.unavailable += f.unavailable;
        t.hangs += f.hangs;
        t.published += f.published;
        t.relists += f.relists;
        for (k, v) in &f.violations {
            *t.violations.entry(*k).or_default() += v;
        }
        for (k, v) in &f.effects {
            *t.effects.entry(k.clone()).or_default() += v;
        }
        t.recovery_ms.extend(&f.recovery_ms);
        // A window is the longest seen in any run, not a sum.
        for (k, v) in &f.windows {
            let w = t.windows.entry(*k).or_default();
            *w = (*w).max(*v);
        }
    }
    t
}

/// The violations column of one property: per scope, `n` (failed on) or
/// `n measured`.
fn cell(s: &Scenario, f: &Figures, p: Property) -> String {
    let mut parts = Vec::new();
    for scope in Scope::ALL {
        let n = f.violations.get(&(p, scope)).copied().unwrap_or(0);
        if s.measured.contains(&(p, scope)) {
            let window = match f.windows.get(&(p, scope)) {
                Some(&ms) if ms >= 10_000 => format!(", longest {:.0} s", ms as f64 / 1000.0),
                Some(&ms) if ms >= 1000 => format!(", longest {:.1} s", ms as f64 / 1000.0),
                Some(&ms) => format!(", longest {ms} ms"),
                None => String::new(),
            };
            parts.push(format!("{n} measured ({}{window})", scope.name()));
        } else if n > 0 {
            parts.push(format!("**{n}** ({})", scope.name()));
        }
    }
    if parts.is_empty() {
        "0".into()
    } else {
        parts.join("<br>")
    }
}

/// The fault's verified effect: each counter it must show, summed.
fn effect_cell(f: &Figures) -> String {
    if f.effects.is_empty() {
        return "–".into();
    }
    f.effects
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect::<Vec<_>>()
        .join("<br>")
}

/// Recovery after a fault heals, p50 / p99 / worst over every healed fault.
fn recovery_cell(f: &Figures) -> String {
    if f.recovery_ms.is_empty() {
        return "–".into();
    }
    let mut v = f.recovery_ms.clone();
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    format!(
        "{} / {} ms<br>({} faults, worst {} ms)",
        at(0.5),
        at(0.99),
        v.len(),
        v[v.len() - 1]
    )
}

/// docs/faults.md for these rows.
pub fn render(header: &str, rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str(header);
    out.push_str(
        "\n| scenario | fault | runs | duration | operations | writes | unknown / unavailable | hangs | faults injected | verified effect | recovery p50 / p99 | stale writes refused | watch relists | (a) tokens | (b) downstream | (c) honesty | (d) exclusion |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows.iter().filter(|r| r.scenario.expect.is_none()) {
        let (s, t) = (&row.scenario, total(&row.runs));
        if row.runs.is_empty() {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} |{}",
                s.name,
                s.about,
                row.runs_cell(),
                " – |".repeat(14)
            );
            continue;
        }
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {:.0} s | {} | {} | {} / {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.name,
            s.about,
            row.runs_cell(),
            t.elapsed.as_secs_f64(),
            t.ops,
            t.writes,
            t.unknown,
            t.unavailable,
            t.hangs,
            t.faults,
            effect_cell(&t),
            recovery_cell(&t),
            t.refused_stale,
            t.relists,
            cell(s, &t, Property::Tokens),
            cell(s, &t, Property::Downstream),
            cell(s, &t, Property::Honesty),
            cell(s, &t, Property::Exclusion),
        );
    }
    out.push_str(
        "\n## Positive controls\n\nEach breaks one component on purpose — the product itself through \
         a fail point (`src/failpoints.rs`, compiled in only for the matrix), or a harness part — \
         in the same harness; a run in which the checker does not report the expected property \
         fails, and so does `scripts/faults.sh`.\n\n\
         | control | broken component | expected | runs | caught |\n|---|---|---|---|---|\n",
    );
    for row in rows.iter().filter(|r| r.scenario.expect.is_some()) {
        let s = &row.scenario;
        let (p, scope) = s.expect.expect("a control names its property");
        let of = if s.expect_words.is_empty() {
            String::new()
        } else {
            format!(" (a {})", s.expect_words.join(", "))
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | ({}) in {}{of} | {} | {} |",
            s.name,
            s.about,
            p.letter(),
            scope.name(),
            row.runs_cell(),
            row.caught
        );
    }
    out
}

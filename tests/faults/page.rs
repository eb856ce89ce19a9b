//! `docs/faults.md`: one row per scenario and checker version, the
//! positive controls, and the lossy modes against their contrasts, all from
//! the recorded figures (the page states no figure by hand).

use std::fmt::Write as _;

use crate::check::{Property, Scope};
use crate::report::Figures;
use crate::scenarios::Scenario;

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
    /// The checker version that judged the runs (None: no run recorded,
    /// or a quick run judged now), and how many of them kept their history.
    pub checker: Option<u32>,
    pub kept: usize,
    /// Runs judged by an older checker that count as judged by this one
    /// ([`crate::check::counts_as`]): how many, per version that judged them.
    pub carried: std::collections::BTreeMap<u32, usize>,
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
        match self.checker {
            Some(v) if v == crate::check::CHECKER => {
                cell += &format!("<br>checker v{v}, {} with a kept history", self.kept);
                for (older, n) in &self.carried {
                    cell +=
                        &format!(", {n} judged by v{older} (counted: see \"Checker versions\")");
                }
            }
            Some(v) => {
                cell += &format!(
                    "<br>**checker v{v}**, older than the current v{}: not evidence for \
                     the current rules ({})",
                    crate::check::CHECKER,
                    match self.kept {
                        0 => "none kept its history: they wait for new runs".to_string(),
                        n => format!("{n} with a kept history, for `rejudge` to re-check"),
                    }
                );
            }
            None => {}
        }
        cell
    }
}

/// Sums the figures of several runs (a longest figure is the longest of
/// any run).
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
            let e = t.effects.entry(k.clone()).or_default();
            *e = if crate::report::is_maximum(k) {
                (*e).max(*v)
            } else {
                *e + v
            };
        }
        t.recovery_ms.extend(&f.recovery_ms);
        t.unrecovered += f.unrecovered;
        t.judged += f.judged;
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

/// Recovery after a fault heals: p50 / p99 / worst over the healed faults
/// after which every part succeeded again before the next one, how many
/// healed faults that was, and how many the bound judged.
fn recovery_cell(s: &Scenario, f: &Figures) -> String {
    let healed = f.recovery_ms.len() + f.unrecovered;
    if healed == 0 {
        return "–".into();
    }
    let mut v = f.recovery_ms.clone();
    v.sort_unstable();
    let mut out = String::new();
    if let Some(&worst) = v.last() {
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        out += &format!("{} / {} ms (worst {worst} ms)<br>", at(0.5), at(0.99));
    }
    out += &format!(
        "every part back before the next fault after {} of {healed} healed faults; \
         {} judged against the {} s bound",
        v.len(),
        f.judged,
        s.recovery_bound().as_secs()
    );
    out
}

/// docs/faults.md for these rows.
pub fn render(header: &str, rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str(header);
    out.push_str(
        "\n| scenario | fault | runs | duration | operations | writes | unknown / unavailable | hangs | faults injected | verified effect | recovery p50 / p99 | stale writes refused | watch relists | (a) tokens | (b) downstream | (c) honesty | (d) exclusion |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows.iter().filter(|r| !r.scenario.is_control()) {
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
            recovery_cell(s, &t),
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
         a fail point (`src/store/failpoints.rs`, compiled in only for the matrix), or a harness part — \
         in the same harness; a run in which the checker does not report every violation it \
         expects fails, and so does `scripts/faults.sh`.\n\n\
         | control | broken component | expected | runs | caught |\n|---|---|---|---|---|\n",
    );
    for row in rows.iter().filter(|r| r.scenario.is_control()) {
        let s = &row.scenario;
        let expected: Vec<String> = s.expect.iter().map(|e| e.describe()).collect();
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} |",
            s.name,
            s.about,
            expected.join(",<br>and "),
            row.runs_cell(),
            row.caught
        );
    }
    out += &contrasts(rows);
    out
}

/// A lossy mode beside the mode that keeps what it loses, on the same
/// workload and the same fault.
struct Contrast {
    /// What the pair shows.
    what: &'static str,
    lossy: &'static str,
    safe: &'static str,
}

/// Every pair the page sets side by side.
const CONTRASTS: &[Contrast] = &[
    Contrast {
        what: "a failover after the replica fell 500 ms behind (the lag-window holder's \
               renewal is lost with the primary): the overlap `none` permits, and what `WAIT` \
               buys",
        lossy: "failover-durability-none",
        safe: "failover-replicas-1",
    },
    Contrast {
        what: "the same holder's renewal and grant (lease ttl 10 s) acknowledged while one copy \
               is behind, then the node that took them SIGKILLed: lost with Valkey's primary \
               under `none`; on etcd a follower is down while they are acknowledged and the \
               leader is killed as it comes back, and Raft elects the member that has them \
               (there a lost renewal would show as (c), not as (d): a leader change restarts \
               the record's TTL in full; its row shows 0 for every property)",
        lossy: "failover-durability-none",
        safe: "etcd-leader-kill-one-behind",
    },
    Contrast {
        what: "a SIGKILL while `everysec` has postponed its AOF write (a slow disk): what \
               `WAITAOF` buys across a process crash",
        lossy: "restart-slow-fsync-everysec",
        safe: "restart-slow-fsync-everysec-durability-aof",
    },
    Contrast {
        what: "a power cut: what `appendfsync always` buys over `everysec`",
        lossy: "powerloss-aof-everysec",
        safe: "powerloss-aof-always",
    },
    Contrast {
        what: "a power cut under `everysec` with `--durability aof`: `WAITAOF` answers before \
               the fsync (a Valkey limit, below), so it does not buy what `always` does",
        lossy: "powerloss-aof-everysec-durability-aof",
        safe: "powerloss-aof-always",
    },
    Contrast {
        what: "a SIGKILL of a server without persistence, against one with `appendfsync always`",
        lossy: "restart-no-persistence",
        safe: "restart-aof-always",
    },
];

/// What a lossy mode costs: the properties it measures.
const COSTS: [(Property, Scope); 3] = [
    (Property::Tokens, Scope::Lease),
    (Property::Downstream, Scope::Commit),
    (Property::Exclusion, Scope::Lease),
];

/// The count of `(p, scope)` over the current checker's runs of `name`, as
/// a cell: `n in R x S s` (with the longest window), or none recorded.
fn cost_cell(rows: &[Row], name: &str, (p, scope): (Property, Scope)) -> String {
    let Some(row) = rows
        .iter()
        .find(|r| r.scenario.name == name && r.checker == Some(crate::check::CHECKER))
    else {
        return "none recorded yet".into();
    };
    let t = total(&row.runs);
    let n = t.violations.get(&(p, scope)).copied().unwrap_or(0);
    let window = match t.windows.get(&(p, scope)) {
        Some(&ms) if n > 0 => format!(", longest {ms} ms"),
        _ => String::new(),
    };
    let n = if row.scenario.measured.contains(&(p, scope)) || n == 0 {
        n.to_string()
    } else {
        format!("**{n}**")
    };
    format!("{n} in {} x {} s{window}", row.runs.len(), row.secs)
}

/// The lossy modes against their contrasts, from the records.
fn contrasts(rows: &[Row]) -> String {
    let mut out = String::from(
        "\n## Lossy modes against their contrasts\n\nFrom the records above (the current \
         checker's runs only): what each lossy mode lost, beside the mode that must lose nothing \
         on the same workload and fault. A lossy row whose cost is 0 fails its run where the \
         scenario says it must show it (see \"Modes that cannot promise every property\").\n\n\
         | what | lossy mode | (a) client leases | (b) lease commit | (d) client leases | \
         contrast | (a) client leases | (b) lease commit | (d) client leases |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for c in CONTRASTS {
        let cells = |name| {
            COSTS
                .iter()
                .map(|&k| cost_cell(rows, name, k))
                .collect::<Vec<_>>()
                .join(" | ")
        };
        let _ = writeln!(
            out,
            "| {} | `{}` | {} | `{}` | {} |",
            c.what,
            c.lossy,
            cells(c.lossy),
            c.safe,
            cells(c.safe)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts add up over runs; a longest figure is the longest run's.
    #[test]
    fn runs_add_counts_and_keep_the_longest() {
        let run = |lingered: u64, busy: u64| {
            let mut f = Figures::default();
            f.effects.insert(
                "longest a lease was seen past its deadline (ms)".into(),
                lingered,
            );
            f.effects.insert("BUSY answers".into(), busy);
            f
        };
        let t = total(&[run(5694, 2), run(3100, 3)]);
        assert_eq!(
            t.effects["longest a lease was seen past its deadline (ms)"],
            5694
        );
        assert_eq!(t.effects["BUSY answers"], 5);
    }
}

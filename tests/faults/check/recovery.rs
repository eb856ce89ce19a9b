//! Recovery after every fault heals: every part of the workload — each
//! library client, each CLI client, each sink (PostgreSQL, `lease commit`),
//! and with the operator its status and its pod marks — must succeed again.
//!
//! A fault is judged against the bound only when the run left it room: a
//! healed fault followed by at least `bound` without another fault (the
//! schedules leave such gaps, and every run ends with a settle that long).
//! There, a part that did not succeed again within the bound fails the run.
//! A fault followed sooner by the next one cannot be judged: if some part
//! had not succeeded again when the next fault began, it is counted as "not
//! recovered before the next fault", a figure, not a failure.

use std::collections::BTreeMap;

use super::liveness::Parts;
use crate::history::{Answer, History, Sink};

/// What recovery looked like over one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Per healed fault after which every part succeeded again before the
    /// next fault (or the end): ms until the last of them did.
    pub times: Vec<u64>,
    /// Healed faults after which some part had not succeeded again when the
    /// next fault began (or the run ended).
    pub unrecovered: usize,
    /// Healed faults followed by at least the bound without another fault:
    /// the ones the bound judged.
    pub judged: usize,
    /// Every part that did not succeed again within the bound although the
    /// run left it that long without a fault, as a sentence.
    pub failures: Vec<String>,
}

/// Every part's name, and when it succeeded (local ms, ascending).
fn parts(h: &History, parts: Parts) -> BTreeMap<String, Vec<u64>> {
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    // A client works again once the store answers it at all (a `held` is a
    // working client that lost a race); every client is a part of its own.
    for o in &h.ops {
        let part = if o.client.starts_with("lib") {
            format!("library client {}", o.client)
        } else if o.client.starts_with("cli") {
            format!("CLI client {}", o.client)
        } else {
            continue;
        };
        let wins = out.entry(part).or_default();
        if matches!(&o.answer, Answer::Said(a) if !a.starts_with("invalid")) {
            wins.push(o.complete_ms);
        }
    }
    if !parts.sinks_may_fail {
        for (sink, name) in [
            (Sink::Postgres, "PostgreSQL"),
            (Sink::Commit, "lease commit"),
        ] {
            out.entry(name.into()).or_default();
            let word = if sink == Sink::Postgres {
                "accepted"
            } else {
                "committed"
            };
            let wins = h
                .writes
                .iter()
                .filter(|w| w.sink == sink && w.answer.is(word))
                .map(|w| w.complete_ms);
            out.get_mut(name).expect("just added").extend(wins);
        }
    }
    if parts.operator {
        let held = h.publications.iter().filter(|p| p.phase == "Held");
        let status = out.entry("operator status".into()).or_default();
        status.extend(held.map(|p| p.seen_ms));
        let marked = h.pods.iter().filter(|p| !p.marks.is_empty());
        let marks = out.entry("pod marks".into()).or_default();
        marks.extend(marked.map(|p| p.seen_ms));
    }
    for wins in out.values_mut() {
        wins.sort_unstable();
    }
    out
}

/// Recovery after every healed fault, judged against `bound_ms`.
pub fn recovery(h: &History, which: Parts, bound_ms: u64) -> Recovery {
    let parts = parts(h, which);
    // Where the last gap ends: when the workload was told to stop (runs
    // recorded before that was kept: the last success of any part).
    let end = if h.stopped_ms > 0 {
        h.stopped_ms
    } else {
        parts.values().flatten().copied().max().unwrap_or(0)
    };
    let mut healed: Vec<(u64, &str)> = h
        .faults
        .iter()
        .filter(|f| f.healed_ms > 0)
        .map(|f| (f.healed_ms, f.name.as_str()))
        .collect();
    healed.sort_unstable();
    let mut out = Recovery::default();
    for (at, name) in healed {
        let next = h
            .faults
            .iter()
            .map(|f| f.at_ms)
            .filter(|&s| s > at)
            .min()
            .unwrap_or(end)
            .max(at);
        let room = next - at >= bound_ms;
        out.judged += usize::from(room);
        let mut worst = Some(0);
        for (part, wins) in &parts {
            let first = wins[wins.partition_point(|&t| t < at)..].first().copied();
            match first {
                Some(t) if t <= next => {
                    let took = t - at;
                    worst = worst.map(|w: u64| w.max(took));
                    if took > bound_ms {
                        out.failures.push(format!(
                            "{part} took {took} ms to succeed again after the fault `{name}` \
                             healed at {at} (bound {bound_ms} ms)"
                        ));
                    }
                }
                _ => {
                    worst = None;
                    if room {
                        out.failures.push(format!(
                            "{part} did not succeed again within {bound_ms} ms after the fault \
                             `{name}` healed at {at}, with {} ms before the next fault or the end",
                            next - at
                        ));
                    }
                }
            }
        }
        match worst {
            Some(w) => out.times.push(w),
            None => out.unrecovered += 1,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::fixtures::{H, said};
    use crate::history::Answer;

    const CLIENTS: Parts = Parts {
        operator: false,
        sinks_may_fail: false,
    };

    /// Every part succeeds at `at`: two library clients, a CLI client, both sinks.
    fn all_succeed(h: H, at: u64) -> H {
        h.at(at)
            .acquire_answer("lib0", "t", &format!("a{at}"), said("held"), None, 0)
            .acquire_answer("lib1", "t", &format!("b{at}"), said("held"), None, 0)
            .acquire_answer("cli0", "t", &format!("c{at}"), said("held"), None, 0)
            .write(
                Sink::Postgres,
                "t",
                1,
                &format!("p{at}"),
                said("accepted"),
                0,
            )
            .write(
                Sink::Commit,
                "t",
                1,
                &format!("k{at}"),
                said("committed"),
                0,
            )
    }

    #[test]
    fn every_part_back_within_the_bound_after_a_judged_gap_passes() {
        // Healed at 1000; nothing else until the end at 20000; back by 1510.
        let h = all_succeed(H::new(), 100)
            .fault("restart", 900, 1000)
            .pipe(|h| all_succeed(h, 1500))
            .stopped(20_000)
            .build();
        let r = recovery(&h, CLIENTS, 6000);
        assert_eq!(r.failures, Vec::<String>::new());
        assert_eq!((r.judged, r.unrecovered), (1, 0));
        // The last part (lease commit) succeeded 9 ms after the heal + 500.
        assert_eq!(r.times, vec![509]);
    }

    #[test]
    fn a_single_client_that_never_recovers_fails_the_run() {
        // lib1 answers before the fault and never again; every other part
        // is back at once. The old rule (any library client) passed this.
        let before = all_succeed(H::new(), 100).fault("restart", 900, 1000);
        let h = before
            .at(1500)
            .acquire_answer("lib0", "t", "a2", said("held"), None, 0)
            .acquire_answer("lib1", "t", "b2", Answer::Unavailable, None, 0)
            .acquire_answer("cli0", "t", "c2", said("held"), None, 0)
            .write(Sink::Postgres, "t", 1, "p2", said("accepted"), 0)
            .write(Sink::Commit, "t", 1, "k2", said("committed"), 0)
            .stopped(20_000)
            .build();
        let r = recovery(&h, CLIENTS, 6000);
        assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
        assert!(
            r.failures[0].starts_with("library client lib1 did not succeed again within 6000 ms"),
            "{:?}",
            r.failures
        );
        assert_eq!((r.judged, r.unrecovered, r.times.len()), (1, 1, 0));
    }

    #[test]
    fn a_part_back_only_after_the_bound_fails_when_the_gap_allowed_it() {
        let h = all_succeed(H::new(), 100)
            .fault("restart", 900, 1000)
            .pipe(|h| all_succeed(h, 8000))
            .stopped(20_000)
            .build();
        let r = recovery(&h, CLIENTS, 6000);
        assert_eq!(r.failures.len(), 5, "every part: {:?}", r.failures);
        assert!(
            r.failures[0].starts_with("CLI client cli0 took 7005 ms"),
            "{:?}",
            r.failures
        );
        assert_eq!(r.times, vec![7009]);
    }

    #[test]
    fn a_fault_followed_too_soon_by_the_next_is_counted_not_judged() {
        // Healed at 1000, the next fault at 1300: nothing came back in
        // between. Counted as not recovered, not failed; the second fault,
        // followed by the settle, is judged and recovers.
        let h = all_succeed(H::new(), 100)
            .fault("restart", 900, 1000)
            .fault("restart", 1300, 1400)
            .pipe(|h| all_succeed(h, 2000))
            .stopped(20_000)
            .build();
        let r = recovery(&h, CLIENTS, 6000);
        assert_eq!(r.failures, Vec::<String>::new());
        assert_eq!((r.judged, r.unrecovered), (1, 1));
        assert_eq!(r.times, vec![609]);
    }

    #[test]
    fn a_run_that_ends_before_the_bound_judges_nothing() {
        let h = all_succeed(H::new(), 100)
            .fault("restart", 900, 1000)
            .stopped(3000)
            .build();
        let r = recovery(&h, CLIENTS, 6000);
        assert_eq!(r.failures, Vec::<String>::new());
        assert_eq!((r.judged, r.unrecovered), (0, 1));
    }

    #[test]
    fn each_sink_and_each_operator_part_is_judged_on_its_own() {
        let operator = Parts {
            operator: true,
            sinks_may_fail: false,
        };
        // Everything comes back but the pod marks and `lease commit`.
        let h = all_succeed(H::new(), 100)
            .publish("x", "op", 1, Some(1), Some(("q1", 100, 900)))
            .pod("p1", 2, &[("el", 1, 900)])
            .fault("operator SIGKILL", 900, 1000)
            .at(1500)
            .acquire_answer("lib0", "t", "a2", said("held"), None, 0)
            .acquire_answer("lib1", "t", "b2", said("held"), None, 0)
            .acquire_answer("cli0", "t", "c2", said("held"), None, 0)
            .write(Sink::Postgres, "t", 1, "p2", said("accepted"), 0)
            .publish("x", "op", 3, Some(2), Some(("q2", 1500, 2500)))
            .stopped(20_000)
            .build();
        let failed: Vec<String> = recovery(&h, operator, 6000)
            .failures
            .iter()
            .map(|f| f.split(" did not").next().unwrap().to_string())
            .collect();
        assert_eq!(failed, ["lease commit", "pod marks"]);
        // A control that breaks a sink on purpose does not judge the sinks.
        let control = Parts {
            sinks_may_fail: true,
            ..operator
        };
        assert_eq!(recovery(&h, control, 6000).failures.len(), 1);
    }
}

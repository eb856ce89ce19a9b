//! (d) What the operator publishes, compared at every etcd revision (the
//! state at a revision is each object's latest version at or before it;
//! TargetLeases and pods share etcd's revision counter, one total order):
//!
//! - no two TargetLeases of one target are Held with overlapping
//!   `[acquiredAt, expiresAt)`;
//! - no two pods carry one election's marks with overlapping
//!   `[acquiredAt of the token, expires-at annotation)`;
//! - no pod carries marks that its TargetLease's status does not name
//!   (Held, that pod, that token).
//!
//! A version delivered by a relist follows a gap: the versions between it
//! and the one seen before are unknown, so at revisions inside the gap the
//! object's state is unknown and nothing is judged about it; nor, past the
//! last revision a watch delivered, about what it would have shown.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::exclusion::{Claim, overlap};
use super::{Property, Scope, Violation, group_by};
use crate::history::{History, Publication};

/// Revision intervals `(after, before)` in which an object's state is unknown.
#[derive(Default)]
struct Gaps<'a>(HashMap<&'a str, Vec<(u64, u64)>>);

impl<'a> Gaps<'a> {
    fn of(versions: impl Iterator<Item = (&'a str, u64, bool)>) -> Self {
        let mut last: HashMap<&str, u64> = HashMap::new();
        let mut all: Vec<(&str, u64, bool)> = versions.collect();
        all.sort_by_key(|v| v.1);
        let mut gaps = Gaps::default();
        for (name, rv, after_gap) in all {
            let prev = last.insert(name, rv).unwrap_or(0);
            if after_gap && prev > 0 {
                gaps.0.entry(name).or_default().push((prev, rv));
            }
        }
        gaps
    }

    fn unknown(&self, name: &str, at: u64) -> bool {
        self.0
            .get(name)
            .is_some_and(|g| g.iter().any(|&(a, b)| at > a && at < b))
    }
}

pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let status_gaps = Gaps::of(
        h.publications
            .iter()
            .map(|p| (p.name.as_str(), p.rv, p.after_gap)),
    );
    let pod_gaps = Gaps::of(h.pods.iter().map(|p| (p.pod.as_str(), p.rv, p.after_gap)));
    statuses(h, &status_gaps, &mut out);
    marks(h, &pod_gaps, &mut out);
    named(h, &status_gaps, &pod_gaps, &mut out);
    out
}

/// Reports every pair of overlapping claims, once per pair; claims of
/// objects whose state is unknown at `at` are left out.
fn report_pairs(
    target: &str,
    at: u64,
    live: &BTreeMap<&str, Claim>,
    gaps: &Gaps,
    reported: &mut HashSet<(String, String)>,
    out: &mut Vec<Violation>,
) {
    let all: Vec<(&&str, &Claim)> = live.iter().filter(|(n, _)| !gaps.unknown(n, at)).collect();
    for (i, (na, a)) in all.iter().enumerate() {
        for (nb, b) in &all[i + 1..] {
            if overlap(a, b) && reported.insert((a.who.to_string(), b.who.to_string())) {
                out.push(Violation::new(
                    Property::Exclusion,
                    Scope::Published,
                    target,
                    format!(
                        "at revision {at}: {na} claims [{}, {}) ({}) while {nb} claims [{}, {}) ({})",
                        a.start, a.end, a.who, b.start, b.end, b.who
                    ),
                ));
            }
        }
    }
}

fn held(p: &Publication) -> Option<Claim<'_>> {
    match (
        p.phase.as_str(),
        &p.acquisition_id,
        p.acquired_at_ms,
        p.expires_at_ms,
    ) {
        ("Held", Some(who), Some(start), Some(end)) => Some(Claim { who, start, end }),
        _ => None,
    }
}

fn statuses(h: &History, gaps: &Gaps, out: &mut Vec<Violation>) {
    for (target, mut pubs) in group_by(&h.publications, |p| p.target.as_str()) {
        pubs.sort_by_key(|p| p.rv);
        let mut live: BTreeMap<&str, Claim> = BTreeMap::new();
        let mut reported = HashSet::new();
        for p in pubs {
            match held(p) {
                Some(c) => live.insert(&p.name, c),
                None => live.remove(p.name.as_str()),
            };
            report_pairs(&target, p.rv, &live, gaps, &mut reported, out);
        }
    }
}

fn marks(h: &History, gaps: &Gaps, out: &mut Vec<Violation>) {
    // When each (lease, token) was acquired, from the statuses.
    let acquired: HashMap<(&str, u64), u64> = h
        .publications
        .iter()
        .filter_map(|p| Some(((p.name.as_str(), p.token?), p.acquired_at_ms?)))
        .collect();
    let mut pods: Vec<_> = h.pods.iter().collect();
    pods.sort_by_key(|p| p.rv);
    // lease -> pod -> claim
    let mut live: HashMap<&str, BTreeMap<&str, Claim>> = HashMap::new();
    let mut reported = HashSet::new();
    for p in pods {
        for pods_of_lease in live.values_mut() {
            pods_of_lease.remove(p.pod.as_str());
        }
        for m in &p.marks {
            let token = m.token.unwrap_or(0);
            let start = acquired
                .get(&(m.lease.as_str(), token))
                .copied()
                .unwrap_or(0);
            live.entry(&m.lease).or_default().insert(
                &p.pod,
                Claim {
                    who: &p.pod,
                    start,
                    end: m.expires_at_ms.unwrap_or(u64::MAX),
                },
            );
        }
        for m in &p.marks {
            if let Some(l) = live.get(m.lease.as_str()) {
                report_pairs(&m.lease, p.rv, l, gaps, &mut reported, out);
            }
        }
    }
}

/// What one revision changed: a TargetLease's status or a pod's marks.
enum Change<'a> {
    Status(&'a Publication),
    Pod(&'a crate::history::PodVersion),
}

/// At every revision, every mark a pod carries is named by its
/// TargetLease's status: Held, that pod, that token.
fn named(h: &History, status_gaps: &Gaps, pod_gaps: &Gaps, out: &mut Vec<Violation>) {
    let mut changes: Vec<(u64, Change)> = h
        .publications
        .iter()
        .map(|p| (p.rv, Change::Status(p)))
        .chain(h.pods.iter().map(|p| (p.rv, Change::Pod(p))))
        .collect();
    changes.sort_by_key(|c| c.0);
    // Past the last revision one watch delivered, what it would have shown
    // is unknown (it may have been away until the end): judge only up to
    // the revision both watches reached.
    let reached = |revs: &mut dyn Iterator<Item = u64>| revs.max().unwrap_or(0);
    let covered = reached(&mut h.publications.iter().map(|p| p.rv))
        .min(reached(&mut h.pods.iter().map(|p| p.rv)));
    let mut status: HashMap<&str, &Publication> = HashMap::new();
    let mut marked: HashMap<&str, &crate::history::PodVersion> = HashMap::new();
    let mut reported = HashSet::new();
    let mut i = 0;
    while i < changes.len() {
        let rv = changes[i].0;
        // Every change of one revision first (one write changes one object).
        while i < changes.len() && changes[i].0 == rv {
            match changes[i].1 {
                Change::Status(p) => {
                    status.insert(&p.name, p);
                }
                Change::Pod(p) => {
                    marked.insert(&p.pod, p);
                }
            }
            i += 1;
        }
        if rv > covered {
            break;
        }
        for (pod, v) in &marked {
            if pod_gaps.unknown(pod, rv) {
                continue;
            }
            for m in &v.marks {
                if status_gaps.unknown(&m.lease, rv) {
                    continue;
                }
                let Some(s) = status.get(m.lease.as_str()) else {
                    continue; // never seen: unknown
                };
                let ok = s.phase == "Held"
                    && s.token == m.token
                    && s.holder_pod.as_deref().is_none_or(|p| p == *pod);
                if !ok && reported.insert((pod.to_string(), m.lease.clone(), m.token)) {
                    out.push(Violation::new(
                        Property::Exclusion,
                        Scope::Published,
                        &m.lease,
                        format!(
                            "at revision {rv}: pod {pod} carries the marks of {} (token {:?}) \
                             while its status (revision {}) is {} with token {:?} for {:?}",
                            m.lease, m.token, s.rv, s.phase, s.token, s.holder_pod
                        ),
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn handoffs_in_the_safe_order_are_clean() {
        // Unmark p1 (rv 2) before x's status stops naming it (rv 3); mark p2
        // (rv 5) after y's status names it (rv 4).
        let h = H::new()
            .publish("x", "op", 1, Some(5), Some(("q1", 1000, 5000)))
            .naming("p1")
            .pod("p1", 1, &[("x", 5, 5000)])
            .pod("p1", 2, &[])
            .publish("x", "op", 3, Some(5), None)
            .publish("x", "op", 4, Some(6), Some(("q2", 6000, 9000)))
            .naming("p2")
            .pod("p2", 5, &[("x", 6, 9000)])
            .build();
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn two_held_statuses_at_one_revision_are_caught() {
        // Control: a broken publisher marks a second TargetLease Held.
        let h = H::new()
            .publish("x", "op", 1, Some(5), Some(("q1", 1000, 5000)))
            .publish("y", "op", 2, Some(5), Some(("rogue", 2000, 6000)))
            .build();
        let v = check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].detail.starts_with("at revision 2: x claims"));
        // After x's published expiry has passed, y may be Held.
        let ok = H::new()
            .publish("x", "op", 1, Some(5), Some(("q1", 1000, 5000)))
            .publish("y", "op", 2, Some(6), Some(("q2", 5000, 9000)))
            .build();
        assert_eq!(check(&ok), vec![]);
    }

    #[test]
    fn two_marked_pods_of_one_election_are_caught() {
        let h = H::new()
            .publish("x", "op", 1, Some(5), Some(("q1", 1000, 5000)))
            .publish("x", "op", 3, Some(6), Some(("q2", 2000, 9000)))
            .pod("p1", 2, &[("x", 5, 5000)])
            .pod("p2", 4, &[("x", 6, 9000)])
            .build();
        let v: Vec<_> = check(&h)
            .into_iter()
            .filter(|v| v.detail.contains("claims"))
            .collect();
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].detail.contains("p1 claims [1000, 5000)"), "{v:?}");
    }

    #[test]
    fn marks_the_status_does_not_name_are_caught() {
        // Control: the old holder's marks removed after the status let go.
        let h = H::new()
            .publish("x", "op", 1, Some(5), Some(("q1", 1000, 5000)))
            .naming("p1")
            .pod("p1", 2, &[("x", 5, 5000)])
            .publish("x", "op", 3, Some(5), None)
            .pod("p1", 4, &[])
            .build();
        let v = check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].detail
                .contains("at revision 3: pod p1 carries the marks of x"),
            "{v:?}"
        );
    }

    #[test]
    fn nothing_is_judged_inside_a_watch_gap() {
        // x's status was withdrawn somewhere between rv 1 and rv 6 (the watch
        // relisted): at rv 4 p1's marks may or may not be named.
        let h = H::new()
            .publish("x", "op", 1, Some(5), Some(("q1", 1000, 5000)))
            .naming("p1")
            .pod("p1", 2, &[("x", 5, 5000)])
            .pod("p1", 4, &[])
            .publish("x", "op", 6, Some(5), None)
            .after_gap()
            .publish("y", "op", 3, Some(6), Some(("q2", 2000, 9000)))
            .build();
        assert_eq!(check(&h), vec![]);
        let h = H::new()
            .publish("x", "op", 1, Some(5), Some(("q1", 1000, 5000)))
            .publish("x", "op", 6, Some(5), None)
            .publish("y", "op", 3, Some(6), Some(("q2", 2000, 9000)))
            .build();
        assert_eq!(check(&h).len(), 1, "without the gap, rv 3 is judged");
    }
}

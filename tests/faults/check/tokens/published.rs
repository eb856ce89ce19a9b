//! Tokens the operator hands out: those its TargetLease statuses publish
//! and those on an election's pod marks only grow, and every token on a mark
//! is one its TargetLease's status published.

use std::collections::{HashMap, HashSet};

use super::super::{Property, Scope, Violation, group_by};
use crate::history::History;

/// Every token a pod mark carries was published in its TargetLease's status.
pub(super) fn marks_published(h: &History, out: &mut Vec<Violation>) {
    let published: HashSet<(&str, u64)> = h
        .publications
        .iter()
        .filter_map(|p| Some((p.name.as_str(), p.token?)))
        .collect();
    let named: HashSet<&str> = h.publications.iter().map(|p| p.name.as_str()).collect();
    // A status the watch did not deliver (away, or relisting past it) is
    // unknown: only marks the status watch had reached, outside its gaps.
    let reached = h.publications.iter().map(|p| p.rv).max().unwrap_or(0);
    let relisted: Vec<(&str, u64)> = h
        .publications
        .iter()
        .filter(|p| p.after_gap)
        .map(|p| (p.name.as_str(), p.rv))
        .collect();
    let mut reported = HashSet::new();
    for p in h.pods.iter().filter(|p| p.rv <= reached) {
        if relisted.iter().any(|(_, rv)| *rv >= p.rv) {
            continue; // a relist after this version: what preceded it is unknown
        }
        for m in &p.marks {
            let Some(token) = m.token else { continue };
            if named.contains(m.lease.as_str())
                && !published.contains(&(m.lease.as_str(), token))
                && reported.insert((m.lease.as_str(), token))
            {
                out.push(Violation::new(
                    Property::Tokens,
                    Scope::Published,
                    &m.lease,
                    format!(
                        "pod {} marked with token {token}, which no status of {} published",
                        p.pod, m.lease
                    ),
                ));
            }
        }
    }
}

/// Tokens appearing in a target's TargetLease statuses, by revision, only grow.
pub(super) fn published_order(h: &History, out: &mut Vec<Violation>) {
    for (target, pubs) in group_by(&h.publications, |p| p.target.as_str()) {
        let mut pubs = pubs;
        pubs.sort_by_key(|p| p.rv);
        let mut seen = HashSet::new();
        let mut last: Option<(u64, &str, u64)> = None;
        for p in pubs {
            let Some(token) = p.token else { continue };
            if !seen.insert((p.name.as_str(), token)) {
                continue;
            }
            if let Some((prev, name, rv)) = last
                && token <= prev
            {
                out.push(Violation::new(
                    Property::Tokens,
                    Scope::Published,
                    &target,
                    format!(
                        "{} published token {token} at revision {} after {name} published {prev} at revision {rv}",
                        p.name, p.rv
                    ),
                ));
            }
            if last.is_none_or(|(prev, _, _)| token > prev) {
                last = Some((token, &p.name, p.rv));
            }
        }
    }
}

/// Tokens on an election's pod marks, by revision, only grow as new ones appear.
pub(super) fn mark_order(h: &History, out: &mut Vec<Violation>) {
    let mut pods: Vec<_> = h.pods.iter().collect();
    pods.sort_by_key(|p| p.rv);
    let mut seen: HashSet<(&str, u64)> = HashSet::new();
    let mut highest: HashMap<&str, (u64, &str, u64)> = HashMap::new();
    for p in pods {
        for m in &p.marks {
            let Some(token) = m.token else { continue };
            if !seen.insert((m.lease.as_str(), token)) {
                continue;
            }
            if let Some((prev, pod, rv)) = highest.get(m.lease.as_str())
                && token <= *prev
            {
                out.push(Violation::new(
                    Property::Tokens,
                    Scope::Published,
                    &m.lease,
                    format!(
                        "pod {} marked with token {token} at revision {} after pod {pod} carried {prev} at revision {rv}",
                        p.pod, p.rv
                    ),
                ));
            }
            let e = highest.entry(&m.lease).or_insert((token, &p.pod, p.rv));
            if token > e.0 {
                *e = (token, &p.pod, p.rv);
            }
        }
    }
}

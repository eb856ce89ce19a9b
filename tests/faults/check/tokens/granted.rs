//! Judgement of a target's grants: one token per issue and one issue per
//! token, and a grant surely issued after another carries a larger token;
//! a grant nobody was told of binds only until a loss may have undone it.

use std::collections::HashMap;

use super::super::{Property, Violation};
use super::{Grant, by_acquisition};

/// One token per issue and one issue per token, each grant compared with
/// the earlier ones that still bind it; each (token, issue) once.
pub(super) fn unique(target: &str, gs: &[&Grant], lossy: &[(u64, u64)], out: &mut Vec<Violation>) {
    let mut by_token: HashMap<u64, Vec<&Grant>> = HashMap::new();
    let mut by_issue: HashMap<&str, Vec<&Grant>> = HashMap::new();
    for g in by_acquisition(gs) {
        let binding = |e: &&&Grant| e.binds_at(g.acquired_at_ms, lossy);
        let same_token = by_token.entry(g.token).or_default();
        let other_issue = same_token
            .iter()
            .filter(binding)
            .find(|e| e.issue != g.issue);
        let detail = other_issue.map(|e| {
            format!(
                "token {} issued twice: to {} and to {}",
                g.token, e.issue, g.issue
            )
        });
        same_token.push(g);
        let same_issue = by_issue.entry(g.issue).or_default();
        let other_token = same_issue
            .iter()
            .filter(binding)
            .find(|e| e.token != g.token);
        let detail = detail.or_else(|| {
            other_token.map(|e| {
                format!(
                    "one issue {} got two tokens: {} and {}",
                    g.issue, e.token, g.token
                )
            })
        });
        same_issue.push(g);
        if let Some(detail) = detail {
            out.push(Violation::new(Property::Tokens, g.scope, target, detail));
        }
    }
}

/// Every grant surely issued after another that still binds it must carry
/// a larger token.
pub(super) fn ordered(target: &str, gs: &[&Grant], lossy: &[(u64, u64)], out: &mut Vec<Violation>) {
    let sorted = by_acquisition(gs);
    // Sweep over grants that surely ended before `g` began: the highest
    // acknowledged token, and every unacknowledged grant no loss has undone
    // yet (few: only acquires whose caller never learned of them).
    let mut by_end: Vec<&Grant> = sorted.clone();
    by_end.sort_by_key(|g| g.acquired_at_ms + g.resolution_ms);
    let mut j = 0;
    let mut best: Option<&Grant> = None;
    let mut untold: Vec<&Grant> = Vec::new();
    for g in &sorted {
        while j < by_end.len()
            && by_end[j].acquired_at_ms + by_end[j].resolution_ms <= g.acquired_at_ms
        {
            let e = by_end[j];
            if !e.acknowledged {
                untold.push(e);
            } else if best.is_none_or(|b| e.token > b.token) {
                best = Some(e);
            }
            j += 1;
        }
        // A loss that undid a grant undid it for every later one too.
        untold.retain(|e| e.binds_at(g.acquired_at_ms, lossy));
        let clash = |b: &&Grant| b.token >= g.token && b.issue != g.issue;
        let earlier = best
            .filter(clash)
            .or_else(|| untold.iter().copied().filter(clash).max_by_key(|b| b.token));
        if let Some(b) = earlier {
            out.push(Violation::new(
                Property::Tokens,
                g.scope,
                target,
                format!(
                    "token {} ({}) acquired at {} after token {} ({}) acquired at {}",
                    g.token, g.issue, g.acquired_at_ms, b.token, b.issue, b.acquired_at_ms
                ),
            ));
        }
    }
}

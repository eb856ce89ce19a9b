//! (a) Tokens strictly increase in issue order, and no token is issued twice.
//!
//! A *grant* is a token handed to someone: an acknowledged acquire (client
//! leases) or a Held TargetLease status (the operator). Per target:
//! - two grants with the same token must be the same issue (request id or
//!   acquisition id), and one issue never gets two tokens;
//! - a grant surely issued before another (its acquisition time, plus the
//!   publication's one-second resolution, is earlier) has a lower token;
//! - tokens the operator publishes, in etcd revision order, and tokens on
//!   an election's pod marks, strictly increase as new ones appear;
//! - every lease seen (observers, `held` replies) is a grant too, and every
//!   token on a pod mark is one its TargetLease's status published;
//! - except that a grant nobody was told of (seen, never acknowledged) binds
//!   nothing after a fault that can lose state: a failover or power cut may
//!   undo a write that was never acknowledged as durable, and its token and
//!   request id are then free again. An acknowledged grant binds across
//!   every fault.

use std::collections::{BTreeMap, HashSet};

use super::effects::{loss_between, lossy};
use super::{Scope, Violation, group_by};
use crate::history::{History, OpKind};

mod granted;
mod published;

/// A token handed to someone.
#[derive(Clone, Debug)]
struct Grant<'a> {
    scope: Scope,
    target: &'a str,
    token: u64,
    issue: &'a str,
    acquired_at_ms: u64,
    /// Width of the acquisition-time uncertainty (status times are whole seconds).
    resolution_ms: u64,
    /// Its holder was told (an acknowledged acquire, a published status).
    acknowledged: bool,
}

impl Grant<'_> {
    /// Whether this grant still holds its token and issue at `later_ms`: an
    /// acknowledged one always; one nobody was told of only while no loss
    /// may have undone it.
    fn binds_at(&self, later_ms: u64, lossy: &[(u64, u64)]) -> bool {
        self.acknowledged || !loss_between(lossy, self.acquired_at_ms, later_ms)
    }
}

fn grants(h: &History) -> Vec<Grant<'_>> {
    let clients = h.ops.iter().filter_map(|o| {
        let lease = o.lease.as_ref()?;
        o.answer.is("acquired").then_some(Grant {
            scope: Scope::Lease,
            target: &o.target,
            token: lease.token,
            issue: &lease.issue,
            acquired_at_ms: lease.acquired_at_ms,
            resolution_ms: 1,
            acknowledged: true,
        })
    });
    let published = h.publications.iter().filter_map(|p| {
        (p.phase == "Held").then_some(())?;
        Some(Grant {
            scope: Scope::Published,
            target: &p.target,
            token: p.token?,
            issue: p.acquisition_id.as_deref()?,
            acquired_at_ms: p.acquired_at_ms?,
            resolution_ms: 1000,
            acknowledged: true,
        })
    });
    // Every other sighting of a lease (observers, `held` replies) is a grant
    // too: a token handed to an acquire whose caller never learned of it is
    // compared like any other. Targets the operator publishes are its scope.
    let operator: std::collections::HashSet<&str> =
        h.publications.iter().map(|p| p.target.as_str()).collect();
    let told: HashSet<(&str, u64)> = clients
        .clone()
        .chain(published.clone())
        .map(|g| (g.issue, g.token))
        .collect();
    let scope_of = move |t: &str| {
        if operator.contains(t) {
            Scope::Published
        } else {
            Scope::Lease
        }
    };
    let observed = h
        .sightings
        .iter()
        .filter_map(|s| Some((s.target.as_str(), s.lease.as_ref()?)))
        .chain(h.ops.iter().filter_map(|o| {
            let l = o.lease.as_ref()?;
            (o.kind == OpKind::Acquire && o.answer.is("held")).then_some((o.target.as_str(), l))
        }))
        .filter(|(_, l)| !l.issue.is_empty())
        .map(move |(target, l)| Grant {
            scope: scope_of(target),
            target,
            token: l.token,
            issue: &l.issue,
            acquired_at_ms: l.acquired_at_ms,
            resolution_ms: 1,
            acknowledged: told.contains(&(l.issue.as_str(), l.token)),
        });
    clients.chain(published).chain(observed).collect()
}

pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let all = grants(h);
    let lossy = lossy(h);
    for (target, gs) in group_by(&all, |g| g.target) {
        granted::unique(&target, &gs, &lossy, &mut out);
        granted::ordered(&target, &gs, &lossy, &mut out);
    }
    published::published_order(h, &mut out);
    published::mark_order(h, &mut out);
    published::marks_published(h, &mut out);
    out
}

/// How much a lossy mode forgot, as a window of server time: for each time a
/// target's client-lease counter went back (an acquisition whose token is not
/// above that of the grant just before it, in server-time order), the span
/// from the oldest grant it forgot (the first grant, since the counter last
/// went back, whose token is at least the one handed out again) to the newest
/// grant before it. The longest span in ms (0: a loss forgot one grant);
/// `None` when no counter went back.
pub fn forgotten_ms(h: &History) -> Option<u64> {
    let all = grants(h);
    let mut longest = None;
    for (_, gs) in group_by(&all, |g| g.target) {
        let leases: Vec<&Grant> = gs.into_iter().filter(|g| g.scope == Scope::Lease).collect();
        // The grants since the counter last went back, token -> when: a
        // counter that goes back twice measures its second loss from the
        // grants that loss forgot, not from the first epoch's.
        let mut epoch: BTreeMap<u64, u64> = BTreeMap::new();
        let mut prev: Option<&Grant> = None;
        for g in by_acquisition(&leases) {
            if let Some(p) = prev
                && g.token <= p.token
            {
                // `p` is in the epoch, so the range is never empty.
                if let Some((_, &oldest)) = epoch.range(g.token..=p.token).next() {
                    let span = p.acquired_at_ms.saturating_sub(oldest);
                    longest = Some(longest.map_or(span, |l: u64| l.max(span)));
                }
                epoch.clear();
            }
            epoch.insert(g.token, g.acquired_at_ms);
            prev = Some(g);
        }
    }
    longest
}

/// Each (issue, token) once, by acquisition time (then token).
fn by_acquisition<'g, 'a>(gs: &[&'g Grant<'a>]) -> Vec<&'g Grant<'a>> {
    let mut distinct: BTreeMap<(&str, u64), &Grant> = BTreeMap::new();
    for g in gs {
        distinct.entry((g.issue, g.token)).or_insert(g);
    }
    let mut sorted: Vec<&Grant> = distinct.into_values().collect();
    sorted.sort_by_key(|g| (g.acquired_at_ms, g.token));
    sorted
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    fn found(h: &History) -> Vec<String> {
        check(h).iter().map(|v| v.to_string()).collect()
    }

    #[test]
    fn a_clean_history_has_no_violation() {
        let h = H::new()
            .acquired("a", "t", "r1", 1, 100, 200)
            .acquired("a", "t", "r1", 1, 100, 200) // a replay: same issue, same token
            .acquired("b", "t", "r2", 2, 300, 400)
            .acquired("b", "u", "r3", 1, 300, 400) // another target
            .publish("x", "op", 1, Some(5), Some(("q1", 1000, 5000)))
            .publish("x", "op", 3, Some(5), None)
            .publish("y", "op", 4, Some(6), Some(("q2", 6000, 9000)))
            .publish("x", "op", 9, Some(5), None) // an old token still shown, not new
            .pod("p1", 2, &[("x", 5, 5000)])
            .pod("p2", 5, &[("y", 6, 9000)])
            .build();
        assert_eq!(found(&h), Vec::<String>::new());
    }

    #[test]
    fn a_reissued_token_is_caught() {
        // Control: a store that forgot its counter hands token 1 out again.
        let h = H::new()
            .acquired("a", "t", "r1", 1, 100, 200)
            .acquired("b", "t", "r2", 1, 300, 400)
            .build();
        let v = found(&h);
        assert!(
            v.iter().any(|s| s.contains("token 1 issued twice")),
            "{v:?}"
        );
        assert!(
            v.iter()
                .any(|s| s.contains("acquired at 300 after token 1")),
            "{v:?}"
        );
    }

    #[test]
    fn a_lower_token_issued_later_is_caught_but_same_second_statuses_are_not_ordered() {
        let h = H::new()
            .acquired("a", "t", "r1", 7, 100, 200)
            .acquired("b", "t", "r2", 3, 300, 400)
            .build();
        assert_eq!(found(&h).len(), 1);
        // Status times are whole seconds: 1000 vs 1000 says nothing about order.
        let h = H::new()
            .publish("x", "op", 1, Some(6), Some(("q1", 1000, 5000)))
            .publish("y", "op", 2, Some(7), Some(("q2", 1000, 5000)))
            .build();
        assert_eq!(found(&h), Vec::<String>::new());
    }

    /// Acknowledged acquires on target `t`: (client, request id, token,
    /// acquired at), each lease 50 ms long.
    fn on_t(rows: &[(&str, &str, u64, u64)]) -> History {
        rows.iter()
            .fold(H::new(), |h, &(client, issue, token, at)| {
                h.acquired(client, "t", issue, token, at, at + 50)
            })
            .build()
    }

    #[test]
    fn the_forgotten_window_spans_the_grants_a_counter_issued_again() {
        // Tokens 1..3 granted at 100, 200, 300; the counter goes back to 2
        // at 500: the grants of 2 and 3 (200..300) were forgotten. Another
        // target that never goes back changes nothing.
        let mut h = on_t(&[
            ("a", "r1", 1, 100),
            ("b", "r2", 2, 200),
            ("a", "r3", 3, 300),
            ("b", "r4", 2, 500),
            ("a", "r5", 3, 600),
        ]);
        h.ops
            .extend(H::new().acquired("b", "u", "r6", 9, 100, 150).build().ops);
        assert_eq!(forgotten_ms(&h), Some(100));
        // Back to 1 twice: the second loss forgot the new grants of 1..2
        // (1000..1400), not the first epoch's.
        let h = on_t(&[
            ("a", "r1", 1, 0),
            ("a", "r2", 2, 100),
            ("a", "r3", 3, 200),
            ("b", "r4", 1, 1000),
            ("b", "r5", 2, 1400),
            ("a", "r6", 1, 2000),
        ]);
        assert_eq!(forgotten_ms(&h), Some(400));
        // After a loss whose first new grant was never acknowledged, the
        // next loss measures from the new epoch's grants only (10_000..10_100).
        let h = on_t(&[
            ("a", "r1", 1, 0),
            ("a", "r2", 2, 100),
            ("a", "r3", 3, 200),
            ("b", "r4", 2, 10_000),
            ("b", "r5", 3, 10_100),
            ("a", "r6", 1, 20_000),
        ]);
        assert_eq!(forgotten_ms(&h), Some(100));
        // The first loss forgot the grants of 2..4 (100..300); the second,
        // after 3 was never acknowledged, those of 2 and 4 (500..600).
        let h = on_t(&[
            ("a", "r1", 1, 0),
            ("a", "r2", 2, 100),
            ("a", "r3", 3, 200),
            ("a", "r4", 4, 300),
            ("b", "r5", 2, 500),
            ("b", "r6", 4, 600),
            ("a", "r7", 2, 700),
        ]);
        assert_eq!(forgotten_ms(&h), Some(200));
        // A loss that forgot one grant is a window of 0 ms, not none.
        let h = on_t(&[
            ("a", "r1", 1, 100),
            ("a", "r2", 2, 200),
            ("b", "r3", 2, 900),
        ]);
        assert_eq!(forgotten_ms(&h), Some(0));
        // A counter that only grows forgot nothing; a replay is no regression.
        let h = on_t(&[
            ("a", "r1", 1, 100),
            ("a", "r1", 1, 100),
            ("b", "r2", 2, 200),
        ]);
        assert_eq!(forgotten_ms(&h), None);
    }

    #[test]
    fn a_grant_nobody_was_told_of_binds_nothing_once_a_loss_may_have_undone_it() {
        // An acquire whose caller heard `outcome_unknown` granted token 9 on
        // a primary that died before its replica had it; an observer saw it.
        let seen = || H::new().sighting("t", view("a", 9, "u1", 100, 10_100));
        let h = seen()
            .at(150)
            .lossy_fault()
            .acquired("b", "t", "r2", 9, 200, 10_200)
            .acquired("a", "t", "u1", 10, 300, 10_300) // its retry, a new token
            .build();
        assert_eq!(found(&h), Vec::<String>::new());
        // Without the loss the same sighting binds: both reuses are caught.
        let h = seen()
            .acquired("b", "t", "r2", 9, 200, 10_200)
            .acquired("a", "t", "u1", 10, 300, 10_300)
            .build();
        let v = found(&h);
        assert!(
            v.iter().any(|s| s.contains("token 9 issued twice")),
            "{v:?}"
        );
        assert!(
            v.iter()
                .any(|s| s.contains("acquired at 200 after token 9")),
            "{v:?}"
        );
        assert!(
            v.iter().any(|s| s.contains("one issue u1 got two tokens")),
            "{v:?}"
        );
        // An acknowledged grant binds across the loss.
        let h = H::new()
            .acquired("a", "t", "u1", 9, 100, 10_100)
            .sighting("t", view("a", 9, "u1", 100, 10_100))
            .at(150)
            .lossy_fault()
            .acquired("b", "t", "r2", 9, 200, 10_200)
            .build();
        let v = found(&h);
        assert!(
            v.iter().any(|s| s.contains("token 9 issued twice")),
            "{v:?}"
        );
        assert!(
            v.iter()
                .any(|s| s.contains("acquired at 200 after token 9")),
            "{v:?}"
        );
        // A loss before the sighting's grant excuses nothing.
        let h = H::new()
            .at(50)
            .lossy_fault()
            .sighting("t", view("a", 9, "u1", 100, 10_100))
            .acquired("b", "t", "r2", 9, 200, 10_200)
            .build();
        assert!(found(&h).iter().any(|s| s.contains("token 9 issued twice")));
    }

    #[test]
    fn one_request_with_two_tokens_is_caught() {
        let h = H::new()
            .acquired("a", "t", "r1", 1, 100, 200)
            .acquired("a", "t", "r1", 2, 100, 200)
            .build();
        assert!(found(&h)[0].contains("got two tokens"));
    }

    #[test]
    fn a_published_token_going_down_is_caught() {
        let h = H::new()
            .publish("x", "op", 1, Some(5), Some(("q1", 1000, 5000)))
            .publish("y", "op", 4, Some(4), Some(("q2", 9000, 12000)))
            .build();
        let v = found(&h);
        assert!(
            v.iter()
                .any(|s| s.contains("published token 4 at revision 4")),
            "{v:?}"
        );
    }

    #[test]
    fn pod_marks_going_down_are_caught() {
        let h = H::new()
            .pod("p1", 2, &[("x", 5, 5000)])
            .pod("p2", 5, &[("x", 4, 9000)])
            .build();
        assert!(found(&h)[0].contains("pod p2 marked with token 4"));
    }
}

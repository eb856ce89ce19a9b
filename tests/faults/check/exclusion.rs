//! (d) At no instant do two claims on one target overlap.
//!
//! A claim is an interval of Valkey server time during which someone was
//! promised the lease:
//! - a client lease: from its acquisition to the latest acknowledged expiry
//!   (acquire or renew reply), cut short by its release at the last server
//!   time the client had seen before sending it (a lower bound of when the
//!   release took effect, so no false alarm; an acknowledged release's own
//!   server time is not one: its reply may come from a resend or a replay);
//! - a Held TargetLease: `[acquiredAt, expiresAt)` of its status, from the
//!   revision that published it until the revision that withdrew it;
//! - a marked pod: `[acquiredAt of the token, expires-at annotation)`.
//!
//! Published claims are compared at every etcd revision: the state at a
//! revision is each object's latest version at or before it (TargetLeases
//! and pods share etcd's revision counter, so this is one total order).

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{Property, Scope, Violation, group_by};
use crate::history::{History, OpKind, OpRecord};

/// An interval of server time promised to one issue.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Claim<'a> {
    who: &'a str,
    start: u64,
    end: u64,
}

fn overlap(a: &Claim, b: &Claim) -> bool {
    a.who != b.who && a.start.max(b.start) < a.end.min(b.end)
}

pub fn check(h: &History) -> Vec<Violation> {
    measure(h).0
}

/// The violations, and the longest overlap of two client leases in ms
/// ([`client_overlap_ms`]), from one pass over the claims.
pub fn measure(h: &History) -> (Vec<Violation>, Option<u64>) {
    let mut out = Vec::new();
    let overlap = clients(h, &mut out);
    statuses(h, &mut out);
    marks(h, &mut out);
    (out, overlap)
}

/// The claims of one client's operations on one target, in invoke order.
fn client_claims<'a>(ops: &[&'a OpRecord]) -> Vec<Claim<'a>> {
    let mut claims: Vec<Claim> = Vec::new();
    // The lease the client acts on: (token, issue, index in claims). A
    // lossy mode can hand the same token to a later acquisition of the same
    // client: that is a new claim, not an extension of the old one.
    let mut current: Option<(u64, &str, usize)> = None;
    let mut last_server = 0;
    for o in ops {
        match (o.kind, &o.lease) {
            (OpKind::Acquire, Some(l)) if o.answer.is("acquired") => {
                if let Some((token, issue, i)) = current
                    && (token, issue) == (l.token, l.issue.as_str())
                {
                    claims[i].end = claims[i].end.max(l.expires_at_ms);
                } else {
                    claims.push(Claim {
                        who: &l.issue,
                        start: l.acquired_at_ms,
                        end: l.expires_at_ms,
                    });
                    current = Some((l.token, &l.issue, claims.len() - 1));
                }
            }
            (OpKind::Renew, Some(l)) if o.answer.is("renewed") => {
                if let Some((token, _, i)) = current
                    && token == l.token
                    && o.token == Some(token)
                {
                    claims[i].end = claims[i].end.max(l.expires_at_ms);
                }
            }
            (OpKind::Release, _) => {
                if let Some((token, _, i)) = current
                    && Some(token) == o.token
                {
                    // The claim ends when the client decides to give the lease
                    // back. Even an acknowledged release's server time is not
                    // when it took effect: a reply can come from a resend or a
                    // replay after the release already ran.
                    claims[i].end = claims[i].end.min(last_server.max(claims[i].start));
                    current = None;
                }
            }
            _ => {}
        }
        if o.server_ms > 0 {
            last_server = last_server.max(o.server_ms);
        }
    }
    claims
}

/// Every client claim per target, by start.
fn claims_by_target(h: &History) -> BTreeMap<String, Vec<Claim<'_>>> {
    group_by(&h.ops, |o| o.target.as_str())
        .into_iter()
        .map(|(target, ops)| {
            let mut claims = Vec::new();
            for (_, mut mine) in group_by(ops, |o| o.client.as_str()) {
                mine.sort_by_key(|o| o.invoke_ms);
                claims.extend(client_claims(&mine));
            }
            claims.sort_by_key(|c| c.start);
            (target, claims)
        })
        .collect()
}

/// The longest time, in ms of server time, that two client leases on one
/// target were both promised; `None` when none overlapped.
pub fn client_overlap_ms(h: &History) -> Option<u64> {
    clients(h, &mut Vec::new())
}

/// Reports overlapping client claims; returns the longest overlap in ms.
fn clients(h: &History, out: &mut Vec<Violation>) -> Option<u64> {
    let mut longest = None;
    for (target, claims) in claims_by_target(h) {
        // Claims come by start, so the one reaching furthest is the one the
        // next claim overlaps the longest.
        let mut reach: Option<Claim> = None;
        for c in claims {
            if let Some(r) = &reach
                && overlap(r, &c)
            {
                let ms = r.end.min(c.end) - c.start;
                longest = Some(longest.map_or(ms, |l: u64| l.max(ms)));
                out.push(Violation::new(
                    Property::Exclusion,
                    Scope::Lease,
                    &target,
                    format!(
                        "{} held [{}, {}) while {} held [{}, {})",
                        c.who, c.start, c.end, r.who, r.start, r.end
                    ),
                ));
            }
            if reach.as_ref().is_none_or(|r| c.end > r.end) {
                reach = Some(c);
            }
        }
    }
    longest
}

/// Reports every pair of overlapping claims, once per pair.
fn report_pairs(
    scope: Scope,
    target: &str,
    at: u64,
    live: &BTreeMap<&str, Claim>,
    reported: &mut HashSet<(String, String)>,
    out: &mut Vec<Violation>,
) {
    let all: Vec<(&&str, &Claim)> = live.iter().collect();
    for (i, (na, a)) in all.iter().enumerate() {
        for (nb, b) in &all[i + 1..] {
            if overlap(a, b) && reported.insert((a.who.to_string(), b.who.to_string())) {
                out.push(Violation::new(
                    Property::Exclusion,
                    scope,
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

fn statuses(h: &History, out: &mut Vec<Violation>) {
    for (target, mut pubs) in group_by(&h.publications, |p| p.target.as_str()) {
        pubs.sort_by_key(|p| p.rv);
        let mut live: BTreeMap<&str, Claim> = BTreeMap::new();
        let mut reported = HashSet::new();
        for p in pubs {
            let claim = match (
                p.phase.as_str(),
                &p.acquisition_id,
                p.acquired_at_ms,
                p.expires_at_ms,
            ) {
                ("Held", Some(who), Some(start), Some(end)) => Some(Claim { who, start, end }),
                _ => None,
            };
            match claim {
                Some(c) => live.insert(&p.name, c),
                None => live.remove(p.name.as_str()),
            };
            report_pairs(Scope::Published, &target, p.rv, &live, &mut reported, out);
        }
    }
}

fn marks(h: &History, out: &mut Vec<Violation>) {
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
                report_pairs(Scope::Published, &m.lease, p.rv, l, &mut reported, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use crate::history::Answer;

    #[test]
    fn sequential_leases_are_clean() {
        let h = H::new()
            .acquired("a", "t", "r1", 1, 100, 200)
            .renew("a", "t", ("r1", 1), said("renewed"), 150, 300)
            .release("a", "t", 1, said("released"), 250) // cut at a's last server time, 150
            .acquired("b", "t", "r2", 2, 200, 400)
            .release("b", "t", 2, Answer::Unknown, 0) // cut at b's last server time, 200
            .acquired("c", "t", "r3", 3, 300, 500)
            .acquired("d", "t", "r4", 4, 500, 600) // c ran out at 500
            .publish("x", "op", 1, Some(5), Some(("q1", 1000, 5000)))
            .publish("x", "op", 2, Some(5), None)
            .publish("y", "op", 3, Some(6), Some(("q2", 2000, 9000)))
            .pod("p1", 4, &[("x", 5, 5000)])
            .pod("p1", 5, &[])
            .pod("p2", 6, &[("x", 6, 9000)])
            .build();
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn two_clients_holding_at_once_are_caught() {
        // e.g. a failover that lost the first lease, or a store granting twice.
        let h = H::new()
            .acquired("a", "t", "r1", 1, 100, 300)
            .acquired("b", "t", "r2", 2, 200, 400)
            .build();
        let v = check(&h);
        assert_eq!(v.len(), 1);
        assert!(
            v[0].detail
                .contains("r2 held [200, 400) while r1 held [100, 300)")
        );
        assert_eq!(client_overlap_ms(&h), Some(100));
    }

    #[test]
    fn the_longest_overlap_is_measured_against_the_claim_reaching_furthest() {
        // r2 overlaps r1 by 50 ms, r3 overlaps r1 by 150 and r2 by 80.
        let h = H::new()
            .acquired("a", "t", "r1", 1, 100, 400)
            .acquired("b", "t", "r2", 2, 200, 330)
            .acquired("c", "t", "r3", 3, 250, 500)
            .acquired("d", "u", "r4", 1, 0, 9000) // alone on its target
            .build();
        assert_eq!(client_overlap_ms(&h), Some(150));
        let clean = H::new()
            .acquired("a", "t", "r1", 1, 100, 200)
            .acquired("b", "t", "r2", 2, 200, 300)
            .build();
        assert_eq!(client_overlap_ms(&clean), None);
    }

    #[test]
    fn a_release_replayed_late_does_not_extend_the_claim() {
        // The release ran before a restart; its reply came from a resend after it.
        let h = H::new()
            .acquired("a", "t", "r1", 1, 100, 300)
            .release("a", "t", 1, said("released"), 290)
            .acquired("b", "t", "r2", 2, 200, 400)
            .build();
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn a_token_reissued_to_the_same_client_is_a_new_claim() {
        // Seen in failover-replicas-1: lib0 gave up r1 (its renewal was
        // unavailable, so no release), the counter went back after a failover,
        // and lib0's later acquisition r9 got token 1 again and was released.
        // r9 must not stretch r1's claim over b's legitimate lease in between.
        let h = H::new()
            .acquired("a", "t", "r1", 1, 100, 300)
            .renew("a", "t", ("r1", 1), Answer::Unavailable, 0, 0)
            .acquired("b", "t", "r2", 2, 400, 600)
            .renew("b", "t", ("r2", 2), said("renewed"), 450, 650)
            .release("b", "t", 2, said("released"), 500) // cut at 450
            .acquired("a", "t", "r9", 1, 700, 900)
            .renew("a", "t", ("r9", 1), said("renewed"), 750, 950)
            .release("a", "t", 1, said("released"), 800) // cut at 750
            .build();
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn a_renewal_extends_the_claim() {
        let h = H::new()
            .acquired("a", "t", "r1", 1, 100, 200)
            .renew("a", "t", ("r1", 1), said("renewed"), 150, 350)
            .acquired("b", "t", "r2", 2, 300, 400)
            .build();
        assert_eq!(check(&h).len(), 1);
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
        let v = check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].detail.contains("p1 claims [1000, 5000)"), "{v:?}");
    }
}

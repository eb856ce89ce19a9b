//! (d) At no instant do two claims on one target overlap.
//!
//! A client lease is claimed, in the clients' own clock (one host, one
//! clock), from the acknowledged acquire's reply until the holder's own
//! deadline: its time-to-live from when it sent the acquire or its last
//! acknowledged renewal (the `Instant` a careful holder stops at), cut short
//! when it stops acting on the lease (it sends its release, a renewal fails)
//! or a revoke of that lease is sent. Published claims (Held statuses, pod
//! marks) are compared at every etcd revision in [`super::published`].

use std::collections::{BTreeMap, HashMap};

use super::{Property, Scope, Violation, group_by};
use crate::history::{History, OpKind, OpRecord};

/// An interval of server time promised to one issue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Claim<'a> {
    pub who: &'a str,
    pub start: u64,
    pub end: u64,
}

pub(crate) fn overlap(a: &Claim, b: &Claim) -> bool {
    a.who != b.who && a.start.max(b.start) < a.end.min(b.end)
}

#[cfg(test)]
pub fn check(h: &History) -> Vec<Violation> {
    measure(h).0
}

/// The violations, and the longest overlap of two client leases in ms
/// ([`client_overlap_ms`]), from one pass over the claims.
pub fn measure(h: &History) -> (Vec<Violation>, Option<u64>) {
    let mut out = Vec::new();
    let overlap = clients(h, &mut out);
    out.extend(super::published::check(h));
    (out, overlap)
}

/// The requests of one client on one target, each as its attempts, in the
/// order they were sent.
fn requests<'a>(ops: &[&'a OpRecord]) -> Vec<Vec<&'a OpRecord>> {
    let mut out: Vec<Vec<&OpRecord>> = Vec::new();
    for o in ops {
        match out.last_mut() {
            Some(last) if last[0].kind == o.kind && last[0].request_id == o.request_id => {
                last.push(o)
            }
            _ => out.push(vec![o]),
        }
    }
    out
}

/// The claims of one client's operations on one target, in the client's own
/// (local) time: a lease is claimed from the acknowledged acquire's reply
/// until the holder's own deadline — its lease time-to-live from the moment
/// it sent the acquire (or the last acknowledged renewal) — cut short when it
/// stops acting on it: when it sends its release, or when a renewal fails
/// (a careful holder stops then). `cuts` are the times a revoke that may
/// have run was sent, per token.
fn client_claims<'a>(ops: &[&'a OpRecord], cuts: &HashMap<u64, u64>) -> Vec<Claim<'a>> {
    let mut claims: Vec<Claim> = Vec::new();
    // The lease the client acts on: (token, issue, ttl, index in claims).
    let mut current: Option<(u64, &str, u64, usize)> = None;
    for req in requests(ops) {
        let first = req[0];
        let sent = req.iter().map(|o| o.invoke_ms).min().unwrap_or(0);
        let acts_on_current = |c: Option<(u64, &'a str, u64, usize)>| {
            c.filter(|(token, issue, _, _)| {
                first.token == Some(*token) && first.issue.as_deref().is_none_or(|i| i == *issue)
            })
        };
        match first.kind {
            OpKind::Acquire => {
                let Some((o, l)) = req
                    .iter()
                    .find_map(|o| Some((o, o.lease.as_ref()?)).filter(|_| o.answer.is("acquired")))
                else {
                    continue;
                };
                let ttl = l.expires_at_ms.saturating_sub(l.acquired_at_ms);
                let mut end = sent + ttl;
                if let Some(&cut) = cuts.get(&l.token) {
                    end = end.min(cut.max(o.complete_ms));
                }
                claims.push(Claim {
                    who: &l.issue,
                    start: o.complete_ms,
                    end,
                });
                current = Some((l.token, &l.issue, ttl, claims.len() - 1));
            }
            OpKind::Renew => {
                let Some((token, _, ttl, i)) = acts_on_current(current) else {
                    continue;
                };
                let c = &mut claims[i];
                if req.iter().any(|o| o.answer.is("renewed")) {
                    let mut end = c.end.max(sent + ttl);
                    if let Some(&cut) = cuts.get(&token) {
                        end = end.min(cut.max(c.start));
                    }
                    c.end = end;
                } else {
                    let stopped = req.iter().map(|o| o.complete_ms).max().unwrap_or(sent);
                    c.end = c.end.min(stopped.max(c.start));
                    current = None;
                }
            }
            OpKind::Release => {
                if let Some((_, _, _, i)) = acts_on_current(current) {
                    claims[i].end = claims[i].end.min(sent.max(claims[i].start));
                    current = None;
                }
            }
            OpKind::Revoke => {}
        }
    }
    claims
}

/// When a revoke that may have run was first sent, per (target, token).
fn revoke_cuts(h: &History) -> HashMap<&str, HashMap<u64, u64>> {
    let mut by_request: BTreeMap<(&str, &str), Vec<&OpRecord>> = BTreeMap::new();
    for o in h.ops.iter().filter(|o| o.kind == OpKind::Revoke) {
        by_request
            .entry((&o.target, &o.request_id))
            .or_default()
            .push(o);
    }
    let mut cuts: HashMap<&str, HashMap<u64, u64>> = HashMap::new();
    for ((target, _), attempts) in by_request {
        let Some(token) = attempts[0].token else {
            continue;
        };
        if attempts.iter().all(|o| o.answer.promises_no_effect()) {
            continue;
        }
        let sent = attempts.iter().map(|o| o.invoke_ms).min().unwrap_or(0);
        let at = cuts.entry(target).or_default().entry(token).or_insert(sent);
        *at = (*at).min(sent);
    }
    cuts
}

/// Every client claim per target, by start.
fn claims_by_target(h: &History) -> BTreeMap<String, Vec<Claim<'_>>> {
    let cuts = revoke_cuts(h);
    let none = HashMap::new();
    group_by(&h.ops, |o| o.target.as_str())
        .into_iter()
        .map(|(target, ops)| {
            let mut claims = Vec::new();
            let cuts = cuts.get(target.as_str()).unwrap_or(&none);
            for (_, mut mine) in group_by(ops, |o| o.client.as_str()) {
                mine.sort_by_key(|o| o.invoke_ms);
                claims.extend(client_claims(&mine, cuts));
            }
            claims.sort_by_key(|c| c.start);
            (target, claims)
        })
        .collect()
}

/// The longest time, in ms of the clients' clock, that two client leases on
/// one target were both claimed; `None` when none overlapped.
#[cfg(test)]
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

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use crate::history::Answer;

    // Leases of ttl 100 (acquired/expires are server times; claims are in
    // the local times `at` sets: from the acquire's reply until it was sent
    // plus the ttl, or until the holder stops acting on it).

    #[test]
    fn sequential_leases_are_clean() {
        let h = H::new()
            .at(1000)
            .acquired("a", "t", "r1", 1, 1000, 1100) // [1001, 1100)
            .at(1050)
            .renew("a", "t", ("r1", 1), said("renewed"), 1050, 1150) // to 1150
            .at(1060)
            .release("a", "t", 1, said("released"), 1060) // cut at 1060
            .at(1060)
            .acquired("b", "t", "r2", 2, 1060, 1160) // [1061, 1160)
            .at(1070)
            .renew("b", "t", ("r2", 2), Answer::Unknown, 0, 0) // b stops at 1071
            .at(1075)
            .acquired("c", "t", "r3", 3, 1075, 1175) // the store: b's lease expired early? no: c only after
            .build();
        // b stopped acting at 1071 (its renewal failed), before c's reply.
        assert_eq!(check(&h), vec![]);
        let h = H::new()
            .at(1000)
            .acquired("a", "t", "r1", 1, 1000, 1100)
            .at(1100)
            .acquired("b", "t", "r2", 2, 1100, 1200) // a's deadline was 1100
            .build();
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn two_clients_holding_at_once_are_caught() {
        // e.g. a failover that lost the first lease, or a store granting twice.
        let h = H::new()
            .at(1000)
            .acquired("a", "t", "r1", 1, 1000, 1100) // [1001, 1100)
            .at(1050)
            .acquired("b", "t", "r2", 2, 1050, 1150) // [1051, 1150)
            .build();
        let v = check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].detail
                .contains("r2 held [1051, 1150) while r1 held [1001, 1100)"),
            "{v:?}"
        );
        assert_eq!(client_overlap_ms(&h), Some(49));
    }

    #[test]
    fn the_claim_lasts_until_the_holders_deadline_not_its_last_reply() {
        // a renewed at 1080 (sent then): its deadline is 1180, whatever the
        // expiry the reply carried; b acquired at 1150 overlaps it.
        let h = H::new()
            .at(1000)
            .acquired("a", "t", "r1", 1, 1000, 1100)
            .at(1080)
            .renew("a", "t", ("r1", 1), said("renewed"), 1080, 1120)
            .at(1150)
            .acquired("b", "t", "r2", 2, 1150, 1250)
            .build();
        assert_eq!(check(&h).len(), 1);
        assert_eq!(client_overlap_ms(&h), Some(29));
    }

    #[test]
    fn a_revoke_that_may_have_run_ends_the_claim_when_it_was_sent() {
        let base = || {
            H::new()
                .at(1000)
                .acquired("a", "t", "r1", 1, 1000, 1100)
                .at(1020)
        };
        let revoked = base()
            .revoke("t", "v1", 1, said("revoked"))
            .at(1030)
            .acquired("b", "t", "r2", 2, 1030, 1130)
            .build();
        assert_eq!(check(&revoked), vec![]);
        // A revoke that says it found nothing cuts nothing.
        let refused = base()
            .revoke("t", "v1", 1, said("not_owner"))
            .at(1030)
            .acquired("b", "t", "r2", 2, 1030, 1130)
            .build();
        assert_eq!(check(&refused).len(), 1);
    }

    #[test]
    fn a_token_reissued_to_the_same_client_is_a_new_claim() {
        // lib0 gave up r1 (its renewal was unavailable, so no release), the
        // counter went back after a failover, and lib0's later acquisition r9
        // got token 1 again: r9 must not stretch r1's claim over b's lease.
        let h = H::new()
            .at(1000)
            .acquired("a", "t", "r1", 1, 1000, 1100)
            .at(1010)
            .renew("a", "t", ("r1", 1), Answer::Unavailable, 0, 0) // a stops at 1011
            .at(1200)
            .acquired("b", "t", "r2", 2, 1200, 1300)
            .at(1250)
            .release("b", "t", 2, said("released"), 1250)
            .at(1300)
            .acquired("a", "t", "r9", 1, 1300, 1400)
            .build();
        assert_eq!(check(&h), vec![]);
    }
}

//! (c) What the operator publishes stays true to the store: a TargetLease
//! whose lease Valkey no longer has (revoked, lost) does not stay published
//! as Held. The operator learns of a revoke at once (the store announces
//! it) and of a loss at its next renewal, and withdraws Held right then; a
//! status still Held [`GRACE`] after an observer saw the target free or held
//! by another acquisition, before the status's own `expiresAt`, was kept
//! after the store said the lease ended.
//!
//! Judged only where no fault was injected around the sighting (a stopped
//! operator or API server cannot withdraw anything), and only while the
//! history goes on long enough to tell.

use std::collections::BTreeMap;

use super::{Property, Scope, Violation, group_by};
use crate::history::{History, Publication};

/// How long a status may go on claiming a lease Valkey no longer has.
pub const GRACE_MS: u64 = 3000;

pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let end = h
        .sightings
        .iter()
        .map(|s| s.at_ms)
        .chain(h.publications.iter().map(|p| p.seen_ms))
        .max()
        .unwrap_or(0);
    let quiet = |from: u64, to: u64| {
        !h.faults
            .iter()
            .any(|f| f.at_ms <= to && f.healed_ms.max(f.at_ms) + 2000 >= from)
    };
    for (target, pubs) in group_by(&h.publications, |p| p.target.as_str()) {
        // Per TargetLease, its versions in revision order.
        let mut versions: BTreeMap<&str, Vec<&Publication>> = BTreeMap::new();
        for p in pubs {
            versions.entry(&p.name).or_default().push(p);
        }
        for vs in versions.values_mut() {
            vs.sort_by_key(|p| p.rv);
        }
        let looks = h
            .sightings
            .iter()
            .filter(|s| s.target == target && s.invoke_ms > 0);
        'look: for look in looks {
            let until = look.at_ms + GRACE_MS;
            if until > end || !quiet(look.invoke_ms.saturating_sub(5000), until) {
                continue;
            }
            for vs in versions.values() {
                // The version seen last before the look, and the next one.
                let i = vs.partition_point(|p| p.seen_ms <= look.invoke_ms);
                let Some(v) = i.checked_sub(1).map(|i| vs[i]) else {
                    continue;
                };
                let withdrawn_by = vs.get(i).map_or(u64::MAX, |n| n.seen_ms);
                let (Some(acq), Some(expires)) = (&v.acquisition_id, v.expires_at_ms) else {
                    continue;
                };
                let backed = look.lease.as_ref().is_some_and(|l| l.issue == *acq);
                if v.phase != "Held"
                    || backed
                    || h.dating.latest(look.server_ms, look.at_ms) + 500 >= expires
                    || withdrawn_by <= until
                {
                    continue;
                }
                out.push(Violation::new(
                    Property::Honesty,
                    Scope::Published,
                    &target,
                    format!(
                        "{} stayed Held ({acq}, token {:?}, until {expires}) for more than {GRACE_MS} ms \
                         after the store showed the target {} at {}",
                        v.name,
                        v.token,
                        match &look.lease {
                            Some(l) => format!("held by {} (token {})", l.issue, l.token),
                            None => "free".into(),
                        },
                        h.dating.latest(look.server_ms, look.at_ms)
                    ),
                ));
                break 'look;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn held_must_be_withdrawn_soon_after_the_lease_is_gone() {
        // x Held q1 until 60000; at 1000 the target is free (revoked).
        let base = || {
            H::new()
                .at(100)
                .publish("x", "op", 1, Some(5), Some(("q1", 100, 60_000)))
                .at(1000)
                .look("op", None, 1000)
        };
        let withdrawn = base()
            .at(1200)
            .publish("x", "op", 2, Some(5), None)
            .at(9000)
            .look("op", None, 9000)
            .build();
        assert_eq!(check(&withdrawn), vec![]);
        let kept = base().at(9000).look("op", None, 9000).build();
        let v = check(&kept);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].detail.contains("x stayed Held (q1"), "{v:?}");
        // While its own lease is what the store shows, Held is right.
        let backed = H::new()
            .at(100)
            .publish("x", "op", 1, Some(5), Some(("q1", 100, 60_000)))
            .at(1000)
            .look("op", Some(view("o", 5, "q1", 100, 60_000)), 1000)
            .at(9000)
            .look("op", None, 9000)
            .build();
        // (The look at 9000 is too close to the end of the history to tell.)
        assert_eq!(check(&backed), vec![]);
    }

    #[test]
    fn without_a_store_clock_a_look_counts_from_its_reply() {
        use crate::history::Dating;
        // x Held q1 until 2000; a look dated 1000, before it was sent,
        // finds the target free.
        let history = |dating, answered_ms| {
            let mut h = H::new()
                .dated(dating)
                .at(100)
                .publish("x", "op", 1, Some(5), Some(("q1", 100, 2000)))
                .at(1000)
                .look("op", None, 1000)
                .at(9000)
                .look("op", None, 9000)
                .build();
            h.sightings[0].at_ms = answered_ms;
            h
        };
        // Answered within 500 ms of the expiry: Held may have been right.
        assert_eq!(check(&history(Dating::ClientBeforeSend, 1600)), vec![]);
        let early = check(&history(Dating::ClientBeforeSend, 1200));
        assert!(early[0].detail.contains("target free at 1200"), "{early:?}");
        let valkey = check(&history(Dating::Store, 1600));
        assert!(
            valkey[0].detail.contains("target free at 1000"),
            "{valkey:?}"
        );
    }
}

//! (c) Outcome honesty: an operation reported as a refusal or as
//! `backend_unavailable` had no effect.
//!
//! What the history can see:
//! - an acquire whose every attempt (same request id) was a refusal or
//!   `backend_unavailable` must never show up as a lease: not in an observer's
//!   `get`, not in another client's `held` reply (clients put their request
//!   id in the lease metadata);
//! - a fenced commit whose every attempt (same request id) was reported as
//!   refused or unavailable must not be the value at the end (a refusal
//!   after an unknown attempt proves nothing: a replay is revalidated);
//! - a PostgreSQL write reported as refused must not be a row at the end;
//! - a commit reported as refused or unavailable must never be read back.
//!
//! Renewals, releases, revokes and acknowledged commits are judged against
//! what observers saw in [`super::effects`].

use std::collections::{HashMap, HashSet};

use super::{Property, Scope, Violation};
use crate::history::{History, LeaseView, OpKind, Sink};

/// Every lease someone other than its holder saw: observers and `held` replies.
fn seen(h: &History) -> Vec<(&str, &LeaseView)> {
    let observed = h
        .sightings
        .iter()
        .filter_map(|s| Some((s.target.as_str(), s.lease.as_ref()?)));
    let held = h.ops.iter().filter_map(|o| {
        let l = o.lease.as_ref()?;
        (o.kind == OpKind::Acquire && o.answer.is("held")).then_some((o.target.as_str(), l))
    });
    observed.chain(held).collect()
}

pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    acquires(h, &mut out);
    writes(h, &mut out);
    out
}

fn acquires(h: &History, out: &mut Vec<Violation>) {
    // Per (target, request id): did every attempt promise "no effect"?
    let mut no_effect: HashMap<(&str, &str), bool> = HashMap::new();
    for o in h.ops.iter().filter(|o| o.kind == OpKind::Acquire) {
        let e = no_effect
            .entry((o.target.as_str(), o.request_id.as_str()))
            .or_insert(true);
        *e &= o.answer.promises_no_effect();
    }
    let mut reported = HashSet::new();
    for (target, lease) in seen(h) {
        if no_effect.get(&(target, lease.issue.as_str())) == Some(&true)
            && reported.insert((target, lease.issue.as_str()))
        {
            out.push(Violation::new(
                Property::Honesty,
                Scope::Lease,
                target,
                format!(
                    "acquire {} was reported as refused or unavailable, yet its lease (token {}) was seen",
                    lease.issue, lease.token
                ),
            ));
        }
    }
}

fn writes(h: &History, out: &mut Vec<Violation>) {
    // Per write id: (resource, did every attempt promise "no effect"?)
    let mut refused: HashMap<(Sink, &str), (&str, bool)> = HashMap::new();
    for w in &h.writes {
        let e = refused
            .entry((w.sink, w.write_id.as_str()))
            .or_insert((w.resource.as_str(), true));
        e.1 &= w.answer.promises_no_effect();
    }
    let read_back = h
        .reads
        .iter()
        .filter_map(|r| Some((Sink::Commit, r.committed.as_ref()?.1.as_str())));
    let landed = h
        .rows
        .iter()
        .flatten()
        .map(|r| (Sink::Postgres, r.write_id.as_str()))
        .chain(read_back)
        .chain(
            h.commits
                .iter()
                .flatten()
                .map(|c| (Sink::Commit, c.write_id.as_str())),
        );
    let mut reported = HashSet::new();
    for (sink, id) in landed {
        if let Some((resource, true)) = refused.get(&(sink, id))
            && reported.insert((sink, id))
        {
            let scope = match sink {
                Sink::Postgres => Scope::Postgres,
                Sink::Commit => Scope::Commit,
            };
            out.push(Violation::new(
                Property::Honesty,
                scope,
                resource,
                format!("write {id} was reported as refused or unavailable, yet it landed"),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use crate::history::Answer;

    #[test]
    fn honest_refusals_and_resolved_unknowns_are_clean() {
        let h = H::new()
            .acquire_answer(
                "a",
                "t",
                "r1",
                said("held"),
                Some(view("b", 1, "r0", 1, 9)),
                5,
            )
            .acquire_answer("a", "t", "r2", Answer::Unknown, None, 0)
            .acquire_answer(
                "a",
                "t",
                "r2",
                said("acquired"),
                Some(view("a", 2, "r2", 10, 20)),
                10,
            )
            .acquire_answer("c", "t", "r3", Answer::Unknown, None, 0)
            .sighting("t", view("c", 3, "r3", 30, 40)) // unknown: may have happened
            .write(Sink::Postgres, "t", 1, "w1", said("refused"), 0)
            .write(Sink::Commit, "t", 1, "c1", Answer::Unknown, 0)
            .write(Sink::Commit, "t", 1, "c1", said("stale_token"), 0)
            .rows(&[])
            .commits(&[("t", 1, "c1")])
            .build();
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn an_acquire_reported_unavailable_that_happened_is_caught() {
        // Control: a store that runs the acquire, then says backend_unavailable.
        let h = H::new()
            .acquire_answer("a", "t", "r1", Answer::Unavailable, None, 0)
            .acquire_answer(
                "b",
                "t",
                "r2",
                said("held"),
                Some(view("a", 1, "r1", 1, 9)),
                5,
            )
            .build();
        let v = check(&h);
        assert_eq!(v.len(), 1);
        assert!(v[0].detail.contains("acquire r1 was reported"), "{v:?}");
        let observed = H::new()
            .acquire_answer("a", "t", "r1", said("held"), None, 0)
            .sighting("t", view("a", 1, "r1", 1, 9))
            .build();
        assert_eq!(check(&observed).len(), 1);
    }

    #[test]
    fn refused_writes_that_landed_are_caught() {
        let h = H::new()
            .write(Sink::Postgres, "t", 1, "w1", said("refused"), 0)
            .write(Sink::Commit, "t", 1, "c1", Answer::Unavailable, 0)
            .rows(&[("t", 1, 1, "w1")])
            .commits(&[("t", 1, "c1")])
            .build();
        let scopes: Vec<Scope> = check(&h).iter().map(|v| v.scope).collect();
        assert_eq!(scopes, [Scope::Postgres, Scope::Commit]);
    }
}

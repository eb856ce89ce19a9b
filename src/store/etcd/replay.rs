//! The one replay rule, the same as the other stores' (`State::replay` in
//! the memory store, `replay` in `lua/lib.lua`): a request id seen before
//! returns the original result, revalidated against the lease as it is
//! now, and never acts twice.

use super::records::{Cached, Record, Slot, Stored};
use crate::store::{Outcome, Reply, Target};

/// How a replayed request is answered.
pub(super) enum Rule<'a> {
    /// The original outcome is final: it is returned again (release, revoke, commit).
    Done(fn(Outcome) -> &'static str),
    /// The original result is revalidated against the live lease (acquire, renew).
    Revalidate {
        live: Outcome,
        live_msg: &'static str,
        /// The caller's lease id, shown with a lease it proved it holds.
        lease_id: &'a str,
        superseded: fn(u64, &Record, &Target) -> Reply,
        ended: &'static str,
    },
}

pub(super) fn reply(
    now: u64,
    outcome: Outcome,
    lease: Option<crate::store::Lease>,
    message: &str,
) -> Reply {
    Reply {
        outcome,
        lease,
        server_time_ms: now,
        message: message.to_owned(),
    }
}

/// A reply without a lease.
pub(super) fn bare(now: u64, outcome: Outcome, message: &str) -> Reply {
    reply(now, outcome, None, message)
}

/// `None` when the request id is new (no cache `entry`); otherwise the reply.
pub(super) fn replay(
    entry: Option<&Stored>,
    fp: &str,
    slot: &Slot,
    now: u64,
    target: &Target,
    rule: Rule,
) -> Option<Reply> {
    let entry = entry?;
    let Some(c) = Cached::decode(&entry.value) else {
        return Some(bare(
            now,
            Outcome::CorruptState,
            "request cache entry is unreadable",
        ));
    };
    if c.fp != fp {
        return Some(bare(
            now,
            Outcome::IdempotencyConflict,
            "request id was used with different inputs",
        ));
    }
    Some(match rule {
        Rule::Done(message) => match Outcome::parse(&c.outcome) {
            Some(o) => bare(now, o, message(o)),
            None => bare(
                now,
                Outcome::CorruptState,
                "request cache entry is unreadable",
            ),
        },
        Rule::Revalidate {
            live,
            live_msg,
            lease_id,
            superseded,
            ended,
        } => {
            let same = |r: &Record| r.lease_id_sha256 == c.lease_id_sha256 && r.token == c.token;
            match slot {
                Slot::Corrupt { why, .. } => bare(now, Outcome::CorruptState, why),
                Slot::Live(r) if same(r) => {
                    reply(now, live, Some(r.lease(target, Some(lease_id))), live_msg)
                }
                // Its holder's deadline passed: ended, although etcd still keeps it.
                Slot::Lingering(r) if same(r) => bare(now, Outcome::Expired, ended),
                Slot::Live(r) | Slot::Lingering(r) => superseded(now, r, target),
                Slot::Free => bare(now, Outcome::Expired, ended),
            }
        }
    })
}

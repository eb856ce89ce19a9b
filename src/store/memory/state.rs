//! The memory store's state: lease slots, counters, commits, the request
//! cache, and the one replay rule.

use std::collections::HashMap;
use std::time::Duration;

use super::{CONFLICT, CORRUPT, bare, reply};
use crate::store::{Lease, LeaseHandle, Outcome, Reply, Target};

#[derive(Clone, Debug)]
pub(super) struct Record {
    pub(super) lease_id: String,
    pub(super) owner: String,
    pub(super) token: u64,
    pub(super) acquired_ms: u64,
    pub(super) expires_ms: u64,
    pub(super) max_expires_ms: Option<u64>,
    pub(super) metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

impl Record {
    pub(super) fn handle_matches(&self, h: &LeaseHandle) -> bool {
        self.lease_id == h.lease_id && self.owner == h.owner && self.token == h.token
    }

    pub(super) fn lease(&self, target: &Target) -> Lease {
        Lease {
            target: target.name.clone(),
            lease_id: Some(self.lease_id.clone()),
            owner: self.owner.clone(),
            fencing_token: self.token,
            acquired_at_ms: self.acquired_ms,
            expires_at_ms: self.expires_ms,
            max_expires_at_ms: self.max_expires_ms,
            metadata: self.metadata.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub(super) enum Slot {
    Live(Record),
    /// Unreadable state; `handle` is set when its handle's fields still parse.
    Corrupt {
        handle: Option<LeaseHandle>,
    },
}

#[derive(Clone, Debug)]
pub(super) struct Cached {
    pub(super) fingerprint: String,
    pub(super) lease_id: String,
    pub(super) token: u64,
    pub(super) outcome: Outcome,
    pub(super) expires_ms: u64,
}

/// How a replayed request is answered: the one replay rule (`replay` in
/// `lua/lib.lua` is the same rule for Valkey).
pub(super) enum Rule {
    /// The original outcome is final: it is returned again (release, revoke, commit).
    Done(fn(Outcome) -> &'static str),
    /// The original result is revalidated against the live lease (acquire, renew).
    Revalidate {
        live: Outcome,
        live_msg: &'static str,
        superseded: fn(u64, &Record, &Target) -> Reply,
        ended: &'static str,
    },
}

#[derive(Default)]
pub(super) struct State {
    pub(super) leases: HashMap<Target, Slot>,
    pub(super) counters: HashMap<Target, u64>,
    /// (token, value, committed at ms) per (target, key).
    pub(super) commits: HashMap<(Target, String), (u64, String, u64)>,
    pub(super) requests: HashMap<(&'static str, Target, String, String), Cached>,
}

impl State {
    /// The lease slot as seen at `now`: expired records are gone, like a backend TTL.
    pub(super) fn slot(&mut self, target: &Target, now: u64) -> Option<Slot> {
        match self.leases.get(target) {
            Some(Slot::Live(r)) if r.expires_ms <= now => {
                self.leases.remove(target);
                None
            }
            other => other.cloned(),
        }
    }

    /// The replay rule: `None` when the call's request id is new for its
    /// operation, otherwise the reply.
    pub(super) fn replay(
        &mut self,
        call: &IncomingWrite,
        slot: &Option<Slot>,
        rule: Rule,
    ) -> Option<Reply> {
        let (key, now) = (call.key(), call.now);
        let c = match self.requests.get(&key) {
            Some(c) if c.expires_ms > now => c.clone(),
            Some(_) => {
                self.requests.remove(&key);
                return None;
            }
            None => return None,
        };
        if c.fingerprint != call.fingerprint {
            return Some(bare(now, Outcome::IdempotencyConflict, CONFLICT));
        }
        Some(match rule {
            Rule::Done(message) => bare(now, c.outcome, message(c.outcome)),
            Rule::Revalidate {
                live,
                live_msg,
                superseded,
                ended,
            } => match slot {
                Some(Slot::Corrupt { .. }) => bare(now, Outcome::CorruptState, CORRUPT),
                Some(Slot::Live(r)) if r.lease_id == c.lease_id && r.token == c.token => {
                    reply(now, live, Some(r.lease(call.target)), live_msg)
                }
                Some(Slot::Live(r)) => superseded(now, r, call.target),
                None => bare(now, Outcome::Expired, ended),
            },
        })
    }

    /// Caches the call's result for `window` from now, for its replays.
    pub(super) fn remember(
        &mut self,
        call: IncomingWrite,
        lease_id: &str,
        token: u64,
        outcome: Outcome,
        window: Duration,
    ) {
        let cached = Cached {
            expires_ms: call.now + window.as_millis() as u64,
            lease_id: lease_id.to_owned(),
            token,
            outcome,
            fingerprint: call.fingerprint.clone(),
        };
        self.requests.insert(call.key(), cached);
    }
}

/// One write as the request cache sees it.
pub(super) struct IncomingWrite<'a> {
    /// `acquire`, `renew`, `release`, `revoke` or `commit`.
    pub(super) op: &'static str,
    pub(super) target: &'a Target,
    /// The owner (acquire, renew, release) or empty (revoke, commit).
    pub(super) scope: &'a str,
    pub(super) request_id: &'a str,
    /// The inputs a replay must repeat exactly.
    pub(super) fingerprint: String,
    /// The store's clock when the call came in.
    pub(super) now: u64,
}

impl IncomingWrite<'_> {
    fn key(&self) -> (&'static str, Target, String, String) {
        (
            self.op,
            self.target.clone(),
            self.scope.to_owned(),
            self.request_id.to_owned(),
        )
    }
}

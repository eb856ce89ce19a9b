//! Pure: when the keeper renews a lease, how long it waits after a failure,
//! and what a reply (or, while another replica takes over, a read) means.
//! No client required.

use std::time::{Duration, Instant};

use super::Kept;
use crate::store::{Outcome, Reply, StoreError};

/// What a keeper renewal found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Extended until `expires_ms`.
    Renewed {
        /// The new expiry (server milliseconds).
        expires_ms: u64,
        /// The hard end, when there is one.
        max_expires_ms: Option<u64>,
    },
    /// The lease is not there any more (or cannot be read): stop, and tell its reconcile.
    Ended,
    /// Another replica leads and renewed the lease (Valkey shows an expiry
    /// this process did not set): stop, it is that replica's now.
    HandedOver,
    /// The store could not be asked: try again soon.
    Retry,
    /// The renewal may have taken effect unheard (its reply was lost): try
    /// again soon, and until one is answered, renew without reading
    /// ([`super::Kept::unsure`]).
    Unknown,
    /// A reconcile renewed it meanwhile.
    NotDue,
}

/// When the keeper renews a lease on its schedule: once its reconcile is
/// late by a quarter of the slack a renewal interval leaves before the lease
/// runs out (the reconcile goes first), or at the retry time after a failure.
pub fn due_at(k: &Kept) -> Instant {
    let slack = k.ttl.saturating_sub(k.renew) / 4;
    k.retry_at.unwrap_or(k.confirmed_at + k.renew + slack)
}

/// Whether the keeper renews `k` now, at `now` (the store's clock says
/// `now_ms`): on its schedule ([`due_at`]), or — unless a failed renewal is
/// waiting for its retry time — as soon as an expiry status may publish has
/// passed with no confirmation sent after it ([`expiry_passed`]).
pub fn is_due(k: &Kept, now: Instant, now_ms: u64) -> bool {
    now >= due_at(k) || (k.retry_at.is_none() && expiry_passed(k, now_ms))
}

/// Whether an expiry status may publish for `k` has passed (by the store's
/// clock, `now_ms`) while the last confirmation was sent before it. A
/// reconcile that finds `Held` past its published expiry keeps it only if
/// the lease was confirmed to a request sent after that expiry
/// (`transition::left_before_expiry`): the keeper sends one at once, so
/// whenever the API server returns, that confirmation is already there.
pub fn expiry_passed(k: &Kept, now_ms: u64) -> bool {
    k.publishes
        .iter()
        .any(|&e| now_ms > e && k.confirmed_sent_ms.is_none_or(|sent| sent <= e))
}

/// Delay before the next attempt after `failures` failed ones: 200 ms
/// doubling to 5 s, but at most half the time `left` before the lease runs
/// out (at least 50 ms), so a few attempts still fit before it does. Once
/// nothing is left, the plain backoff, at least 1 s: the lease may be gone
/// (a renewal then only says so), and a store that does not answer is not
/// asked twenty times a second.
pub fn retry_after(failures: u32, left: Duration) -> Duration {
    let backoff = Duration::from_millis(200)
        .saturating_mul(1 << failures.min(5).saturating_sub(1))
        .min(Duration::from_secs(5));
    if left.is_zero() {
        return backoff.max(Duration::from_secs(1));
    }
    backoff.min(left / 2).max(Duration::from_millis(50))
}

/// While another replica takes over: whether `k` is still this process's to
/// renew, from a read of the lease. It is while Valkey shows the exact lease
/// with the expiry this process last set (nobody else renewed it yet: the
/// new leader has not confirmed it, and a renewal of the exact handle from
/// here is harmless). Another expiry means another replica renewed it
/// ([`After::HandedOver`]); another lease or none, that it ended. A lease
/// whose expiry has reached its hard end (`maxLifetime`) shows the same
/// expiry whoever renews it, and no renewal can extend it: it is left to
/// the new leader, whose reconcile replaces it. Only asked while this
/// process knows the expiry it set (not after a lost reply: [`Kept::unsure`]).
pub fn still_ours(k: &Kept, read: Result<Reply, StoreError>) -> Result<(), After> {
    let r = read.map_err(|_| After::Retry)?;
    match (r.outcome, r.lease) {
        (Outcome::Found, Some(l))
            if l.fencing_token == k.handle.token && l.owner == k.handle.owner =>
        {
            let capped = l
                .max_expires_at_ms
                .is_some_and(|end| l.expires_at_ms >= end);
            if l.expires_at_ms == k.expires_ms && !capped {
                Ok(())
            } else {
                Err(After::HandedOver)
            }
        }
        (Outcome::Found | Outcome::NotFound | Outcome::CorruptState, _) => Err(After::Ended),
        _ => Err(After::Retry),
    }
}

/// What a renewal reply means for the keeper.
pub fn after_renew(reply: &Result<Reply, StoreError>) -> After {
    match reply {
        Ok(r) => match (r.outcome, &r.lease) {
            (Outcome::Renewed, Some(l)) => After::Renewed {
                expires_ms: l.expires_at_ms,
                max_expires_ms: l.max_expires_at_ms,
            },
            (
                Outcome::NotOwner | Outcome::Expired | Outcome::NotFound | Outcome::CorruptState,
                _,
            ) => After::Ended,
            _ => After::Retry,
        },
        Err(StoreError::Invalid(_)) => After::Ended,
        Err(StoreError::OutcomeUnknown(_)) => After::Unknown,
        Err(StoreError::BackendUnavailable(_)) => After::Retry,
    }
}

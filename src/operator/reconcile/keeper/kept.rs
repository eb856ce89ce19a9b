//! What the keeper knows of one lease, and what of it a reconcile may rely on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store::{LeaseHandle, Target};

/// One lease this process confirmed with Valkey.
#[derive(Clone)]
pub struct Kept {
    /// Its target.
    pub target: Target,
    /// Its exact handle (the lease id is a secret: this type has no `Debug`).
    pub handle: LeaseHandle,
    /// The duration its last renewal asked for.
    pub ttl: Duration,
    /// How often its TargetLease renews it.
    pub renew: Duration,
    /// When the request that last confirmed it was sent.
    pub confirmed_at: Instant,
    /// Its expiry in Valkey per that confirmation (server milliseconds).
    pub expires_ms: u64,
    /// Its hard end (`maxLifetime`), when it has one.
    pub max_expires_ms: Option<u64>,
    /// The store's clock when that request was sent (estimated), once known.
    pub confirmed_sent_ms: Option<u64>,
    /// Its TargetLease's status (or a pod mark) may publish it: it was seen
    /// published, or a write that publishes it was sent, and no write of
    /// this process withdrawing it was acknowledged since. Only then does
    /// the keeper renew it.
    pub published: bool,
    /// The expiries (server milliseconds, as status shows them) status may
    /// publish for it: the keeper renews once one passes ([`expiry_passed`]).
    pub publishes: Vec<u64>,
    /// Another replica leads: renewed only until Valkey shows that one renewed it.
    pub handing_over: bool,
    /// A renewal of it may have taken effect unheard (its reply was lost):
    /// Valkey's expiry is not known until a renewal is answered. Meanwhile
    /// it is renewed (with the same lease id), never read to decide whether
    /// another replica renewed it, and its confirmation is shown to no
    /// reconcile (a lost plain renewal may have shortened it).
    pub unsure: bool,
    /// Confirmed before this replica took the lead over from another, which
    /// may have renewed it plainly since (for a shorter duration): still
    /// renewed, but its confirmation is shown to no reconcile until Valkey
    /// confirms it again in this term.
    pub stale: bool,
    pub(super) failures: u32,
    pub(super) retry_at: Option<Instant>,
    pub(super) in_flight: bool,
    /// Held by whoever renews the lease, so a reconcile and the keeper never
    /// renew it at once (one of them could shorten what the other published).
    pub(super) serial: Arc<tokio::sync::Mutex<()>>,
}

impl Kept {
    /// A lease Valkey confirmed to a request sent at `sent`.
    pub fn new(
        target: Target,
        handle: LeaseHandle,
        (ttl, renew): (Duration, Duration),
        sent: Instant,
        (expires_ms, max_expires_ms): (u64, Option<u64>),
    ) -> Self {
        Self {
            target,
            handle,
            ttl,
            renew,
            confirmed_at: sent,
            expires_ms,
            max_expires_ms,
            confirmed_sent_ms: None,
            published: false,
            publishes: Vec::new(),
            handing_over: false,
            unsure: false,
            stale: false,
            failures: 0,
            retry_at: None,
            in_flight: false,
            serial: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// What a reconcile may rely on: nothing while Valkey's expiry is not
    /// known for certain ([`Kept::unsure`], [`Kept::stale`]).
    pub fn confirmation(&self) -> Option<Confirmation> {
        (!self.unsure && !self.stale).then_some(Confirmation {
            at: self.confirmed_at,
            token: self.handle.token,
            expires_ms: self.expires_ms,
            max_expires_ms: self.max_expires_ms,
        })
    }
}

/// What a reconcile needs of the last confirmation of its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Confirmation {
    /// When the confirming request was sent.
    pub at: Instant,
    /// The token of the lease confirmed.
    pub token: u64,
    /// Its expiry in Valkey (server milliseconds).
    pub expires_ms: u64,
    /// Its hard end, when it has one.
    pub max_expires_ms: Option<u64>,
}

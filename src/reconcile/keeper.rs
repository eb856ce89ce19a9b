//! Keeps published leases alive in Valkey whatever the Kubernetes API does.
//!
//! A published lease is renewed by its TargetLease's reconcile, which then
//! publishes what the renewal confirmed. When that reconcile cannot run in
//! time — the API server is slow, down or hung, every reconcile slot waits on
//! it, or this replica stepped down because it cannot reach the API — the
//! keeper renews the lease instead, from what this process last confirmed
//! (owner, lease id, token, duration): no API call, and not held back by the
//! write gate. A renewal extends only the exact current lease (its lease id,
//! owner and token), so it can never take a target from anyone, issue a
//! token, or bring back a lease that ended; acquires and releases, which can,
//! stay behind the gate. docs/consistency.md has the argument in full,
//! including why a renewal from a replica that no longer leads is harmless.
//!
//! The keeper stops renewing a lease when the reconciler gives it up (a
//! release begins, the lease is lost), when Valkey says it ended, and for
//! every lease when this replica sees another one lead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc::UnboundedSender;
use kube::runtime::reflector::ObjectRef;

use super::clock::ServerClock;
use crate::crd::TargetLease;
use crate::leadership::Leadership;
use crate::store::{LeaseHandle, LeaseStore, Outcome, RenewRequest, Reply, StoreError, Target};

/// How often the keeper looks for overdue leases.
const TICK: Duration = Duration::from_millis(100);
/// Renewals the keeper has in flight at once.
const IN_FLIGHT: usize = 32;
/// How long without keeper renewals ends a spell of trouble (for logging).
const QUIET: Duration = Duration::from_secs(60);

/// One lease this process confirmed with Valkey.
#[derive(Clone)]
pub struct Kept {
    /// Its target.
    pub target: Target,
    /// Its exact identity (the lease id is a secret: this type has no `Debug`).
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
    /// Its TargetLease's status publishes it: only then does the keeper renew it.
    pub published: bool,
    failures: u32,
    retry_at: Option<Instant>,
    in_flight: bool,
    /// Held by whoever renews the lease, so a reconcile and the keeper never
    /// renew it at once (one of them could shorten what the other published).
    serial: Arc<tokio::sync::Mutex<()>>,
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
            published: false,
            failures: 0,
            retry_at: None,
            in_flight: false,
            serial: Arc::new(tokio::sync::Mutex::new(())),
        }
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

/// The published leases of one process, kept alive across leadership terms.
pub struct Keeper {
    store: Arc<dyn LeaseStore>,
    clock: Arc<ServerClock>,
    kept: Mutex<HashMap<ObjectRef<TargetLease>, Kept>>,
    wake: Mutex<Option<UnboundedSender<ObjectRef<TargetLease>>>>,
    /// When the keeper last renewed a lease in place of its reconcile.
    acted: Mutex<Option<Instant>>,
}

impl Keeper {
    /// A keeper renewing through `store`, learning Valkey's clock into `clock`.
    pub fn new(store: Arc<dyn LeaseStore>, clock: Arc<ServerClock>) -> Self {
        Self {
            store,
            clock,
            kept: Mutex::new(HashMap::new()),
            wake: Mutex::new(None),
            acted: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<TargetLease>, Kept>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where to send the TargetLeases whose lease the keeper found ended
    /// (the running controller's wake-ups; `None` between terms).
    pub fn wake_through(&self, tx: Option<UnboundedSender<ObjectRef<TargetLease>>>) {
        *self.wake.lock().unwrap_or_else(|p| p.into_inner()) = tx;
    }

    /// Valkey confirmed `kept` for `key` (an acquire or a renewal). The same
    /// lease stays published; another lease replaces the one kept.
    pub fn confirmed(&self, key: &ObjectRef<TargetLease>, mut kept: Kept) {
        let mut all = self.lock();
        if let Some(old) = all.get(key)
            && old.handle == kept.handle
        {
            kept.published = old.published;
            kept.serial = old.serial.clone();
            kept.in_flight = old.in_flight;
        }
        all.insert(key.clone(), kept);
    }

    /// Whether `key`'s status (as the API server last showed it) publishes
    /// the lease with `token` as held.
    pub fn published(&self, key: &ObjectRef<TargetLease>, token: Option<u64>, held: bool) {
        if let Some(k) = self.lock().get_mut(key) {
            k.published = held && token == Some(k.handle.token);
        }
    }

    /// The lease of `key` is given up (released, lost, or no longer this process's).
    pub fn forget(&self, key: &ObjectRef<TargetLease>) {
        self.lock().remove(key);
    }

    /// Another replica leads: it renews the leases now.
    pub fn forget_all(&self) {
        let mut all = self.lock();
        if !all.is_empty() {
            tracing::info!(
                leases = all.len(),
                "another replica leads; leaving the leases' renewals to it"
            );
        }
        all.clear();
    }

    /// The TargetLeases whose leases are kept.
    pub fn keys(&self) -> Vec<ObjectRef<TargetLease>> {
        self.lock().keys().cloned().collect()
    }

    /// Keeps only the leases whose TargetLease `keep` says still exists.
    pub fn retain(&self, mut keep: impl FnMut(&ObjectRef<TargetLease>) -> bool) {
        self.lock().retain(|k, _| keep(k));
    }

    /// The last confirmation of `key`'s lease, if this process has one.
    pub fn confirmation(&self, key: &ObjectRef<TargetLease>) -> Option<Confirmation> {
        self.lock().get(key).map(|k| Confirmation {
            at: k.confirmed_at,
            token: k.handle.token,
            expires_ms: k.expires_ms,
            max_expires_ms: k.max_expires_ms,
        })
    }

    /// The lock a renewal of `key`'s lease holds while it is sent.
    pub fn serial(&self, key: &ObjectRef<TargetLease>) -> Option<Arc<tokio::sync::Mutex<()>>> {
        self.lock().get(key).map(|k| k.serial.clone())
    }

    /// Leases kept.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no lease is kept.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Renews overdue published leases until the process ends. Never gated:
    /// `gate` only says whether this replica leads (when it does not, a
    /// renewal never shortens what Valkey has).
    pub async fn run(self: Arc<Self>, gate: Leadership) {
        let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
        loop {
            tokio::time::sleep(TICK).await;
            let now = Instant::now();
            let due = self.take_due(now);
            if due.is_empty() {
                continue;
            }
            // Once per spell of trouble (a minute without keeper renewals ends one).
            let last = self
                .acted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .replace(now);
            if last.is_none_or(|at| now.duration_since(at) > QUIET) {
                tracing::warn!(
                    leases = due.len(),
                    "renewing published leases whose reconcile is late (is the Kubernetes API slow or unreachable?)"
                );
            }
            for (key, kept) in due {
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    return;
                };
                let this = self.clone();
                let leading = gate.is_leading();
                tokio::spawn(async move {
                    let _permit = permit;
                    this.keep(key, kept, leading).await;
                });
            }
        }
    }

    /// The published leases due for a keeper renewal, marked in flight, the
    /// one closest to its expiry first (however many one namespace has due,
    /// the most urgent renewal goes out first). A lease whose reconcile is
    /// renewing it right now is not late.
    fn take_due(&self, now: Instant) -> Vec<(ObjectRef<TargetLease>, Kept)> {
        let mut all = self.lock();
        let mut due: Vec<_> = all
            .iter_mut()
            .filter(|(_, k)| k.published && !k.in_flight && now >= due_at(k))
            .filter(|(_, k)| k.serial.try_lock().is_ok())
            .map(|(key, k)| {
                k.in_flight = true;
                (key.clone(), k.clone())
            })
            .collect();
        due.sort_by_key(|(_, k)| k.expires_ms);
        due
    }

    async fn keep(&self, key: ObjectRef<TargetLease>, kept: Kept, leading: bool) {
        // A reconcile that started renewing it meanwhile goes on alone.
        let Ok(_serial) = kept.serial.clone().try_lock_owned() else {
            self.settle(&key, &kept.handle, Instant::now(), After::NotDue);
            return;
        };
        // A reconcile may have renewed it (or given it up) meanwhile.
        let current = self.lock().get(&key).cloned();
        let Some(current) = current.filter(|c| c.handle == kept.handle) else {
            return;
        };
        if !current.published || Instant::now() < due_at(&current) {
            self.settle(&key, &kept.handle, Instant::now(), After::NotDue);
            return;
        }
        let mut ttl = current.ttl;
        if !leading {
            // Another replica may lead by now and may have renewed the lease
            // for longer (a spec edit): read it, and never ask for less.
            let sent = Instant::now();
            let read = self.store.get(&current.target).await;
            if let Ok(r) = &read {
                self.clock.anchor(r.server_time_ms, sent);
            }
            match keep_ttl(ttl, &current.handle, read) {
                Ok(longer) => ttl = longer,
                Err(after) => {
                    self.settle(&key, &kept.handle, sent, after);
                    return;
                }
            }
        }
        let req = RenewRequest::new(current.target.clone(), current.handle.clone(), ttl);
        let sent = Instant::now();
        let reply = self.store.renew(&req).await;
        if let Ok(r) = &reply {
            self.clock.anchor(r.server_time_ms, sent);
        }
        let after = after_renew(&reply);
        match &after {
            After::Renewed { .. } => {
                tracing::debug!(lease = %key, "renewed a published lease whose reconcile is late")
            }
            After::Ended => {
                tracing::info!(lease = %key, outcome = ?reply.as_ref().map(|r| r.outcome), "a published lease ended in the store")
            }
            After::Retry | After::NotDue => {}
        }
        self.settle(&key, &kept.handle, sent, after);
    }

    fn settle(
        &self,
        key: &ObjectRef<TargetLease>,
        handle: &LeaseHandle,
        sent: Instant,
        after: After,
    ) {
        let mut all = self.lock();
        let Some(k) = all.get_mut(key).filter(|k| k.handle == *handle) else {
            return;
        };
        k.in_flight = false;
        match after {
            After::NotDue => {}
            After::Renewed {
                expires_ms,
                max_expires_ms,
            } => {
                k.confirmed_at = sent;
                k.expires_ms = expires_ms;
                k.max_expires_ms = max_expires_ms;
                k.failures = 0;
                k.retry_at = None;
            }
            After::Retry => {
                k.failures = k.failures.saturating_add(1);
                let left = Duration::from_millis(k.expires_ms.saturating_sub(self.clock.now_ms()));
                k.retry_at = Some(Instant::now() + retry_after(k.failures, left));
            }
            After::Ended => {
                all.remove(key);
                drop(all);
                if let Some(tx) = self.wake.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                    let _ = tx.unbounded_send(key.clone());
                }
            }
        }
    }
}

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
    /// The store did not answer: try again soon.
    Retry,
    /// A reconcile renewed it meanwhile.
    NotDue,
}

/// When the keeper renews a lease: once its reconcile is late by a quarter
/// of the slack a renewal interval leaves before the lease runs out (the
/// reconcile goes first), or at the retry time after a failure.
pub fn due_at(k: &Kept) -> Instant {
    let slack = k.ttl.saturating_sub(k.renew) / 4;
    k.retry_at.unwrap_or(k.confirmed_at + k.renew + slack)
}

/// Delay before the next attempt after `failures` failed ones: 200 ms
/// doubling to 5 s, but at most half the time `left` before the lease runs
/// out, so a few attempts still fit before it does.
pub fn retry_after(failures: u32, left: Duration) -> Duration {
    let backoff = Duration::from_millis(200).saturating_mul(1 << failures.min(5).saturating_sub(1));
    backoff
        .min(Duration::from_secs(5))
        .min(left / 2)
        .max(Duration::from_millis(50))
}

/// The duration a renewal from a replica that may no longer lead asks for,
/// from a read of the lease: never less than what Valkey has left (another
/// replica may have renewed it for longer), or why not to renew at all.
pub fn keep_ttl(
    ttl: Duration,
    handle: &LeaseHandle,
    read: Result<Reply, StoreError>,
) -> Result<Duration, After> {
    let r = read.map_err(|_| After::Retry)?;
    match (r.outcome, r.lease) {
        (Outcome::Found, Some(l)) if l.fencing_token == handle.token && l.owner == handle.owner => {
            let left = Duration::from_millis(l.expires_at_ms.saturating_sub(r.server_time_ms));
            Ok(ttl.max(left))
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
        Err(_) => After::Retry,
    }
}

#[cfg(test)]
#[path = "keeper_tests.rs"]
mod tests;

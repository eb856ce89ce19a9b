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
//! token, or bring back a lease that ended; and a keeper renewal only ever
//! extends it (never moves its expiry earlier). Acquires and releases, which
//! can move a lease, stay behind the gate. docs/consistency.md has the
//! argument in full, including why a renewal from a replica that no longer
//! leads is harmless.
//!
//! A lease counts as published from the moment this process sends a write
//! that may publish it (a status write or a pod mark: its reply can be lost
//! while the write took effect) or sees it published, until a write of its
//! own that withdraws it is acknowledged. The keeper stops renewing a lease
//! then, when the reconciler gives it up after Valkey ended it, when Valkey
//! says it ended, and — once this replica sees another one lead — as soon as
//! Valkey shows that the new leader renewed it. When this replica takes the
//! lead over from another, it starts afresh.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc::UnboundedSender;
use kube::runtime::reflector::ObjectRef;

use super::clock::ServerClock;
use super::plan;
use crate::crd::{TargetLease, TargetLeaseStatus};
use crate::store::{LeaseHandle, LeaseStore, RenewRequest, Target};

mod policy;

pub use policy::*;

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
            confirmed_sent_ms: None,
            published: false,
            publishes: Vec::new(),
            handing_over: false,
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

    /// Valkey confirmed `kept` for `key` (an acquire or a renewal by its
    /// reconcile). The same lease stays published; another lease replaces
    /// the one kept.
    pub fn confirmed(&self, key: &ObjectRef<TargetLease>, mut kept: Kept) {
        kept.confirmed_sent_ms = self.clock.at(kept.confirmed_at);
        let mut all = self.lock();
        if let Some(old) = all.get(key)
            && old.handle == kept.handle
        {
            kept.published = old.published;
            kept.publishes = old.publishes.clone();
            kept.handing_over = old.handing_over;
            kept.serial = old.serial.clone();
            kept.in_flight = old.in_flight;
        }
        all.insert(key.clone(), kept);
    }

    /// `key`'s status, as the API server showed it (possibly from a cache
    /// older than a write of ours) or as a write about to be sent may
    /// publish it: a status that publishes the kept lease makes it published
    /// from now on; one that does not changes nothing (the write that
    /// published it may still be in flight, or land after the read).
    pub fn may_publish(&self, key: &ObjectRef<TargetLease>, status: &TargetLeaseStatus) {
        if let Some(k) = self.lock().get_mut(key)
            && let Some(expiry) = publication(k, status)
        {
            k.published = true;
            if let Some(e) = expiry {
                let covered = k.confirmed_sent_ms;
                k.publishes
                    .retain(|p| *p != e && covered.is_none_or(|s| *p >= s));
                k.publishes.push(e);
            }
        }
    }

    /// A write of ours was acknowledged, and the API server's copy after it
    /// has `status`: whether it publishes the kept lease (and with which
    /// expiry) is now known for certain.
    pub fn acknowledged(&self, key: &ObjectRef<TargetLease>, status: &TargetLeaseStatus) {
        if let Some(k) = self.lock().get_mut(key) {
            let publication = publication(k, status);
            k.published = publication.is_some();
            k.publishes = publication.flatten().into_iter().collect();
        }
    }

    /// The lease of `key` is given up (Valkey ended it, or its release was
    /// published and sent, or its TargetLease is gone).
    pub fn forget(&self, key: &ObjectRef<TargetLease>) {
        self.lock().remove(key);
    }

    /// Another replica leads: it renews the leases now. Each lease is still
    /// renewed from here until Valkey shows that the new leader renewed it
    /// ([`still_ours`]), so the lease never waits on the new leader's first
    /// reconcile of it.
    pub fn hand_over(&self) {
        let mut all = self.lock();
        let fresh = all.values().filter(|k| !k.handing_over).count();
        if fresh > 0 {
            tracing::info!(
                leases = fresh,
                "another replica leads; renewing the leases only until it does"
            );
        }
        for k in all.values_mut() {
            k.handing_over = true;
        }
    }

    /// This replica took the lead over from another (or from a released
    /// record): what it kept from before may be stale (another replica may
    /// have renewed, republished or ended the leases since), so it forgets
    /// it all; each reconcile confirms its lease afresh.
    pub fn forget_all(&self) {
        let mut all = self.lock();
        if !all.is_empty() {
            tracing::info!(
                leases = all.len(),
                "took over the lead from another replica; confirming every lease afresh"
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

    /// Renews overdue published leases until the process ends. Never gated,
    /// and never shortening a lease: whichever replica leads, a keeper
    /// renewal keeps the later of Valkey's expiry and now + the duration.
    pub async fn run(self: Arc<Self>) {
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
                tokio::spawn(async move {
                    let _permit = permit;
                    this.keep(key, kept).await;
                });
            }
        }
    }

    /// The published leases due for a keeper renewal, marked in flight, the
    /// one closest to its expiry first (however many one namespace has due,
    /// the most urgent renewal goes out first). A lease whose reconcile is
    /// renewing it right now is not late.
    fn take_due(&self, now: Instant) -> Vec<(ObjectRef<TargetLease>, Kept)> {
        let now_ms = self.clock.now_ms();
        let mut all = self.lock();
        let mut due: Vec<_> = all
            .iter_mut()
            .filter(|(_, k)| k.published && !k.in_flight && is_due(k, now, now_ms))
            .filter(|(_, k)| k.serial.try_lock().is_ok())
            .map(|(key, k)| {
                k.in_flight = true;
                (key.clone(), k.clone())
            })
            .collect();
        due.sort_by_key(|(_, k)| k.expires_ms);
        due
    }

    async fn keep(&self, key: ObjectRef<TargetLease>, kept: Kept) {
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
        if !current.published || !is_due(&current, Instant::now(), self.clock.now_ms()) {
            self.settle(&key, &kept.handle, Instant::now(), After::NotDue);
            return;
        }
        if current.handing_over {
            // Another replica leads: renew only while nobody else has.
            let sent = Instant::now();
            let read = self.store.get(&current.target).await;
            if let Ok(r) = &read {
                self.clock.anchor(r.server_time_ms, sent);
            }
            if let Err(after) = still_ours(&current, read) {
                self.settle(&key, &kept.handle, sent, after);
                return;
            }
        }
        // Extend-only: another replica (a new leader) may have renewed it
        // for longer meanwhile (a spec edit lengthened it).
        let req = RenewRequest::new(current.target.clone(), current.handle.clone(), current.ttl)
            .extending_only();
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
            After::Retry | After::NotDue | After::HandedOver => {}
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
                k.confirmed_sent_ms = self.clock.at(sent);
                k.expires_ms = expires_ms;
                k.max_expires_ms = max_expires_ms;
                k.failures = 0;
                k.retry_at = None;
            }
            After::HandedOver => {
                tracing::debug!(lease = %key, "the new leader renewed the lease; leaving it to that replica");
                all.remove(key);
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

/// Whether `status` publishes the kept lease `k` (held or unknown, its
/// token), and with which expiry (server milliseconds), if any.
fn publication(k: &Kept, status: &TargetLeaseStatus) -> Option<Option<u64>> {
    (plan::holds_lease(status) && status.fencing_token == Some(k.handle.token)).then(|| {
        status
            .expires_at
            .as_ref()
            .and_then(|t| u64::try_from(t.0.as_millisecond()).ok())
    })
}

#[cfg(test)]
#[path = "keeper_tests.rs"]
mod tests;

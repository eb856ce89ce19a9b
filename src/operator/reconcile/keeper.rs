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
//! Valkey shows that the new leader renewed it (never judged from a renewal
//! of its own whose reply was lost). When this replica takes the lead over
//! from another, it keeps renewing what it kept, but no reconcile relies on
//! what it confirmed before until Valkey confirms it again; and nothing a
//! term started (the keeper's renewals, a reconcile's) acts or publishes
//! once that term has ended.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc::UnboundedSender;
use kube::runtime::reflector::ObjectRef;

use super::clock::ServerClock;
use super::name::NsName;
use super::plan;
use crate::operator::crd::{TargetLease, TargetLeaseStatus};
use crate::store::{LeaseHandle, LeaseStore, RenewRequest};

mod kept;
mod policy;

pub use kept::*;
pub use policy::*;

/// How often the keeper looks for overdue leases.
const TICK: Duration = Duration::from_millis(100);
/// Renewals the keeper has in flight at once.
const IN_FLIGHT: usize = 32;
/// How long without keeper renewals ends a spell of trouble (for logging).
const QUIET: Duration = Duration::from_secs(60);

/// The published leases of one process, kept alive across leadership terms.
pub struct Keeper {
    store: Arc<dyn LeaseStore>,
    clock: Arc<ServerClock>,
    /// Boxed: a map's room for 10,000 leases is 16,384 slots, each as
    /// large as its value; a box puts the rest where there is a lease.
    kept: Mutex<HashMap<NsName, Box<Kept>>>,
    wake: Mutex<Option<UnboundedSender<ObjectRef<TargetLease>>>>,
    /// When the keeper last renewed a lease in place of its reconcile.
    acted: Mutex<Option<Instant>>,
    /// Which leader the keeper works for, counted: it changes (only while
    /// `kept` is locked) when this process first sees another replica lead
    /// and when it takes the lead over. Whatever was started under one term
    /// — a keeper renewal, a reconcile's — neither publishes nor acts once
    /// it has ended.
    term: AtomicU64,
    /// Another replica leads (as last seen).
    following: AtomicBool,
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
            term: AtomicU64::new(0),
            following: AtomicBool::new(false),
        }
    }

    /// The current term ([`Keeper::confirmed`], [`Keeper::may_publish`]
    /// take the term their pass started in).
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<NsName, Box<Kept>>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where to send the TargetLeases whose lease the keeper found ended
    /// (the running controller's wake-ups; `None` between terms).
    pub fn wake_through(&self, tx: Option<UnboundedSender<ObjectRef<TargetLease>>>) {
        *self.wake.lock().unwrap_or_else(|p| p.into_inner()) = tx;
    }

    /// Valkey confirmed `kept` for `key` (an acquire or a renewal by its
    /// reconcile, in `term`). The same lease stays published; another lease
    /// replaces the one kept. Nothing changes once `term` has ended.
    pub fn confirmed(&self, key: &ObjectRef<TargetLease>, mut kept: Kept, term: u64) {
        kept.confirmed_sent_ms = self.clock.at(kept.confirmed_at);
        let mut all = self.lock();
        if term != self.term() {
            return;
        }
        let key = NsName::shared_of(key);
        if let Some(old) = all.get(&key)
            && old.handle == kept.handle
        {
            kept.published = old.published;
            kept.publishes = old.publishes.clone();
            kept.handing_over = old.handing_over;
            kept.serial = old.serial.clone();
            kept.in_flight = old.in_flight;
        }
        all.insert(key, Box::new(kept));
    }

    /// `key`'s status, as the API server showed it (possibly from a cache
    /// older than a write of ours) or as a write about to be sent may
    /// publish it: a status that publishes the kept lease makes it published
    /// from now on; one that does not changes nothing (the write that
    /// published it may still be in flight, or land after the read).
    /// Nothing changes once `term`, the pass's, has ended.
    pub fn may_publish(&self, key: &ObjectRef<TargetLease>, status: &TargetLeaseStatus, term: u64) {
        let mut all = self.lock();
        if term != self.term() {
            return;
        }
        if let Some(k) = all.get_mut(&NsName::of(key))
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
        if let Some(k) = self.lock().get_mut(&NsName::of(key)) {
            let publication = publication(k, status);
            k.published = publication.is_some();
            k.publishes = publication.flatten().into_iter().collect();
        }
    }

    /// The lease of `key` is given up (Valkey ended it, or its release was
    /// published and sent, or its TargetLease is gone).
    pub fn forget(&self, key: &ObjectRef<TargetLease>) {
        self.lock().remove(&NsName::of(key));
    }

    /// A reconcile's renewal of the kept lease with `token` got no answer:
    /// it may have taken effect, so Valkey's expiry is not known until a
    /// renewal is answered ([`Kept::unsure`]).
    pub fn maybe_renewed(&self, key: &ObjectRef<TargetLease>, token: u64) {
        if let Some(k) = self.lock().get_mut(&NsName::of(key))
            && k.handle.token == token
        {
            k.unsure = true;
        }
    }

    /// Another replica leads: it renews the leases now. Each lease is still
    /// renewed from here until Valkey shows that the new leader renewed it
    /// ([`still_ours`]), so the lease never waits on the new leader's first
    /// reconcile of it. The first sight of another leader ends this
    /// replica's term (called on every election round that sees one).
    pub fn hand_over(&self) {
        let mut all = self.lock();
        if !self.following.swap(true, Ordering::SeqCst) {
            self.term.fetch_add(1, Ordering::SeqCst);
        }
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
    /// record): a new term. What it confirmed before may be stale — the
    /// other replica may have renewed a lease plainly for a shorter duration
    /// — so no reconcile relies on it until Valkey confirms it again
    /// ([`Kept::stale`]). But every lease it kept is still renewed: some of
    /// them only this replica renews (the other one never reached them, or
    /// crashed), and an extend-only renewal of the exact lease is harmless
    /// whoever renewed it last; one that ended is dropped at its next
    /// renewal, as always.
    pub fn take_over(&self) {
        let mut all = self.lock();
        self.following.store(false, Ordering::SeqCst);
        self.term.fetch_add(1, Ordering::SeqCst);
        if !all.is_empty() {
            tracing::info!(
                leases = all.len(),
                "took over the lead from another replica; renewing what this replica kept until each lease is confirmed afresh"
            );
        }
        for k in all.values_mut() {
            k.handing_over = false;
            k.stale = true;
        }
    }

    /// The TargetLeases whose leases are kept.
    pub fn keys(&self) -> Vec<NsName> {
        self.keys_where(|_| true)
    }

    /// The TargetLeases whose leases are kept, of those `pick` picks.
    pub fn keys_where(&self, mut pick: impl FnMut(&NsName) -> bool) -> Vec<NsName> {
        self.lock().keys().filter(|k| pick(k)).cloned().collect()
    }

    /// Keeps only the leases whose TargetLease `keep` says still exists.
    pub fn retain(&self, mut keep: impl FnMut(&NsName) -> bool) {
        self.lock().retain(|k, _| keep(k));
    }

    /// The last confirmation of `key`'s lease a reconcile may rely on, if
    /// this process has one ([`Kept::confirmation`]).
    pub fn confirmation(&self, key: &ObjectRef<TargetLease>) -> Option<Confirmation> {
        self.lock()
            .get(&NsName::of(key))
            .and_then(|k| k.confirmation())
    }

    /// The lock a renewal of `key`'s lease holds while it is sent.
    pub fn serial(&self, key: &ObjectRef<TargetLease>) -> Option<Arc<tokio::sync::Mutex<()>>> {
        self.lock().get(&NsName::of(key)).map(|k| k.serial.clone())
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
            if due.1.is_empty() {
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
                    leases = due.1.len(),
                    "renewing published leases whose reconcile is late (is the Kubernetes API slow or unreachable?)"
                );
            }
            let (term, due) = due;
            for (key, kept) in due {
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    return;
                };
                let this = self.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    this.keep(key, kept, term).await;
                });
            }
        }
    }

    /// The published leases due for a keeper renewal, marked in flight, the
    /// one closest to its expiry first (however many one namespace has due,
    /// the most urgent renewal goes out first). A lease whose reconcile is
    /// renewing it right now is not late. With the term they were taken in.
    fn take_due(&self, now: Instant) -> (u64, Vec<(NsName, Kept)>) {
        let now_ms = self.clock.now_ms();
        let mut all = self.lock();
        let term = self.term();
        let mut due: Vec<_> = all
            .iter_mut()
            .filter(|(_, k)| k.published && !k.in_flight && is_due(k, now, now_ms))
            .filter(|(_, k)| k.serial.try_lock().is_ok())
            .map(|(key, k)| {
                k.in_flight = true;
                (key.clone(), Kept::clone(k))
            })
            .collect();
        due.sort_by_key(|(_, k)| k.expires_ms);
        (term, due)
    }

    /// Renews `kept` (taken in `term`), unless that is not needed any more.
    async fn keep(&self, key: NsName, kept: Kept, term: u64) {
        let settle = |sent, after| self.settle(&key, &kept.handle, term, sent, after);
        // A reconcile that started renewing it meanwhile goes on alone.
        let Ok(_serial) = kept.serial.clone().try_lock_owned() else {
            settle(Instant::now(), After::NotDue);
            return;
        };
        // A reconcile may have renewed it (or given it up) meanwhile.
        let current = self.lock().get(&key).map(|k| Kept::clone(k));
        let Some(current) = current.filter(|c| c.handle == kept.handle) else {
            return;
        };
        if !current.published || !is_due(&current, Instant::now(), self.clock.now_ms()) {
            settle(Instant::now(), After::NotDue);
            return;
        }
        // Another replica leads: renew only while nobody else has. After a
        // lost reply Valkey's expiry may be this replica's own unheard
        // renewal: renew (the same lease id) until one is answered.
        if current.handing_over && !current.unsure {
            let sent = Instant::now();
            let read = self.store.get(&current.target).await;
            if let Ok(r) = &read {
                self.clock.anchor(r.server_time_ms, sent);
            }
            if let Err(after) = still_ours(&current, read) {
                settle(sent, after);
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
            After::Retry | After::Unknown | After::NotDue | After::HandedOver => {}
        }
        settle(sent, after);
    }

    /// Applies what a keeper renewal of `handle`, taken in `term`, found —
    /// unless that term has ended meanwhile: then it only records the expiry
    /// the renewal set (or that its reply was lost) and makes the lease due
    /// again (the new term decides afresh).
    fn settle(&self, key: &NsName, handle: &LeaseHandle, term: u64, sent: Instant, after: After) {
        let mut all = self.lock();
        let Some(k) = all.get_mut(key).filter(|k| k.handle == *handle) else {
            return;
        };
        k.in_flight = false;
        if term != self.term() {
            // Nothing from an ended term publishes or confirms, but what the
            // renewal did in Valkey is still this replica's doing: an expiry
            // it set is not the new leader's renewal, and a lost reply leaves
            // the lease unsure (renewed without reading until answered).
            match after {
                After::Renewed {
                    expires_ms,
                    max_expires_ms,
                } => {
                    k.expires_ms = expires_ms;
                    k.max_expires_ms = max_expires_ms;
                }
                After::Unknown => k.unsure = true,
                _ => {}
            }
            return;
        }
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
                k.unsure = false;
                k.stale = false;
                k.failures = 0;
                k.retry_at = None;
            }
            After::HandedOver => {
                tracing::debug!(lease = %key, "the new leader renewed the lease; leaving it to that replica");
                all.remove(key);
            }
            After::Retry | After::Unknown => {
                k.unsure |= after == After::Unknown;
                k.failures = k.failures.saturating_add(1);
                let left = Duration::from_millis(k.expires_ms.saturating_sub(self.clock.now_ms()));
                k.retry_at = Some(Instant::now() + retry_after(k.failures, left));
            }
            After::Ended => {
                all.remove(key);
                drop(all);
                if let Some(tx) = self.wake.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                    let _ = tx.unbounded_send(key.to_ref());
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
mod tests;

#[cfg(test)]
mod term_tests;

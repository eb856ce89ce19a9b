//! The reconciler: fresh object -> finalizer -> plan -> store call ->
//! transition -> publish -> Action.
//!
//! Level-triggered: each pass reads the resource (never older than the
//! operator's own last write), the pod and lease caches (only once synced)
//! and the store, decides with the pure [`plan`] and [`transition`] modules
//! and makes it so in the one fixed order the executor states (`executor.rs`).
//! Every step is safe to repeat and to interrupt: acquisitions carry an id
//! recorded in status *before* the store is called, and a lease is
//! unpublished *before* it is released, so a crash anywhere is resolved by
//! the next pass.

pub mod clock;
pub mod echoes;
mod executor;
mod floor;
pub mod index;
pub mod keeper;
pub mod marks;
pub mod name;
mod observe;
mod pass;
pub mod plan;
pub mod pod_index;
pub mod pods;
pub mod queue;
pub mod renewals;
pub mod selectors;
pub mod slots;
pub mod spec;
pub mod transition;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc::UnboundedSender;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::operator::api_timeout::ApiTimedOut;
use crate::operator::crd::TargetLease;
use crate::operator::floor::FloorStore;
use crate::operator::leadership::{Leadership, NotLeader};
use crate::operator::lease_id::LeaseIdKey;
use crate::store::LeaseStore;
use clock::ServerClock;
use keeper::Keeper;

/// Finalizer that guarantees the lease is released before the resource goes.
pub const FINALIZER: &str = "targetlease.dev/release";
/// How long a reconcile waits for the caches to sync before it is requeued.
const READY_WAIT: Duration = Duration::from_secs(1);
/// The one field manager for status.
pub const FIELD_MANAGER: &str = "targetlease-operator";

/// Shared state of the reconciler.
pub struct Context {
    /// Kubernetes client.
    pub client: kube::Client,
    /// The lease store.
    pub store: Arc<dyn LeaseStore>,
    /// Cache of every TargetLease (for queues and token floors).
    pub leases: Store<TargetLease>,
    /// The TargetLeases of the cache by target and namespace.
    pub lease_index: Arc<index::LeaseIndex>,
    /// Cache of pods (for holders tied to pods and for candidates), indexed.
    pub pods: pod_index::PodCache,
    /// Candidate selectors, compiled once per TargetLease version.
    pub selectors: Arc<selectors::Selectors>,
    /// The reconcile slots (`--concurrency`), shared fairly among namespaces.
    pub slots: Arc<slots::FairSlots>,
    /// Tokens of deleted leases.
    pub floors: FloorStore,
    /// Publishes Events.
    pub recorder: crate::operator::events::Recorder,
    /// Derives lease ids from acquisition ids.
    pub lease_ids: LeaseIdKey,
    /// Wakes other TargetLeases (same target) when the queue may have moved.
    pub wake: UnboundedSender<ObjectRef<TargetLease>>,
    /// The versions this process wrote: their watch events trigger nothing.
    pub echoes: Arc<echoes::Echoes>,
    /// Reconcile metrics.
    pub metrics: crate::operator::metrics::OperatorMetrics,
    /// Open while this replica may write.
    pub leadership: Leadership,
    /// Every cache the planner reads has synced (and the store's clock was
    /// read); no pass plans before.
    pub ready: crate::operator::readiness::Ready,
    /// What this process remembers per TargetLease (dropped when it goes);
    /// boxed, so the map's spare room costs a pointer per slot.
    pub carryover: Mutex<HashMap<name::NsName, Box<Carryover>>>,
    /// Highest token this process published per (namespace, target).
    pub published: Mutex<floor::Published>,
    /// Valkey's clock, estimated from every answer (shared with the keeper).
    pub clock: Arc<ServerClock>,
    /// What Valkey last confirmed of each lease; renews published leases whose
    /// reconcile is late (lives across leadership terms).
    pub keeper: Arc<Keeper>,
    /// When each published lease's next renewal pass is due.
    pub renewals: Arc<renewals::Renewals>,
}

/// Per-TargetLease state kept between passes.
#[derive(Clone, Debug, Default)]
pub struct Carryover {
    /// Consecutive failures (store or API), for backoff.
    pub failures: u32,
    /// The newest resourceVersion this process wrote or read; a cached object
    /// with another version is re-read before planning.
    pub known_version: Option<String>,
    /// The last API call failed (a conflict, a refused patch): re-read first.
    pub reread: bool,
    /// The implicit first attempt was used up (its lease ended or was never ours).
    pub first_acquisition_spent: bool,
    /// A release was announced on the target this lease holds: confirm it with
    /// the store at once (it may have been revoked).
    pub confirm: bool,
    /// Why nobody qualifies for this election, as last listed from the API
    /// server: when, for which generation, and the answer
    /// ([`pods::nobody_elected`]).
    pub nobody: Option<(Instant, Option<i64>, plan::Desired)>,
    /// When the last pass asked to look again to renew (unset when it asked
    /// for anything else).
    pub renewal_at: Option<Instant>,
    /// Something outside the object woke it (a pod change, a release notice,
    /// another lease's wake-up): its next reconcile takes a slot at once.
    pub woken: bool,
}

/// Why a reconcile failed; each is retried with per-object backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API failed.
    #[error("kubernetes api: {0}")]
    Kube(kube::Error),
    /// This replica may not write.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
    /// The resource has no namespace (cannot happen for a namespaced kind).
    #[error("resource has no namespace")]
    NoNamespace,
}

impl Error {
    /// A bounded name for metrics and Event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(e) if is_conflict(e) => "conflict",
            Error::Kube(e) if timed_out(e) => "api_timeout",
            Error::Kube(_) => "kubernetes",
            Error::NotLeader(_) => "not_leader",
            Error::NoNamespace => "no_namespace",
        }
    }
}

impl From<kube::Error> for Error {
    /// A write the client's write gate refused is this replica not leading
    /// (the gate is the one place Kubernetes writes are checked).
    fn from(e: kube::Error) -> Self {
        if caused_by::<NotLeader>(&e) {
            Error::NotLeader(NotLeader)
        } else {
            Error::Kube(e)
        }
    }
}

/// `T` is somewhere in the chain of `e`.
fn caused_by<T: std::error::Error + 'static>(e: &kube::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.is::<T>() {
            return true;
        }
        cause = c.source();
    }
    false
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// The API server did not answer in time ([`ApiTimedOut`], anywhere in the chain).
fn timed_out(e: &kube::Error) -> bool {
    caused_by::<ApiTimedOut>(e)
}

/// A TargetLease's key in the operator's own maps (what it remembers, what
/// it keeps renewing): its namespace and name. `ObjectRef::from_obj` also
/// carries the object's resourceVersion and UID, which lookups ignore but
/// every map entry would keep, two more strings per TargetLease per map.
pub fn key_of(tl: &TargetLease) -> ObjectRef<TargetLease> {
    let mut key = ObjectRef::new(&kube::ResourceExt::name_any(tl));
    key.namespace = kube::ResourceExt::namespace(tl);
    key
}

impl Context {
    fn remember<T>(&self, key: &ObjectRef<TargetLease>, f: impl FnOnce(&mut Carryover) -> T) -> T {
        let mut all = self.carryover.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = all.get_mut(&name::NsName::of(key)) {
            return f(m);
        }
        f(all.entry(name::NsName::shared_of(key)).or_default())
    }

    fn recall(&self, key: &ObjectRef<TargetLease>) -> Carryover {
        let all = self.carryover.lock().unwrap_or_else(|p| p.into_inner());
        all.get(&name::NsName::of(key))
            .map(|m| Carryover::clone(m))
            .unwrap_or_default()
    }

    /// Something outside `key`'s object woke it (see [`Carryover::woken`]).
    pub fn woken(&self, key: &ObjectRef<TargetLease>) {
        self.remember(key, |m| m.woken = true);
    }

    fn forget(&self, key: &ObjectRef<TargetLease>) {
        let mut all = self.carryover.lock().unwrap_or_else(|p| p.into_inner());
        all.remove(&name::NsName::of(key));
        self.echoes.forget(key);
        self.renewals.forget(key);
    }

    /// The store's clock now, never behind it ([`clock`]; the local wall
    /// clock only before the store ever answered).
    fn server_now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// A release was announced on `target` (pub/sub): the TargetLeases to wake.
    /// While one of them holds the target, only the holders are woken (and
    /// told to confirm their lease first): a holder whose lease was revoked
    /// unpublishes before it wakes the waiters, so two never show Held at once.
    pub fn released(&self, target: &crate::store::Target) -> Vec<ObjectRef<TargetLease>> {
        let on_target = self
            .lease_index
            .on_target(&self.leases, &target.namespace, &target.name);
        let holders: Vec<_> = on_target
            .iter()
            .filter(|tl| tl.status.as_ref().is_some_and(plan::holds_lease))
            .map(|tl| ObjectRef::from_obj(&**tl))
            .collect();
        if holders.is_empty() {
            return on_target
                .iter()
                .map(|tl| ObjectRef::from_obj(&**tl))
                .collect();
        }
        for key in &holders {
            self.remember(key, |m| m.confirm = true);
        }
        holders
    }

    /// Forgets what this process remembers of TargetLeases `exists` says are
    /// gone (they vanished without a last reconcile: a finalizer removed by hand).
    pub fn forget_vanished(&self, exists: impl Fn(&name::NsName) -> bool) {
        let mut all = self.carryover.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|k, _| exists(k));
        self.renewals.retain(&exists);
        self.echoes.retain(exists);
    }
}

/// Entry point for the controller: takes a slot, or leaves the key in its
/// namespace's line to be reconciled in its turn ([`slots`]), then
/// reconciles the newest cached version of the object.
pub async fn reconcile(tl: Arc<TargetLease>, ctx: Arc<Context>) -> Result<Action, Error> {
    use kube::ResourceExt;
    // Whatever triggered it, this reconcile takes back the renewal asked
    // for: its pass asks again when it ends, and each way out before a pass
    // (caches not synced, the key left in its line, an error) brings the
    // key back ([`renewals`]).
    let key = key_of(&tl);
    ctx.renewals.forget(&key);
    // Never plan from caches that have not synced: wait for them, before a
    // slot is taken (nothing can use one until then), and not past a second,
    // so a term that ends before they sync is not held up by the reconciles
    // waiting (its controller shuts down only once they return).
    if !ctx.ready.is_ready()
        && tokio::time::timeout(READY_WAIT, ctx.ready.wait())
            .await
            .is_err()
    {
        return Ok(Action::requeue(Duration::ZERO));
    }
    let queued = Instant::now();
    // What is remembered is read here, once.
    let scheduled = {
        let m = ctx.remember(&key, |m| {
            let recalled = m.clone();
            m.woken = false;
            recalled
        });
        scheduled_renewal(&tl, &m, ctx.server_now_ms())
    };
    let deadline = plan::timing::slot_deadline(queued, scheduled);
    let namespace = tl.namespace().unwrap_or_default();
    let Some((_slot, since)) = ctx.slots.take_or_queue(&key, &namespace, deadline) else {
        // Every slot is taken: the key waits in its namespace's line, and
        // is reconciled again when its turn comes (`FairSlots`), with a
        // slot set aside for it. Nothing waits here meanwhile.
        return Ok(Action::await_change());
    };
    ctx.metrics.queued(since.elapsed());
    // It may have changed while it waited.
    let tl = ctx.leases.get(&ObjectRef::from_obj(&*tl)).unwrap_or(tl);
    let started = Instant::now();
    // Boxed: the pass's state machine is large (every write it may make,
    // about 10 KB), and only the reconciles holding a slot need it.
    let result = Box::pin(reconcile_inner(&tl, &ctx)).await;
    ctx.metrics.reconciled(
        started.elapsed(),
        result.as_ref().err().map(Error::category),
    );
    result
}

/// The pass `tl` is due for would only renew its published lease, on the
/// schedule the last pass set: nothing changed since (the cached object is
/// the version that pass planned from, its spec observed), nothing failed,
/// no release was announced on its target, nothing outside it woke it
/// (`m` is what this process remembers of it).
fn scheduled_renewal(
    tl: &TargetLease,
    m: &Carryover,
    server_now_ms: u64,
) -> Option<plan::timing::Scheduled> {
    use kube::ResourceExt;
    let status = tl.status.as_ref()?;
    let unchanged = m.known_version.is_some()
        && m.known_version == tl.resource_version()
        && status.observed_generation == tl.metadata.generation;
    let quiet = m.failures == 0 && !m.confirm && !m.reread && !m.woken;
    if !unchanged || !plan::is_published_held(status) || !quiet {
        return None;
    }
    let timing = spec::validate(tl).ok()?.timing;
    // The published expiry as a local instant (it is capped at the hard end).
    let expires_ms = u64::try_from(status.expires_at.as_ref()?.0.as_millisecond()).ok()?;
    let left = Duration::from_millis(expires_ms.saturating_sub(server_now_ms));
    Some(plan::timing::Scheduled {
        due: m.renewal_at?,
        renew: timing.renew,
        ttl: timing.ttl,
        expires: Instant::now() + left,
    })
}

async fn reconcile_inner(tl: &TargetLease, ctx: &Context) -> Result<Action, Error> {
    ctx.leadership.check()?;
    // (client required) the object as of the operator's own last write.
    let Some(mut pass) = pass::Pass::start(ctx, tl).await? else {
        ctx.forget(&key_of(tl));
        return Ok(Action::await_change());
    };
    if pass.deleting() {
        return pass.cleanup().await;
    }
    pass.ensure_finalizer().await?;
    pass.converge().await
}

/// Backoff for failed reconciles: one per-object policy for API and store errors.
pub fn error_policy(tl: Arc<TargetLease>, err: &Error, ctx: Arc<Context>) -> Action {
    let key = key_of(&tl);
    if let Error::Kube(e) = err {
        // The cache may not show what the server has: read the object first.
        ctx.remember(&key, |m| m.reread = true);
        if is_conflict(e) {
            // Someone else wrote first: plan again at once from a fresh read.
            return Action::requeue(Duration::from_millis(50));
        }
    }
    if matches!(err, Error::NotLeader(_)) {
        return Action::requeue(Duration::from_secs(1));
    }
    let failures = ctx.remember(&key, |m| {
        m.failures = m.failures.saturating_add(1);
        m.failures
    });
    tracing::warn!(
        lease = %key,
        error = %err,
        category = err.category(),
        "reconcile failed"
    );
    let wait = with_jitter(plan::backoff(failures.saturating_sub(1)));
    // A published lease must get its next chance to publish before its
    // published expiry passes (the keeper renews it in Valkey meanwhile).
    let published = tl
        .status
        .as_ref()
        .filter(|s| plan::is_published_held(s))
        .and_then(|s| s.expires_at.as_ref())
        .map(|t| t.0.as_millisecond());
    let renew = spec::validate(&tl).map_or(Duration::from_secs(30), |v| v.timing.renew);
    let cap = published
        .map(|ms| plan::retry_cap(ms, ctx.server_now_ms(), plan::expiry_margin(renew), renew));
    Action::requeue(cap.map_or(wait, |c| wait.min(c)))
}

#[cfg(test)]
mod tests;

/// Adds up to 20% jitter.
fn with_jitter(base: Duration) -> Duration {
    base + base.mul_f64(rand::random::<f64>() * 0.2)
}

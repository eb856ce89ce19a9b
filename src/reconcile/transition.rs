//! Pure: what each step and each store reply does to status, Events, wake-ups
//! and what comes next. No client required.
//!
//! The executor (`execute.rs`) performs a [`Transition`] in one fixed order —
//! unmark pods the new status does not name, raise the token floor, write
//! status, mark the pod it names — so every rule about what is published lives
//! here, where table tests cover each (step × reply) cell.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::plan::{self, PodRef};
use crate::conditions::{self, BACKEND_AVAILABLE, ConditionStatus, HELD, Reason, SPEC_VALID};
use crate::crd::{Phase, TargetLeaseStatus};
use crate::store::{Lease, Outcome, Reply, StoreError};

/// Lease metadata key naming the TargetLease (`<namespace>/<name>`) that acquired it.
pub const META_TARGETLEASE: &str = "targetlease";
/// Lease metadata key holding the acquisition id the lease id was derived from.
pub const META_ACQUISITION: &str = "acquisition";

/// What a pass knows besides the status it planned from.
#[derive(Clone, Debug)]
pub struct Facts {
    /// `metadata.generation` of the resource.
    pub generation: Option<i64>,
    /// Wall clock, only for condition timestamps.
    pub now: Time,
    /// The store's clock as best known (last reply plus monotonic time since).
    pub server_now_ms: u64,
    /// `<namespace>/<name>` of the resource, as written into lease metadata.
    pub me: String,
    /// The resource is being deleted.
    pub deleting: bool,
    /// The renew interval from the spec.
    pub renew_interval: Duration,
    /// How long before the published expiry a confirmation must arrive
    /// ([`plan::expiry_margin`]).
    pub expiry_margin: Duration,
}

/// An Event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Warning rather than Normal.
    pub warning: bool,
    /// The Event reason.
    pub reason: Reason,
    /// One sentence.
    pub message: String,
}

/// A lease this operator acquired for this resource under an acquisition that
/// status does not publish: releasing it cannot take anything from anyone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reclaim {
    /// The owner recorded in Valkey.
    pub owner: String,
    /// The acquisition the lease id derives from.
    pub acquisition: String,
    /// Its token.
    pub token: u64,
    /// Forget the recorded acquisition once the lease is gone.
    pub then_forget_acquisition: bool,
}

/// What happens after a transition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Plan again from the new status, in the same pass.
    PlanAgain,
    /// Release an unpublished lease of ours, then plan again.
    Reclaim(Reclaim),
    /// Look again at the next renewal.
    Renewal,
    /// Look again after this long.
    Requeue(Duration),
    /// Retry after the per-object backoff, but no later than `not_after`.
    Backoff {
        /// An instant the pass must not sleep past (the published expiry).
        not_after: Option<Duration>,
    },
    /// Nothing to do until the resource or a pod changes.
    AwaitChange,
}

/// What the operator remembers of the lease between passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// No change.
    Keep,
    /// The store confirmed the lease now (acquired or renewed).
    Confirmed {
        /// The lease's hard end, when it has one.
        max_expires_ms: Option<u64>,
    },
    /// The lease is gone.
    Forget,
}

/// The result of one step: the status to publish and what follows.
#[derive(Clone, Debug)]
pub struct Transition {
    /// The status to publish (written only when it differs from the current one).
    pub status: TargetLeaseStatus,
    /// Events to publish, in order.
    pub notes: Vec<Note>,
    /// What next.
    pub next: Next,
    /// Wake the other TargetLeases on the target (the queue may have moved).
    pub wake_waiters: bool,
    /// What to remember of the lease.
    pub memory: Memory,
    /// Whether the store answered (resets the backoff) or failed (extends it).
    pub store_answered: Option<bool>,
    /// The attempt in effect is over (recorded or implicit): the next one needs a new id.
    pub forget_acquisition: bool,
}

struct Draft<'f> {
    f: &'f Facts,
    t: Transition,
}

impl<'f> Draft<'f> {
    fn new(f: &'f Facts, status: &TargetLeaseStatus) -> Self {
        Self {
            f,
            t: Transition {
                status: status.clone(),
                notes: Vec::new(),
                next: Next::PlanAgain,
                wake_waiters: false,
                memory: Memory::Keep,
                store_answered: None,
                forget_acquisition: false,
            },
        }
    }

    fn condition(&mut self, type_: &str, status: ConditionStatus, reason: Reason, message: &str) {
        let generation = self.t.status.observed_generation.or(self.f.generation);
        conditions::upsert(
            &mut self.t.status.conditions,
            type_,
            status,
            reason,
            message,
            generation,
            &self.f.now,
        );
    }

    fn note(&mut self, warning: bool, reason: Reason, message: String) {
        self.t.notes.push(Note {
            warning,
            reason,
            message,
        });
    }

    /// The spec as of this pass is what status now describes.
    fn applied(&mut self) {
        self.t.status.observed_generation = self.f.generation;
    }

    fn store_ok(&mut self) {
        self.t.store_answered = Some(true);
        self.condition(
            BACKEND_AVAILABLE,
            ConditionStatus::True,
            Reason::Reachable,
            "the lease store answered",
        );
    }

    fn store_failed(&mut self, err: &StoreError) {
        self.t.store_answered = Some(false);
        let was_down = conditions::is(
            &self.t.status.conditions,
            BACKEND_AVAILABLE,
            ConditionStatus::False,
        );
        self.condition(
            BACKEND_AVAILABLE,
            ConditionStatus::False,
            Reason::BackendUnavailable,
            err.category(),
        );
        if !was_down {
            self.note(
                true,
                Reason::BackendUnavailable,
                format!("lease store unavailable: {err}"),
            );
        }
    }

    fn held(&mut self, lease: &Lease, pod: Option<&PodRef>) {
        let s = &mut self.t.status;
        s.phase = Some(Phase::Held);
        s.holder = Some(lease.owner.clone());
        s.holder_pod = pod.map(|p| p.name.clone());
        s.holder_pod_uid = pod.map(|p| p.uid.clone());
        s.fencing_token = Some(lease.fencing_token);
        s.acquired_at = time_ms(lease.acquired_at_ms);
        s.expires_at = time_ms(lease.expires_at_ms);
        let message = format!(
            "held by {} with fencing token {}",
            lease.owner, lease.fencing_token
        );
        self.condition(HELD, ConditionStatus::True, Reason::Acquired, &message);
    }

    /// Not held; the last token stays visible. Pending also forgets the holder.
    fn not_held(&mut self, phase: Phase, reason: Reason, message: &str) {
        let s = &mut self.t.status;
        s.phase = Some(phase);
        s.expires_at = None;
        if phase == Phase::Pending {
            s.holder = None;
            s.holder_pod = None;
            s.holder_pod_uid = None;
            s.acquired_at = None;
        }
        self.condition(HELD, ConditionStatus::False, reason, message);
    }

    /// Held is withdrawn: the store has not confirmed the lease and its
    /// published expiry is about to pass (or has).
    fn unconfirmed(&mut self) {
        self.t.status.phase = Some(Phase::Unknown);
        self.condition(
            HELD,
            ConditionStatus::Unknown,
            Reason::Unconfirmed,
            "the lease could not be renewed before its published expiry",
        );
        self.t.wake_waiters = true;
    }

    fn corrupt(mut self, message: &str) -> Transition {
        self.t.status.phase = Some(Phase::Error);
        self.t.status.expires_at = None;
        self.condition(
            HELD,
            ConditionStatus::Unknown,
            Reason::CorruptState,
            message,
        );
        self.note(
            true,
            Reason::CorruptState,
            format!("lease store state is corrupt ({message}); revoke the target to repair"),
        );
        self.t.wake_waiters = true;
        self.done(Next::Requeue(Duration::from_secs(60)))
    }

    fn done(mut self, next: Next) -> Transition {
        self.t.next = next;
        self.t
    }
}

/// Records whether the spec can be acted on (every pass, before planning).
pub fn spec_checked(
    f: &Facts,
    status: &TargetLeaseStatus,
    check: &Result<(), String>,
) -> TargetLeaseStatus {
    // Judged on the spec of this generation, whatever status has applied so far.
    let mut status = status.clone();
    let (state, reason, message) = match check {
        Ok(()) => (ConditionStatus::True, Reason::Valid, "spec is valid"),
        Err(message) => (
            ConditionStatus::False,
            Reason::InvalidSpec,
            message.as_str(),
        ),
    };
    conditions::upsert(
        &mut status.conditions,
        SPEC_VALID,
        state,
        reason,
        message,
        f.generation,
        &f.now,
    );
    status
}

/// [`plan::Step::RecordAcquisition`]: record a fresh acquisition id before acquiring.
pub fn record_acquisition(f: &Facts, status: &TargetLeaseStatus, id: String) -> Transition {
    let mut d = Draft::new(f, status);
    d.t.status.acquisition_id = Some(id);
    let phase = if status.phase == Some(Phase::Lost) {
        Phase::Lost
    } else {
        Phase::Pending
    };
    d.not_held(phase, Reason::Acquiring, "acquiring the lease");
    d.applied();
    d.done(Next::PlanAgain)
}

/// The acquisition an unpublished lease of this resource was made under, if it is one.
pub fn own_acquisition(lease: &Lease, me: &str) -> Option<String> {
    let meta = lease.metadata.as_ref()?;
    (meta.get(META_TARGETLEASE)?.as_str()? == me)
        .then(|| meta.get(META_ACQUISITION)?.as_str().map(str::to_owned))
        .flatten()
}

/// After [`plan::Step::Acquire`] under acquisition `attempt`.
pub fn after_acquire(
    f: &Facts,
    status: &TargetLeaseStatus,
    acquisition: &str,
    pod: Option<&PodRef>,
    reply: Result<Reply, StoreError>,
) -> Transition {
    let mut d = Draft::new(f, status);
    let reply = match reply {
        Ok(r) => r,
        Err(e) => return store_error(d, &e),
    };
    d.store_ok();
    match (reply.outcome, reply.lease) {
        (Outcome::Acquired, Some(lease)) => {
            d.t.status.acquisition_id = Some(acquisition.to_owned());
            d.held(&lease, pod);
            d.applied();
            d.note(
                false,
                Reason::Acquired,
                format!(
                    "acquired by {} with fencing token {}",
                    lease.owner, lease.fencing_token
                ),
            );
            d.t.memory = Memory::Confirmed {
                max_expires_ms: lease.max_expires_at_ms,
            };
            d.done(Next::Renewal)
        }
        (Outcome::Held, Some(lease)) if own_acquisition(&lease, &f.me).is_some() => {
            let acquisition = own_acquisition(&lease, &f.me).unwrap_or_default();
            d.done(Next::Reclaim(Reclaim {
                owner: lease.owner,
                acquisition,
                token: lease.fencing_token,
                then_forget_acquisition: false,
            }))
        }
        (Outcome::Held, lease) => {
            let holder = lease.as_ref().map_or("someone else", |l| l.owner.as_str());
            let message = format!("target is held by {holder}");
            d.not_held(Phase::Pending, Reason::TargetHeld, &message);
            d.applied();
            let expires = lease.map_or(reply.server_time_ms, |l| l.expires_at_ms);
            d.done(Next::Requeue(plan::retry_after_held(
                expires,
                reply.server_time_ms,
            )))
        }
        (Outcome::Expired | Outcome::IdempotencyConflict, _) => {
            // That attempt's lease is over (or the spec changed under it): a new
            // attempt follows; a live lease of the old one is reclaimed by it.
            d.t.status.acquisition_id = None;
            d.t.forget_acquisition = true;
            d.done(Next::PlanAgain)
        }
        (Outcome::CorruptState, _) => d.corrupt(&reply.message),
        (other, _) => unexpected(d, "acquire", other),
    }
}

/// After releasing an unpublished lease of ours ([`Next::Reclaim`]).
pub fn after_reclaim(
    f: &Facts,
    status: &TargetLeaseStatus,
    reclaim: &Reclaim,
    reply: Result<Reply, StoreError>,
) -> Transition {
    let mut d = Draft::new(f, status);
    let reply = match reply {
        Ok(r) => r,
        Err(e) => return store_error(d, &e),
    };
    d.store_ok();
    match reply.outcome {
        Outcome::Released | Outcome::NotOwner | Outcome::Expired | Outcome::NotFound => {
            if reply.outcome == Outcome::Released {
                d.t.wake_waiters = true;
            }
            if reclaim.then_forget_acquisition {
                d.t.status.acquisition_id = None;
                d.t.forget_acquisition = true;
            } else if reply.outcome != Outcome::Released {
                // Not ours after all (e.g. the lease id key changed): wait for it.
                d.not_held(
                    Phase::Pending,
                    Reason::TargetHeld,
                    "target is held by an earlier acquisition this operator cannot release",
                );
                return d.done(Next::Requeue(Duration::from_secs(5)));
            }
            d.done(Next::PlanAgain)
        }
        Outcome::CorruptState => d.corrupt(&reply.message),
        other => unexpected(d, "release", other),
    }
}

/// After [`plan::Step::Abandon`] read the target: a live lease of this
/// resource is unpublished (status does not hold it), whichever attempt made
/// it: reclaim it; then forget the attempt.
pub fn after_abandon_read(
    f: &Facts,
    status: &TargetLeaseStatus,
    reply: Result<Reply, StoreError>,
) -> Transition {
    let mut d = Draft::new(f, status);
    let reply = match reply {
        Ok(r) => r,
        Err(e) => return store_error(d, &e),
    };
    d.store_ok();
    match (reply.outcome, reply.lease) {
        (Outcome::Found, Some(lease)) if own_acquisition(&lease, &f.me).is_some() => {
            let acquisition = own_acquisition(&lease, &f.me).unwrap_or_default();
            d.done(Next::Reclaim(Reclaim {
                owner: lease.owner,
                acquisition,
                token: lease.fencing_token,
                then_forget_acquisition: true,
            }))
        }
        // Nothing of that attempt is live (a corrupt record is reported by the next acquire).
        (Outcome::Found | Outcome::NotFound | Outcome::CorruptState, _) => {
            d.t.status.acquisition_id = None;
            d.t.forget_acquisition = true;
            d.done(Next::PlanAgain)
        }
        (other, _) => unexpected(d, "get", other),
    }
}

/// After [`plan::Step::Renew`].
pub fn after_renew(
    f: &Facts,
    status: &TargetLeaseStatus,
    reply: Result<Reply, StoreError>,
) -> Transition {
    let mut d = Draft::new(f, status);
    let reply = match reply {
        Ok(r) => r,
        Err(e) => {
            d.store_failed(&e);
            let left = left_before_expiry(f, status);
            if left.is_none() {
                d.unconfirmed();
                return d.done(Next::Backoff { not_after: None });
            }
            return d.done(Next::Backoff { not_after: left });
        }
    };
    d.store_ok();
    match (reply.outcome, reply.lease) {
        (Outcome::Renewed, Some(lease)) => {
            let published = status.expires_at.as_ref().map(|t| t.0.as_millisecond());
            let was_unknown = status.phase == Some(Phase::Unknown);
            if was_unknown
                || plan::expiry_to_publish(
                    published,
                    lease.expires_at_ms,
                    reply.server_time_ms,
                    f.renew_interval,
                    f.expiry_margin,
                )
            {
                d.t.status.expires_at = time_ms(lease.expires_at_ms);
            }
            d.t.status.phase = Some(Phase::Held);
            let message = format!(
                "held by {} with fencing token {}",
                lease.owner, lease.fencing_token
            );
            d.applied();
            d.condition(HELD, ConditionStatus::True, Reason::Acquired, &message);
            d.t.memory = Memory::Confirmed {
                max_expires_ms: lease.max_expires_at_ms,
            };
            d.done(Next::Renewal)
        }
        (Outcome::CorruptState, _) => d.corrupt(&reply.message),
        (outcome, _) => {
            // expired / not_owner: Valkey no longer has this lease.
            d.t.status.acquisition_id = None;
            let message = format!(
                "the lease ended in the store ({outcome}): {}",
                reply.message
            );
            d.not_held(Phase::Lost, Reason::LeaseLost, &message);
            d.note(true, Reason::LeaseLost, message);
            d.t.memory = Memory::Forget;
            d.t.wake_waiters = true;
            d.done(Next::PlanAgain)
        }
    }
}

/// How long the published expiry leaves for a confirmation (its margin
/// deducted); `None` when it has (about to have) passed.
pub fn left_before_expiry(f: &Facts, status: &TargetLeaseStatus) -> Option<Duration> {
    let published = status.expires_at.as_ref()?.0.as_millisecond();
    let left = published - f.server_now_ms as i64 - f.expiry_margin.as_millis() as i64;
    (left > 0).then(|| Duration::from_millis(left as u64))
}

/// Before a renewal with `ttl`: nothing published may be later than what the
/// renewal can set (a shorter `leaseDuration`: lower `expiresAt` and the pod
/// annotation first, so a lost reply cannot leave them later than Valkey's),
/// and `Held` is withdrawn if the published expiry is about to pass. `None`
/// when nothing changes.
pub fn before_renew(f: &Facts, status: &TargetLeaseStatus, ttl: Duration) -> Option<Transition> {
    if status.phase != Some(Phase::Held) {
        return None;
    }
    let mut d = Draft::new(f, status);
    let floor = f.server_now_ms + ttl.as_millis() as u64;
    let published = status.expires_at.as_ref().map(|t| t.0.as_millisecond());
    if published.is_some_and(|p| p > floor as i64) {
        d.t.status.expires_at = time_ms(floor);
    }
    if left_before_expiry(f, &d.t.status).is_none() {
        d.unconfirmed();
    }
    (d.t.status != *status).then(|| d.done(Next::PlanAgain))
}

/// [`plan::Step::Release`]: stop publishing the lease (status no longer Held,
/// pod marks removed) before the store is asked to release it.
pub fn begin_release(
    f: &Facts,
    status: &TargetLeaseStatus,
    reason: Reason,
    message: &str,
) -> Transition {
    let mut d = Draft::new(f, status);
    d.t.status.releasing_acquisition_id = d.t.status.acquisition_id.take();
    let phase = if f.deleting {
        Phase::Released
    } else {
        Phase::Pending
    };
    // Keep holder and token: they name the lease being released.
    d.t.status.phase = Some(phase);
    d.t.status.expires_at = None;
    d.condition(HELD, ConditionStatus::False, reason, message);
    d.t.memory = Memory::Forget;
    d.done(Next::PlanAgain)
}

/// After [`plan::Step::FinishRelease`].
pub fn after_release(
    f: &Facts,
    status: &TargetLeaseStatus,
    reply: Result<Reply, StoreError>,
) -> Transition {
    let mut d = Draft::new(f, status);
    let reply = match reply {
        Ok(r) => r,
        Err(e) => return store_error(d, &e),
    };
    d.store_ok();
    let why = conditions::get(&status.conditions, HELD)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    let finished = |d: &mut Draft<'_>| {
        let s = &mut d.t.status;
        s.releasing_acquisition_id = None;
        if s.phase == Some(Phase::Pending) {
            // The Held condition already says why (set when the release began).
            s.holder = None;
            s.holder_pod = None;
            s.holder_pod_uid = None;
            s.acquired_at = None;
        }
        d.t.wake_waiters = true;
    };
    match reply.outcome {
        Outcome::Released => {
            finished(&mut d);
            d.note(false, Reason::Released, format!("lease released: {why}"));
            d.done(Next::PlanAgain)
        }
        Outcome::NotOwner | Outcome::Expired | Outcome::NotFound => {
            finished(&mut d);
            d.note(
                true,
                Reason::LeaseLost,
                format!(
                    "the lease had already ended in the store ({}) when it was given back: {why}",
                    reply.outcome
                ),
            );
            d.done(Next::PlanAgain)
        }
        Outcome::CorruptState => d.corrupt(&reply.message),
        other => unexpected(d, "release", other),
    }
}

/// [`plan::Step::Wait`]: Pending (Error for an invalid spec) until something changes.
pub fn wait(f: &Facts, status: &TargetLeaseStatus, reason: Reason, message: &str) -> Transition {
    let mut d = Draft::new(f, status);
    let phase = if reason == Reason::InvalidSpec {
        Phase::Error
    } else {
        Phase::Pending
    };
    d.not_held(phase, reason, message);
    d.applied();
    let next = plan::recheck_after(reason).map_or(Next::AwaitChange, Next::Requeue);
    d.done(next)
}

/// [`plan::Step::Idle`]: nothing due; a status that names its pod without a
/// UID records the UID.
pub fn idle(f: &Facts, status: &TargetLeaseStatus, pod: Option<&PodRef>) -> Transition {
    let mut d = Draft::new(f, status);
    if let Some(p) = pod
        && status.holder_pod_uid.is_none()
        && status.holder_pod.as_deref() == Some(p.name.as_str())
    {
        d.t.status.holder_pod_uid = Some(p.uid.clone());
    }
    d.done(Next::Renewal)
}

fn store_error(mut d: Draft<'_>, err: &StoreError) -> Transition {
    if let StoreError::Invalid(message) = err {
        // Only a spec the store refuses gets here (the operator validated it first).
        d.t.status.phase = Some(Phase::Error);
        d.condition(
            SPEC_VALID,
            ConditionStatus::False,
            Reason::InvalidSpec,
            message,
        );
        return d.done(Next::AwaitChange);
    }
    d.store_failed(err);
    d.done(Next::Backoff { not_after: None })
}

fn unexpected(mut d: Draft<'_>, op: &str, outcome: Outcome) -> Transition {
    d.note(
        true,
        Reason::BackendUnavailable,
        format!("unexpected {op} outcome {outcome}"),
    );
    d.t.store_answered = Some(false);
    d.done(Next::Backoff { not_after: None })
}

/// A Unix-milliseconds instant as a Kubernetes time, rounded down to the
/// second (what the API server stores), so status and pod annotations carry
/// the same lower bound.
pub fn time_ms(ms: u64) -> Option<Time> {
    i64::try_from(ms / 1000)
        .ok()
        .and_then(|s| Timestamp::from_second(s).ok())
        .map(Time)
}

#[cfg(test)]
#[path = "transition_tests.rs"]
mod tests;

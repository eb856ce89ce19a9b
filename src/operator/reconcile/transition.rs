//! Pure: what each step and each store reply does to status, Events, wake-ups
//! and what comes next. No client required.
//!
//! The executor (`executor.rs`) performs a [`Transition`] in its one fixed
//! order, so every rule about what is published lives here, where table
//! tests cover each (step × reply) cell.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::plan::PodRef;
use crate::operator::conditions::{
    self, BACKEND_AVAILABLE, ConditionStatus, HELD, Reason, SPEC_VALID,
};
use crate::operator::crd::{Phase, TargetLeaseStatus};
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
    /// The last confirmation of the lease status names that this process got
    /// (from its reconcile or the keeper), when it has one.
    pub confirmed: Option<Confirmed>,
}

/// A confirmation of a lease by the store, in the store's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Confirmed {
    /// When its request was sent (the store's clock, estimated).
    pub sent_ms: u64,
    /// The lease's expiry in the store, as confirmed.
    pub expires_ms: u64,
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

/// What this step learned of the lease from the store, for what the process
/// keeps of it between passes (the keeper's record): no change, confirmed
/// until an expiry, or gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    /// No change.
    Keep,
    /// The store confirmed the lease now (acquired or renewed).
    Confirmed {
        /// The lease's expiry in the store.
        expires_ms: u64,
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
    /// What the store confirmed of the lease.
    pub learned: Learned,
    /// Whether the store answered (resets the backoff) or failed (extends it).
    pub store_answered: Option<bool>,
    /// The attempt in effect is over (recorded or implicit): the next one needs a new id.
    pub forget_acquisition: bool,
}

pub(super) struct Draft<'f> {
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
                learned: Learned::Keep,
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

    /// A Warning Event when the lease stops being held (or waits) for a
    /// reason only the user can fix, once: when the Held condition takes
    /// that reason, not on every pass that keeps it.
    fn warn_on_entering(&mut self, reason: Reason, message: &str) {
        let already = conditions::get(&self.t.status.conditions, HELD)
            .is_some_and(|c| c.reason == reason.as_str());
        if reason == Reason::PodNotOptedIn && !already {
            self.note(true, reason, message.to_owned());
        }
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

mod acquire;
mod floor;
mod hold;

pub use acquire::*;
pub use floor::*;
pub use hold::*;

/// Runs `then` on a draft for a store reply that arrived (the store answered);
/// a store failure is a transition of its own ([`store_error`]).
pub(super) fn answered<'f>(
    f: &'f Facts,
    status: &TargetLeaseStatus,
    reply: Result<Reply, StoreError>,
    then: impl FnOnce(Draft<'f>, Reply) -> Transition,
) -> Transition {
    let mut d = Draft::new(f, status);
    match reply {
        Ok(r) => {
            d.store_ok();
            then(d, r)
        }
        Err(e) => store_error(d, &e),
    }
}

pub(super) fn store_error(mut d: Draft<'_>, err: &StoreError) -> Transition {
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

pub(super) fn unexpected(mut d: Draft<'_>, op: &str, outcome: Outcome) -> Transition {
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

/// The Event's action. The recorder ([`crate::operator::events`]) folds
/// Events of one object that share type, reason and action into one series
/// and keeps the first note, so two
/// grants (two holders, two tokens) would read `Acquired (x2)` with the
/// first token. The action carries a digest of the note: only Events that
/// say exactly the same thing fold.
pub fn event_action(note: &Note) -> String {
    let digest = sha1_smol::Sha1::from(note.message.as_bytes())
        .digest()
        .bytes();
    format!(
        "Reconcile-{:02x}{:02x}{:02x}{:02x}",
        digest[0], digest[1], digest[2], digest[3]
    )
}

#[cfg(test)]
mod tests;

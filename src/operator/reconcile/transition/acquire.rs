//! Transitions of acquiring: recording an acquisition, the acquire reply,
//! and reclaiming unpublished leases of this resource.

use std::time::Duration;

use super::{
    Draft, Facts, Learned, META_ACQUISITION, META_TARGETLEASE, Next, Note, Reclaim, Transition,
    answered, unexpected,
};
use crate::operator::conditions::{self, ConditionStatus, Reason, SPEC_VALID};
use crate::operator::crd::{Phase, TargetLeaseStatus};
use crate::operator::reconcile::plan::{self, PodRef};
use crate::store::{Lease, Outcome, Reply, StoreError};

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
    answered(f, status, reply, |mut d, reply| {
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
                d.t.learned = Learned::Confirmed {
                    expires_ms: lease.expires_at_ms,
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
                let owner = lease.as_ref().map_or("someone else", |l| l.owner.as_str());
                let message = format!("target is held by {owner}");
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
    })
}

/// After releasing an unpublished lease of ours ([`Next::Reclaim`]).
pub fn after_reclaim(
    f: &Facts,
    status: &TargetLeaseStatus,
    reclaim: &Reclaim,
    reply: Result<Reply, StoreError>,
) -> Transition {
    answered(f, status, reply, |mut d, reply| {
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
    })
}

/// After [`plan::Step::Abandon`] read the target: a live lease of this
/// resource is unpublished (status does not hold it), whichever attempt made
/// it: reclaim it; then forget the attempt.
pub fn after_abandon_read(
    f: &Facts,
    status: &TargetLeaseStatus,
    reply: Result<Reply, StoreError>,
) -> Transition {
    answered(f, status, reply, |mut d, reply| {
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
    })
}

/// The holder pod `t` grants the lease to, when it is an acquisition (its
/// Acquired Event): the moment an overlap of elections is worth a warning.
pub fn granted_pod(t: &Transition) -> Option<&str> {
    t.notes
        .iter()
        .any(|n| n.reason == Reason::Acquired)
        .then_some(t.status.holder_pod.as_deref())
        .flatten()
}

/// An election won `pod`, which the elections `others` also select: a
/// Warning (`None` when no other election selects it).
pub fn overlap_warning(pod: &str, others: &[String]) -> Option<Note> {
    (!others.is_empty()).then(|| Note {
        warning: true,
        reason: Reason::OverlappingCandidates,
        message: format!(
            "pod {pod} is also a candidate of {}: give each election its own selector; \
             each marks its leader with its own label <name>.targetlease.dev/leader",
            others.join(", ")
        ),
    })
}

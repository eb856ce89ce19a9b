//! Pure decisions: (status, what was observed) -> the next step. No client required.
//!
//! Everything here is a plain function of its inputs so that every branch can
//! be unit-tested without a cluster or a Valkey.

use std::time::Duration;

use crate::operator::conditions::Reason;
use crate::operator::crd::{Phase, TargetLeaseStatus};

/// A pod, by name and UID (a pod recreated under the same name is another pod).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
}

/// Who should hold the lease right now, as derived from the spec and the pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Desired {
    /// This owner should hold it, tied to this pod when there is one.
    Holder {
        /// The owner recorded in Valkey (the elected pod's name in an election).
        owner: String,
        /// The pod the lease is tied to.
        pod: Option<PodRef>,
    },
    /// Nobody qualifies (or the spec is invalid).
    Nobody {
        /// Why not.
        reason: Reason,
        /// One sentence for the condition.
        message: String,
    },
}

/// What the reconciler knows when it plans.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    /// Current status (default when the resource is new), never older than
    /// the operator's own last write.
    pub status: &'a TargetLeaseStatus,
    /// `metadata.generation` of the resource.
    pub generation: Option<i64>,
    /// Who should hold the lease.
    pub desired: Desired,
    /// Name of an older TargetLease on the same target that is served first.
    pub queued_behind: Option<String>,
    /// Another TargetLease on the same target whose status still publishes
    /// Held, unexpired by the store's clock (one being deleted, or one whose
    /// lease the store lost): its holder may act until Held is withdrawn or
    /// expires, so nobody else is granted the target meanwhile, whatever the
    /// store would answer.
    pub held_elsewhere: Option<HeldElsewhere>,
    /// A renewal is due (none confirmed the lease in this process within the renew interval).
    pub renew_due: bool,
    /// The lease is close enough to its `maxLifetime` that it must be replaced.
    pub rotation_due: bool,
    /// An acquisition attempt is in effect: recorded in status, or the implicit
    /// first attempt of a resource that never published a token (its id
    /// derives from the resource's UID, so it needs no write before the acquire).
    pub acquisition: bool,
}

/// A sibling still published as Held ([`Observed::held_elsewhere`]).
#[derive(Clone, Debug)]
pub struct HeldElsewhere {
    /// Its name.
    pub name: String,
    /// When to look again: just after its published expiry.
    pub recheck: Duration,
}

/// The next thing to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A lease being given back (`releasingAcquisitionId`): release it in the store.
    FinishRelease {
        /// The lease to release.
        lease: Recorded,
    },
    /// A release is recorded (`releasingAcquisitionId`) but not the lease it
    /// gives back (no holder or token in status): nothing can be asked of the
    /// store; the release ends.
    ForgetRelease,
    /// A recorded acquisition is no longer wanted: if it reached Valkey (a
    /// crash or a failed status write after the acquire), release it; then forget it.
    Abandon,
    /// Record a fresh acquisition id in status before calling the store, so a crash
    /// after the store call is resolved by replaying the same id.
    RecordAcquisition,
    /// Acquire for `owner` with the recorded acquisition id.
    Acquire {
        /// The owner to acquire for.
        owner: String,
    },
    /// Renew the held lease.
    Renew {
        /// The lease status records.
        lease: Recorded,
    },
    /// Nothing is due until the next renewal.
    Idle,
    /// Stop holding: unpublish, then release in the store (see [`Step::FinishRelease`]).
    Release {
        /// Why.
        reason: Reason,
        /// One sentence for the condition and Event.
        message: String,
    },
    /// Stay Pending (or Error, for an invalid spec) until something changes.
    Wait {
        /// Why.
        reason: Reason,
        /// One sentence for the condition.
        message: String,
        /// Look again after this at the latest, sooner than the reason's own
        /// recheck (a sibling's Held that nobody withdraws ends at its expiry).
        recheck: Option<Duration>,
    },
    /// Nothing is left in the store for this resource: its finalizer may go.
    Finalize,
}

/// A lease as status records it: a lease handle but for the lease id, which
/// derives from the acquisition id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The owner (`status.holder`).
    pub owner: String,
    /// The acquisition id its lease id derives from.
    pub acquisition: String,
    /// Its fencing token.
    pub token: u64,
}

/// The lease status records as held (`acquisitionId`), or as being given
/// back (`releasingAcquisitionId`) when `releasing`.
pub fn recorded(status: &TargetLeaseStatus, releasing: bool) -> Option<Recorded> {
    let acquisition = if releasing {
        &status.releasing_acquisition_id
    } else {
        &status.acquisition_id
    };
    Some(Recorded {
        owner: status.holder.clone()?,
        acquisition: acquisition.clone()?,
        token: status.fencing_token?,
    })
}

/// The lease of this resource that may be live in the store (published as
/// Held, or Held until the store stopped answering).
fn held_lease(status: &TargetLeaseStatus) -> Option<Recorded> {
    matches!(status.phase, Some(Phase::Held | Phase::Unknown))
        .then(|| recorded(status, false))
        .flatten()
}

/// True when status records a lease of this resource that may be live in the
/// store (published as Held, or Held until the store stopped answering).
pub fn holds_lease(status: &TargetLeaseStatus) -> bool {
    held_lease(status).is_some()
}

/// The step that ends a release status records.
fn finish_release(status: &TargetLeaseStatus) -> Step {
    match recorded(status, true) {
        Some(lease) => Step::FinishRelease { lease },
        None => Step::ForgetRelease,
    }
}

/// True when status publishes the lease as held.
pub fn is_published_held(status: &TargetLeaseStatus) -> bool {
    status.phase == Some(Phase::Held) && holds_lease(status)
}

/// Whether the lease recorded in status is tied to the pod the spec calls for
/// (a token published for one actor must never pass to another): the same
/// pod by name and UID, or no pod on both sides.
fn same_pod(st: &TargetLeaseStatus, pod: Option<&PodRef>) -> Result<(), String> {
    match (pod, st.holder_pod.as_deref()) {
        (None, None) => Ok(()),
        (None, Some(was)) => Err(format!("the lease is no longer tied to pod {was}")),
        (Some(p), None) => Err(format!("the lease is now tied to pod {}", p.name)),
        (Some(p), Some(was)) if was != p.name => {
            Err(format!("the lease moves from pod {was} to pod {}", p.name))
        }
        (Some(p), Some(_)) if st.holder_pod_uid.as_deref() != Some(p.uid.as_str()) => {
            Err(format!("pod {} was recreated", p.name))
        }
        (Some(_), Some(_)) => Ok(()),
    }
}

/// Decides the next step of a live resource.
pub fn plan(o: &Observed<'_>) -> Step {
    let st = o.status;
    if st.releasing_acquisition_id.is_some() {
        return finish_release(st);
    }
    if let Some(lease) = held_lease(st) {
        return match &o.desired {
            Desired::Holder { owner, pod } if st.holder.as_deref() == Some(owner) => {
                match same_pod(st, pod.as_ref()) {
                    Err(message) => Step::Release {
                        reason: Reason::HolderChanged,
                        message,
                    },
                    Ok(()) if o.rotation_due => Step::Release {
                        reason: Reason::MaxLifetimeReached,
                        message: "the lease reached spec.maxLifetime; a new one follows".into(),
                    },
                    Ok(())
                        if o.renew_due
                            || st.phase == Some(Phase::Unknown)
                            || st.observed_generation != o.generation =>
                    {
                        Step::Renew { lease }
                    }
                    Ok(()) => Step::Idle,
                }
            }
            Desired::Holder { owner, .. } => Step::Release {
                reason: Reason::HolderChanged,
                message: format!("the lease moves to {owner}"),
            },
            Desired::Nobody { reason, message } => Step::Release {
                reason: *reason,
                message: message.clone(),
            },
        };
    }
    let recorded = o.acquisition;
    match &o.desired {
        Desired::Nobody { .. } if recorded => Step::Abandon,
        Desired::Nobody { reason, message } => Step::Wait {
            reason: *reason,
            message: message.clone(),
            recheck: None,
        },
        Desired::Holder { .. } if o.queued_behind.is_some() && recorded => Step::Abandon,
        Desired::Holder { .. } if o.queued_behind.is_some() => Step::Wait {
            reason: Reason::Queued,
            message: format!(
                "waiting behind TargetLease {} on the same target",
                o.queued_behind.as_deref().unwrap_or_default()
            ),
            recheck: None,
        },
        Desired::Holder { .. } if o.held_elsewhere.is_some() && recorded => Step::Abandon,
        Desired::Holder { .. } if let Some(h) = &o.held_elsewhere => Step::Wait {
            reason: Reason::TargetHeld,
            message: format!(
                "target is held by TargetLease {} (published as Held)",
                h.name
            ),
            recheck: Some(h.recheck),
        },
        Desired::Holder { .. } if !recorded => Step::RecordAcquisition,
        Desired::Holder { owner, .. } => Step::Acquire {
            owner: owner.clone(),
        },
    }
}

/// Decides the next step of a resource being deleted: give everything back,
/// look in the store once for any unpublished lease of its own (`looked`: done
/// in this pass), then let the finalizer go.
pub fn plan_cleanup(status: &TargetLeaseStatus, looked: bool) -> Step {
    if status.releasing_acquisition_id.is_some() {
        finish_release(status)
    } else if holds_lease(status) {
        Step::Release {
            reason: Reason::Released,
            message: "the TargetLease is being deleted".into(),
        }
    } else if !looked {
        Step::Abandon
    } else {
        Step::Finalize
    }
}

/// Whether the published expiry must be rewritten after a renewal that moved
/// Valkey's expiry to `renewed_ms`: it is missing, later than Valkey's new
/// expiry (never publish more than Valkey granted), or close enough to pass
/// before the next renewal (plus `margin`, the time a renewal needs to be
/// answered and published). Otherwise status stays untouched, which keeps
/// writes to about one per `leaseDuration - renewInterval`.
pub fn expiry_to_publish(
    published_ms: Option<i64>,
    renewed_ms: u64,
    server_now_ms: u64,
    renew_interval: Duration,
    margin: Duration,
) -> bool {
    match published_ms {
        None => true,
        Some(published) => {
            published > renewed_ms as i64
                || published - (server_now_ms as i64)
                    <= (renew_interval + margin).as_millis() as i64
        }
    }
}

/// How long before the published expiry the operator must have confirmed the
/// lease or withdrawn `Held`: time for a reply and a status write.
pub fn expiry_margin(renew_interval: Duration) -> Duration {
    (renew_interval / 4).min(Duration::from_secs(1))
}

/// How long a waiter sleeps before retrying a target held until `lease_expires_ms`:
/// just past that lease's expiry (server clock difference), at most a minute.
/// A target still held past that expiry is one whose store has no clock of
/// its own (etcd): it keeps a record a little past the deadline its holder
/// was given, longer after a leader change, and the record's deletion is what
/// wakes the waiter; meanwhile it looks again only every
/// [`HELD_PAST_EXPIRY_RETRY`].
pub fn retry_after_held(lease_expires_ms: u64, server_now_ms: u64) -> Duration {
    if lease_expires_ms <= server_now_ms {
        return HELD_PAST_EXPIRY_RETRY;
    }
    let left = lease_expires_ms - server_now_ms;
    Duration::from_millis(left.saturating_add(50))
        .clamp(Duration::from_millis(100), Duration::from_secs(60))
}

/// See [`retry_after_held`].
pub const HELD_PAST_EXPIRY_RETRY: Duration = Duration::from_secs(1);

/// How long a waiter sleeps before it looks again on its own (it is also woken
/// by releases and pod changes; this bounds what a lost wake-up can cost).
pub fn recheck_after(reason: Reason) -> Option<Duration> {
    match reason {
        // Woken when the one ahead (or the sibling published as Held) lets go;
        // the recheck only covers a wake-up that never came.
        Reason::Queued | Reason::TargetHeld => Some(Duration::from_secs(30)),
        Reason::PodNotReady | Reason::NoReadyCandidate | Reason::PodNotOptedIn => {
            Some(Duration::from_secs(300))
        }
        _ => None,
    }
}

/// The longest a failed reconcile of a lease published until `published_ms`
/// may wait before it tries again: until that expiry less `margin`, so it can
/// still publish a fresh one (or withdraw Held) in time; never less than
/// `floor` (once the expiry has passed, nothing is gained by trying sooner:
/// the keeper renews the lease meanwhile).
pub fn retry_cap(
    published_ms: i64,
    server_now_ms: u64,
    margin: Duration,
    floor: Duration,
) -> Duration {
    let left = published_ms - server_now_ms as i64 - margin.as_millis() as i64;
    Duration::from_millis(left.max(0) as u64).max(floor)
}

/// Delay before retrying after `failures` consecutive failures (store or API):
/// 250ms doubling to a 30s cap (the caller adds jitter).
pub fn backoff(failures: u32) -> Duration {
    let base = Duration::from_millis(250);
    base.saturating_mul(1 << failures.min(7))
        .min(Duration::from_secs(30))
}

pub mod publish;
pub mod timing;

#[cfg(test)]
mod tests;

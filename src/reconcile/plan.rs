//! Pure decisions: (resource, what was observed) -> the next step. No client required.
//!
//! Everything here is a plain function of its inputs so that every branch can
//! be unit-tested without a cluster or a Valkey.

use std::time::Duration;

use crate::conditions::reason;
use crate::crd::{Phase, TargetLeaseStatus};

/// Who should hold the lease right now, as derived from the spec and the pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Desired {
    /// This identity should hold it (for leader election: the elected pod's name).
    Holder(String),
    /// Nobody qualifies yet.
    Nobody {
        /// A constant from [`reason`].
        reason: &'static str,
        /// One sentence for the condition and Event.
        message: String,
    },
}

/// What the reconciler knows when it plans.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    /// Current status (default when the resource is new).
    pub status: &'a TargetLeaseStatus,
    /// Who should hold the lease.
    pub desired: Desired,
    /// Name of an older TargetLease on the same target that is served first.
    pub queued_behind: Option<String>,
    /// Whether a renewal is due (none happened in this process within the renew interval).
    pub renew_due: bool,
}

/// The next thing to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Record a fresh acquisition id in status before calling the store, so a crash
    /// after the store call is resolved by replaying the same id.
    NewAttempt,
    /// Acquire for `owner` with the recorded acquisition id.
    Acquire {
        /// The identity to acquire for.
        owner: String,
    },
    /// Renew the held lease.
    Renew,
    /// Nothing is due until the next renewal.
    Idle,
    /// Give the held lease back (its holder no longer qualifies), then plan again.
    Release {
        /// A constant from [`reason`].
        reason: &'static str,
        /// One sentence for the condition and Event.
        message: String,
    },
    /// Stay Pending until something changes.
    Wait {
        /// A constant from [`reason`].
        reason: &'static str,
        /// One sentence for the condition and Event.
        message: String,
    },
}

/// True when status describes a lease this resource holds.
pub fn is_held(status: &TargetLeaseStatus) -> bool {
    status.phase == Some(Phase::Held)
        && status.fencing_token.is_some()
        && status.holder.is_some()
        && status.acquisition_id.is_some()
}

/// Decides the next step.
pub fn plan(o: &Observed<'_>) -> Step {
    let held = is_held(o.status);
    match &o.desired {
        Desired::Holder(id) if held && o.status.holder.as_deref() == Some(id) => {
            if o.renew_due {
                Step::Renew
            } else {
                Step::Idle
            }
        }
        Desired::Holder(id) if held => Step::Release {
            reason: reason::HOLDER_CHANGED,
            message: format!("the lease moves to {id}"),
        },
        Desired::Nobody { reason, message } if held => Step::Release {
            reason,
            message: message.clone(),
        },
        Desired::Nobody { reason, message } => Step::Wait {
            reason,
            message: message.clone(),
        },
        Desired::Holder(_) if o.queued_behind.is_some() => Step::Wait {
            reason: reason::QUEUED,
            message: format!(
                "waiting behind TargetLease {} on the same target",
                o.queued_behind.as_deref().unwrap_or_default()
            ),
        },
        Desired::Holder(_) if o.status.acquisition_id.is_none() => Step::NewAttempt,
        Desired::Holder(id) => Step::Acquire { owner: id.clone() },
    }
}

/// When the published expiry needs refreshing: it is missing, or will pass before
/// the next renewal. That keeps status writes to about one per
/// `leaseDuration - renewInterval` while never publishing more than Valkey granted.
pub fn needs_expiry_refresh(
    published_expiry_ms: Option<i64>,
    server_now_ms: u64,
    renew_interval: Duration,
) -> bool {
    match published_expiry_ms {
        None => true,
        Some(published) => published - (server_now_ms as i64) <= renew_interval.as_millis() as i64,
    }
}

/// How long a waiter sleeps before retrying a target held until `holder_expires_ms`:
/// just past the holder's expiry (server clock difference), bounded.
pub fn retry_after_held(holder_expires_ms: u64, server_now_ms: u64) -> Duration {
    let left = holder_expires_ms.saturating_sub(server_now_ms);
    Duration::from_millis(left.saturating_add(50))
        .clamp(Duration::from_millis(100), Duration::from_secs(300))
}

/// Delay before retrying after `failures` consecutive store failures:
/// 250ms doubling to a 30s cap (the caller adds jitter).
pub fn backoff(failures: u32) -> Duration {
    let base = Duration::from_millis(250);
    base.saturating_mul(1 << failures.min(7))
        .min(Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(phase: Phase, holder: &str) -> TargetLeaseStatus {
        TargetLeaseStatus {
            phase: Some(phase),
            holder: Some(holder.into()),
            fencing_token: Some(7),
            acquisition_id: Some("a1".into()),
            ..Default::default()
        }
    }

    fn observed(status: &TargetLeaseStatus, desired: Desired) -> Observed<'_> {
        Observed {
            status,
            desired,
            queued_behind: None,
            renew_due: false,
        }
    }

    #[test]
    fn a_new_resource_records_an_attempt_before_acquiring() {
        let st = TargetLeaseStatus::default();
        let o = observed(&st, Desired::Holder("job".into()));
        assert_eq!(plan(&o), Step::NewAttempt);
        let st = TargetLeaseStatus {
            acquisition_id: Some("a1".into()),
            ..Default::default()
        };
        let o = observed(&st, Desired::Holder("job".into()));
        assert_eq!(
            plan(&o),
            Step::Acquire {
                owner: "job".into()
            }
        );
    }

    #[test]
    fn a_held_lease_renews_only_when_due() {
        let st = status(Phase::Held, "job");
        let mut o = observed(&st, Desired::Holder("job".into()));
        assert_eq!(plan(&o), Step::Idle);
        o.renew_due = true;
        assert_eq!(plan(&o), Step::Renew);
    }

    #[test]
    fn a_holder_that_no_longer_qualifies_is_released_first() {
        let st = status(Phase::Held, "pod-a");
        let o = observed(&st, Desired::Holder("pod-b".into()));
        assert!(matches!(
            plan(&o),
            Step::Release {
                reason: reason::HOLDER_CHANGED,
                ..
            }
        ));
        let o = observed(
            &st,
            Desired::Nobody {
                reason: reason::POD_NOT_READY,
                message: "x".into(),
            },
        );
        assert!(matches!(
            plan(&o),
            Step::Release {
                reason: reason::POD_NOT_READY,
                ..
            }
        ));
    }

    #[test]
    fn waiters_queue_behind_older_leases() {
        let st = TargetLeaseStatus::default();
        let mut o = observed(&st, Desired::Holder("job".into()));
        o.queued_behind = Some("first".into());
        assert!(matches!(
            plan(&o),
            Step::Wait {
                reason: reason::QUEUED,
                ..
            }
        ));
    }

    #[test]
    fn lost_leases_start_over() {
        let mut st = status(Phase::Lost, "job");
        st.acquisition_id = None;
        let o = observed(&st, Desired::Holder("job".into()));
        assert_eq!(plan(&o), Step::NewAttempt);
    }

    #[test]
    fn expiry_is_refreshed_before_it_passes() {
        let r = Duration::from_secs(30);
        assert!(needs_expiry_refresh(None, 1000, r));
        assert!(!needs_expiry_refresh(Some(100_000), 1000, r));
        assert!(needs_expiry_refresh(Some(31_000), 1000, r));
    }

    #[test]
    fn store_failures_back_off_to_a_cap() {
        assert_eq!(backoff(0), Duration::from_millis(250));
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(6), Duration::from_secs(16));
        assert_eq!(backoff(7), Duration::from_secs(30));
        assert_eq!(backoff(100), Duration::from_secs(30));
    }

    #[test]
    fn waiters_retry_just_after_the_holder_expires() {
        assert_eq!(retry_after_held(10_000, 9_000), Duration::from_millis(1050));
        assert_eq!(retry_after_held(0, 9_000), Duration::from_millis(100));
        assert_eq!(retry_after_held(u64::MAX, 0), Duration::from_secs(300));
    }
}

//! Condition types and reasons, and the one function that updates them.
//!
//! Reasons are bounded constants: they double as Event reasons and metric labels.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// True while the lease is held; the reason says why not otherwise.
pub const HELD: &str = "Held";
/// False while the store cannot be reached or refuses to answer.
pub const BACKEND_AVAILABLE: &str = "BackendAvailable";
/// False when the spec cannot be acted on (the schema normally prevents this).
pub const SPEC_VALID: &str = "SpecValid";

/// Condition and Event reasons.
pub mod reason {
    /// The lease was granted.
    pub const ACQUIRED: &str = "Acquired";
    /// An acquisition is about to be attempted.
    pub const ACQUIRING: &str = "Acquiring";
    /// Someone else holds the target.
    pub const TARGET_HELD: &str = "TargetHeld";
    /// An older TargetLease on the same target is served first.
    pub const QUEUED: &str = "Queued";
    /// The holder's pod is missing or not Ready.
    pub const POD_NOT_READY: &str = "PodNotReady";
    /// No candidate pod is Ready.
    pub const NO_READY_CANDIDATE: &str = "NoReadyCandidate";
    /// The elected or named holder changed; the old lease was given back.
    pub const HOLDER_CHANGED: &str = "HolderChanged";
    /// Valkey no longer has the lease (expired, revoked or superseded).
    pub const LEASE_LOST: &str = "LeaseLost";
    /// The lease was given back because the resource is being deleted.
    pub const RELEASED: &str = "Released";
    /// The store answered.
    pub const REACHABLE: &str = "Reachable";
    /// The store could not be asked, or did not answer.
    pub const BACKEND_UNAVAILABLE: &str = "BackendUnavailable";
    /// The store holds state this version cannot read; an administrator must revoke it.
    pub const CORRUPT_STATE: &str = "CorruptState";
    /// The lease may still be held but has not been confirmed since its published expiry.
    pub const UNCONFIRMED: &str = "Unconfirmed";
    /// The spec parsed.
    pub const VALID: &str = "Valid";
    /// The spec did not parse.
    pub const INVALID_SPEC: &str = "InvalidSpec";
}

/// Condition status values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// "True".
    True,
    /// "False".
    False,
    /// "Unknown".
    Unknown,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

/// Sets the condition of `type_`, keeping `lastTransitionTime` unless the status flips.
/// Returns true when anything changed.
pub fn upsert(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: Status,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> bool {
    let fresh = Condition {
        type_: type_.to_owned(),
        status: status.as_str().to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time: now.clone(),
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => {
            let same = existing.status == fresh.status
                && existing.reason == fresh.reason
                && existing.message == fresh.message
                && existing.observed_generation == fresh.observed_generation;
            if same {
                return false;
            }
            let transition = if existing.status == fresh.status {
                existing.last_transition_time.clone()
            } else {
                fresh.last_transition_time.clone()
            };
            *existing = Condition {
                last_transition_time: transition,
                ..fresh
            };
            true
        }
        None => {
            conditions.push(fresh);
            true
        }
    }
}

/// The condition of `type_`, if present.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_millisecond(ms).unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let mut c = Vec::new();
        assert!(upsert(
            &mut c,
            HELD,
            Status::False,
            "A",
            "m",
            Some(1),
            &at(1000)
        ));
        assert!(!upsert(
            &mut c,
            HELD,
            Status::False,
            "A",
            "m",
            Some(1),
            &at(2000)
        ));
        assert!(upsert(
            &mut c,
            HELD,
            Status::False,
            "B",
            "m2",
            Some(1),
            &at(3000)
        ));
        assert_eq!(c[0].last_transition_time, at(1000));
        assert!(upsert(
            &mut c,
            HELD,
            Status::True,
            "C",
            "m3",
            Some(1),
            &at(4000)
        ));
        assert_eq!(c[0].last_transition_time, at(4000));
        assert_eq!(c.len(), 1);
    }
}

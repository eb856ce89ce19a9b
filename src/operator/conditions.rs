//! Condition types and reasons, and the one function that updates them.
//!
//! Reasons are one bounded enum: they double as Event reasons and metric labels.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// True while the lease is held; the reason says why not otherwise.
pub const HELD: &str = "Held";
/// False while the store cannot be reached or refuses to answer.
pub const BACKEND_AVAILABLE: &str = "BackendAvailable";
/// False when the spec cannot be acted on (the schema normally prevents this).
pub const SPEC_VALID: &str = "SpecValid";

/// Why a condition is what it is; also the reason of the matching Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The lease was granted.
    Acquired,
    /// An acquisition is about to be attempted.
    Acquiring,
    /// Someone else holds the target.
    TargetHeld,
    /// An older TargetLease on the same target is served first.
    Queued,
    /// The holder's pod is missing or not Ready.
    PodNotReady,
    /// No candidate pod is Ready.
    NoReadyCandidate,
    /// The named pod, or every Ready pod the selector matches, has not opted
    /// in to this TargetLease (the label `<name>.targetlease.dev/candidate`).
    PodNotOptedIn,
    /// The elected or named holder changed (or its pod was recreated); the old
    /// lease is given back.
    HolderChanged,
    /// Valkey no longer has the lease (expired, revoked or superseded).
    LeaseLost,
    /// The lease reached `maxLifetime`; it is given back and a new one acquired.
    MaxLifetimeReached,
    /// The lease was given back because the resource is being deleted.
    Released,
    /// The store answered.
    Reachable,
    /// The store could not be asked, or did not answer.
    BackendUnavailable,
    /// The store holds state this version cannot read; an administrator must revoke it.
    CorruptState,
    /// The lease may still be held but has not been confirmed since its published expiry.
    Unconfirmed,
    /// The spec parsed.
    Valid,
    /// The spec cannot be acted on.
    InvalidSpec,
    /// Another election in the namespace selects some of the same pods.
    OverlappingCandidates,
    /// A deletion cannot record its token in the token floor; its finalizer stays.
    FloorNotWritten,
    /// The namespace's token floors reached their cap: the oldest were folded
    /// into the namespace's base.
    FloorsFolded,
}

impl Reason {
    /// The CamelCase name written in conditions and Events.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Acquired => "Acquired",
            Reason::Acquiring => "Acquiring",
            Reason::TargetHeld => "TargetHeld",
            Reason::Queued => "Queued",
            Reason::PodNotReady => "PodNotReady",
            Reason::NoReadyCandidate => "NoReadyCandidate",
            Reason::PodNotOptedIn => "PodNotOptedIn",
            Reason::HolderChanged => "HolderChanged",
            Reason::LeaseLost => "LeaseLost",
            Reason::MaxLifetimeReached => "MaxLifetimeReached",
            Reason::Released => "Released",
            Reason::Reachable => "Reachable",
            Reason::BackendUnavailable => "BackendUnavailable",
            Reason::CorruptState => "CorruptState",
            Reason::Unconfirmed => "Unconfirmed",
            Reason::Valid => "Valid",
            Reason::InvalidSpec => "InvalidSpec",
            Reason::OverlappingCandidates => "OverlappingCandidates",
            Reason::FloorNotWritten => "FloorNotWritten",
            Reason::FloorsFolded => "FloorsFolded",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Condition status values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionStatus {
    /// "True".
    True,
    /// "False".
    False,
    /// "Unknown".
    Unknown,
}

impl ConditionStatus {
    /// The name written in the condition.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

/// Sets the condition of `type_`, keeping `lastTransitionTime` unless the status flips.
/// Returns true when anything changed.
pub fn upsert(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: ConditionStatus,
    reason: Reason,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> bool {
    let fresh = Condition {
        type_: type_.to_owned(),
        status: status.as_str().to_owned(),
        reason: reason.as_str().to_owned(),
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

/// True when the condition of `type_` has status `status`.
pub fn is(conditions: &[Condition], type_: &str, status: ConditionStatus) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == status.as_str())
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
        let mut set = |status, reason, message: &str, ms| {
            upsert(&mut c, HELD, status, reason, message, Some(1), &at(ms))
        };
        assert!(set(ConditionStatus::False, Reason::Acquiring, "m", 1000));
        assert!(!set(ConditionStatus::False, Reason::Acquiring, "m", 2000));
        assert!(set(ConditionStatus::False, Reason::Queued, "m2", 3000));
        assert!(set(ConditionStatus::True, Reason::Acquired, "m3", 4000));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].last_transition_time, at(4000));
        assert_eq!(c[0].reason, "Acquired");
        let mut c2 = vec![Condition {
            last_transition_time: at(1000),
            ..c[0].clone()
        }];
        upsert(
            &mut c2,
            HELD,
            ConditionStatus::True,
            Reason::Acquired,
            "other",
            Some(1),
            &at(5000),
        );
        assert_eq!(c2[0].last_transition_time, at(1000));
        assert!(is(&c2, HELD, ConditionStatus::True));
    }
}

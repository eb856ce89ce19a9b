//! What the token floor's answer to a deletion does to status and Events.

use super::{Draft, Facts, Next, Transition};
use crate::operator::conditions::{ConditionStatus, HELD, Reason};
use crate::operator::crd::TargetLeaseStatus;
use crate::operator::floor::Fold;

/// The floor could not record `token` (`why`, one sentence from the API
/// server's answer): Held stays withdrawn (it already is: the floor is
/// written only after the lease is unpublished), the condition and a Warning
/// say why the deletion waits, and nothing is released meanwhile.
pub fn floor_unwritten(
    f: &Facts,
    status: &TargetLeaseStatus,
    namespace: &str,
    token: u64,
    why: &str,
) -> Transition {
    let mut d = Draft::new(f, status);
    let message = format!(
        "the TargetLease is being deleted, but the token floor of namespace {namespace} cannot \
         record its fencing token {token}: {why}. The finalizer stays and nothing is released \
         in the lease store until it can (the lease runs out there meanwhile); the operator retries"
    );
    d.condition(
        HELD,
        ConditionStatus::False,
        Reason::FloorNotWritten,
        &message,
    );
    d.note(true, Reason::FloorNotWritten, message);
    d.done(Next::Backoff { not_after: None })
}

/// A deletion's floor write folded the namespace's oldest floors into its
/// base (the namespace reached its cap): say what happened and what it costs.
pub fn floors_folded(
    f: &Facts,
    status: &TargetLeaseStatus,
    namespace: &str,
    fold: &Fold,
) -> Transition {
    let mut d = Draft::new(f, status);
    d.note(
        true,
        Reason::FloorsFolded,
        format!(
            "namespace {namespace} reached its cap of token floors of deleted targets: the {} \
             oldest were folded into the namespace's base floor, now {}, and {} are kept. Every \
             target of {namespace} without a floor of its own (those {}, and any never used) now \
             gets tokens above {} — a jump, never a repeat. Other namespaces are not affected",
            fold.folded, fold.base, fold.kept, fold.folded, fold.base
        ),
    );
    d.done(Next::PlanAgain)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::operator::crd::Phase;

    fn facts() -> Facts {
        Facts {
            generation: Some(1),
            now: Time(Timestamp::from_second(1_750_000_000).unwrap()),
            server_now_ms: 1_750_000_000_000,
            me: "team/job".into(),
            deleting: true,
            renew_interval: Duration::from_secs(30),
            expiry_margin: Duration::from_secs(1),
            confirmed: None,
        }
    }

    /// The reason is written once: a retry with the same answer changes
    /// nothing in status (no rewrite per retry), and Held stays withdrawn.
    #[test]
    fn an_unwritten_floor_says_why_once_and_keeps_held_withdrawn() {
        let withdrawn = TargetLeaseStatus {
            phase: Some(Phase::Released),
            fencing_token: Some(7),
            ..Default::default()
        };
        let why = "the API server answered 403 (denied)";
        let t = floor_unwritten(&facts(), &withdrawn, "team", 7, why);
        assert_eq!(t.status.phase, Some(Phase::Released));
        let held = t
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == HELD)
            .unwrap();
        assert_eq!(
            (held.status.as_str(), held.reason.as_str()),
            ("False", "FloorNotWritten")
        );
        assert!(held.message.contains("fencing token 7") && held.message.contains(why));
        assert!(
            t.notes
                .iter()
                .all(|n| n.warning && n.reason == Reason::FloorNotWritten)
        );
        assert_eq!(t.next, Next::Backoff { not_after: None });
        let again = floor_unwritten(&facts(), &t.status, "team", 7, why);
        assert_eq!(again.status, t.status, "nothing to rewrite");
    }

    #[test]
    fn a_fold_is_a_warning_that_changes_no_status() {
        let status = TargetLeaseStatus::default();
        let fold = Fold {
            folded: 1000,
            kept: 3000,
            base: 42,
        };
        let t = floors_folded(&facts(), &status, "team", &fold);
        assert_eq!(t.status, status);
        let note = &t.notes[0];
        assert!(note.warning && note.reason == Reason::FloorsFolded);
        assert!(note.message.contains("the 1000 oldest") && note.message.contains("above 42"));
    }
}

//! What the token floor's answer to a deletion does to status and Events.

use super::{Draft, Facts, Next, Transition};
use crate::conditions::{ConditionStatus, HELD, Reason};
use crate::crd::TargetLeaseStatus;
use crate::floor::Fold;

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

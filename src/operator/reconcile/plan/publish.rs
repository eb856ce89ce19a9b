//! Pure: the writes that publish a status, in the one order the executor
//! sends them (see `executor.rs`).

use crate::operator::crd::TargetLeaseStatus;
use crate::operator::reconcile::marks::{self, Mark, MarkPlan};
use crate::operator::reconcile::plan::{Step, is_published_held};

/// One Kubernetes write of a publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Strip this TargetLease's marks from a pod (its name).
    Unmark(String),
    /// The status, conditional on the version planned from.
    Status,
    /// Mark the holder pod.
    Mark(Mark),
}

/// The writes that make the pods and the status show `working` where they
/// show `published` now, given what the pods carry (`marks`) and whether
/// `working` differs from `published` (`status_changed`): unmark the pods
/// the new status does not name, then write status, then mark the holder
/// pod — except that an expiry moving earlier on the same pod and token is
/// marked before status (an annotation never shows a later expiry than
/// status). `mark_first` (a failpoint) marks before unmarking.
pub fn order(
    published: &TargetLeaseStatus,
    marks: &MarkPlan,
    status_changed: bool,
    mark_first: bool,
) -> Vec<Write> {
    let mark = marks.mark.as_ref();
    let lowering = lowers_expiry(published, mark);
    let mut writes = Vec::new();
    if let (true, Some(m)) = (mark_first, mark) {
        writes.push(Write::Mark(m.clone()));
    }
    if !mark_first || mark.is_some() {
        writes.extend(marks.unmark.iter().cloned().map(Write::Unmark));
    }
    if let (true, Some(m)) = (lowering, mark) {
        writes.push(Write::Mark(m.clone()));
    }
    if status_changed {
        writes.push(Write::Status);
    }
    if let (false, Some(m)) = (lowering, mark) {
        writes.push(Write::Mark(m.clone()));
    }
    writes
}

/// The mark to write moves the expiry earlier on the pod and token
/// `published` marks.
pub fn lowers_expiry(published: &TargetLeaseStatus, mark: Option<&Mark>) -> bool {
    mark.is_some_and(|m| {
        marks::wanted(published)
            .is_some_and(|p| p.pod == m.pod && p.token == m.token && m.expires_at < p.expires_at)
    })
}

/// The status a step's store call depends on must be published before the
/// call is sent: a recorded acquisition attempt that status does not show
/// yet, before its acquire (a crash after the acquire then finds the attempt
/// to replay or give back); the withdrawal of Held, marks and status, before
/// the release that gives the lease back (nobody is shown a token the store
/// no longer holds). Every other step publishes after its call. (A renewal
/// publishes first only what `transition::before_renew` changes; a deletion
/// covers the token with its floor before it gives anything back,
/// [`floor_first`].)
pub fn before_store_call(
    step: &Step,
    published: &TargetLeaseStatus,
    working: &TargetLeaseStatus,
) -> bool {
    match step {
        Step::Acquire { .. } => {
            working.acquisition_id.is_some() && published.acquisition_id != working.acquisition_id
        }
        Step::FinishRelease { .. } => true,
        _ => false,
    }
}

/// At deletion, the token floor is raised over the last published token
/// before the first step that gives anything back to the store (every step
/// but the one that withdraws Held), once (`floored`: already raised).
pub fn floor_first(step: &Step, floored: bool) -> bool {
    !floored && !matches!(step, Step::Release { .. })
}

/// Publishing `working` withdraws the Held that `published` shows, which
/// frees the target for a sibling waiting on it (`held_elsewhere`),
/// whatever the transition said: wake the waiters.
pub fn withdraws_held(published: &TargetLeaseStatus, working: &TargetLeaseStatus) -> bool {
    is_published_held(published) && !is_published_held(working)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::operator::crd::Phase;

    fn held(pod: &str, token: u64, expires_s: i64) -> TargetLeaseStatus {
        TargetLeaseStatus {
            phase: Some(Phase::Held),
            holder: Some(pod.into()),
            holder_pod: Some(pod.into()),
            fencing_token: Some(token),
            acquisition_id: Some("a".into()),
            expires_at: Some(Time(Timestamp::from_second(expires_s).unwrap())),
            ..Default::default()
        }
    }

    fn mark(status: &TargetLeaseStatus) -> Mark {
        marks::wanted(status).unwrap()
    }

    fn plan(unmark: &[&str], mark: Option<Mark>) -> MarkPlan {
        MarkPlan {
            unmark: unmark.iter().map(|p| (*p).to_owned()).collect(),
            mark,
        }
    }

    #[test]
    fn unmarks_come_before_status_and_the_mark_after_unless_the_expiry_moves_earlier() {
        let published = held("web-0", 3, 2_000);
        let later = mark(&held("web-0", 3, 3_000));
        let earlier = mark(&held("web-0", 3, 1_000));
        let moved = mark(&held("web-1", 4, 1_000));
        let unmark = || Write::Unmark("web-0".into());
        type Case = (
            &'static str,
            TargetLeaseStatus,
            MarkPlan,
            bool,
            bool,
            Vec<Write>,
        );
        // (published, marks, status changed, mark first) -> writes
        let cases: Vec<Case> = vec![
            (
                "nothing to do",
                published.clone(),
                plan(&[], None),
                false,
                false,
                vec![],
            ),
            (
                "status only",
                published.clone(),
                plan(&[], None),
                true,
                false,
                vec![Write::Status],
            ),
            (
                "handoff: unmark, status, mark",
                published.clone(),
                plan(&["web-0"], Some(moved.clone())),
                true,
                false,
                vec![unmark(), Write::Status, Write::Mark(moved.clone())],
            ),
            (
                "a later expiry is marked after status",
                published.clone(),
                plan(&[], Some(later.clone())),
                true,
                false,
                vec![Write::Status, Write::Mark(later.clone())],
            ),
            (
                "an earlier expiry is marked before status",
                published.clone(),
                plan(&[], Some(earlier.clone())),
                true,
                false,
                vec![Write::Mark(earlier.clone()), Write::Status],
            ),
            (
                "an earlier expiry of another token is not lowering",
                held("web-0", 2, 2_000),
                plan(&[], Some(earlier.clone())),
                true,
                false,
                vec![Write::Status, Write::Mark(earlier.clone())],
            ),
            (
                "release: unmark, status",
                published.clone(),
                plan(&["web-0"], None),
                true,
                false,
                vec![unmark(), Write::Status],
            ),
            (
                "failpoint: mark before unmark",
                published.clone(),
                plan(&["web-0"], Some(moved.clone())),
                true,
                true,
                vec![
                    Write::Mark(moved.clone()),
                    unmark(),
                    Write::Status,
                    Write::Mark(moved.clone()),
                ],
            ),
            (
                "failpoint without a mark: nothing unmarked",
                published.clone(),
                plan(&["web-0"], None),
                true,
                true,
                vec![Write::Status],
            ),
        ];
        for (name, published, marks, changed, first, want) in cases {
            assert_eq!(order(&published, &marks, changed, first), want, "{name}");
        }
    }

    #[test]
    fn a_store_call_waits_only_for_the_status_it_depends_on() {
        use crate::operator::conditions::Reason;
        use crate::operator::reconcile::plan::Recorded;
        let held = held("web-0", 3, 2_000);
        let attempt = |id: Option<&str>| TargetLeaseStatus {
            acquisition_id: id.map(str::to_owned),
            ..TargetLeaseStatus::default()
        };
        let acquire = Step::Acquire {
            owner: "web-0".into(),
        };
        let lease = Recorded {
            owner: "web-0".into(),
            acquisition: "a".into(),
            token: 3,
        };
        let cases = [
            (
                "a new attempt is published first",
                &acquire,
                attempt(None),
                attempt(Some("b")),
                true,
            ),
            (
                "a published attempt is not",
                &acquire,
                attempt(Some("b")),
                attempt(Some("b")),
                false,
            ),
            (
                "the implicit first attempt needs nothing",
                &acquire,
                attempt(None),
                attempt(None),
                false,
            ),
            (
                "a release follows its withdrawal",
                &Step::FinishRelease {
                    lease: lease.clone(),
                },
                held.clone(),
                held.clone(),
                true,
            ),
            (
                "a renewal publishes after",
                &Step::Renew { lease },
                held.clone(),
                held.clone(),
                false,
            ),
            (
                "recording an attempt publishes after",
                &Step::RecordAcquisition,
                held.clone(),
                held.clone(),
                false,
            ),
            (
                "so does beginning a release",
                &Step::Release {
                    reason: Reason::Released,
                    message: String::new(),
                },
                held.clone(),
                held.clone(),
                false,
            ),
        ];
        for (name, step, published, working, want) in cases {
            assert_eq!(
                before_store_call(step, &published, &working),
                want,
                "{name}"
            );
        }
        let release = Step::Release {
            reason: Reason::Released,
            message: String::new(),
        };
        assert!(
            !floor_first(&release, false),
            "withdrawing Held gives nothing back"
        );
        assert!(floor_first(&Step::Abandon, false));
        assert!(floor_first(&Step::Finalize, false));
        assert!(!floor_first(&Step::Finalize, true), "raised once");
    }

    #[test]
    fn only_withdrawing_a_published_held_wakes_the_waiters() {
        let held = held("web-0", 3, 2_000);
        let pending = TargetLeaseStatus {
            phase: Some(Phase::Pending),
            ..held.clone()
        };
        assert!(withdraws_held(&held, &pending));
        assert!(!withdraws_held(&held, &held));
        assert!(!withdraws_held(&pending, &held));
        assert!(!withdraws_held(&pending, &pending));
    }
}

//! Unit tests of [`super`]: each lie on a synthetic history.

use super::super::fixtures::*;
use super::*;

fn l(token: u64, issue: &str, expires: u64) -> Option<LeaseView> {
    Some(view("a", token, issue, 1000, expires))
}

fn found(h: &History) -> Vec<String> {
    check(h).iter().map(|v| v.detail.clone()).collect()
}

#[test]
fn what_observers_saw_matches_every_report() {
    let h = H::new()
        .acquired("a", "t", "r1", 1, 1000, 3000)
        .look("t", l(1, "r1", 3000), 1100)
        .renew("a", "t", ("r1", 1), said("renewed"), 1200, 3200)
        .look("t", l(1, "r1", 3200), 1300)
        .renew("a", "t", ("r1", 1), said("expired"), 1400, 0) // honest: nothing set
        .look("t", l(1, "r1", 3200), 1500)
        .release("a", "t", 1, said("released"), 1600)
        .look("t", None, 1700)
        .write(Sink::Commit, "t", 1, "c1", said("committed"), 1800)
        .read("t", Some((1, "c1")), 1900)
        .build();
    assert_eq!(found(&h), Vec::<String>::new());
}

#[test]
fn without_a_store_clock_a_look_counts_from_its_reply() {
    use crate::history::Dating;
    // An acquire acknowledged until 3000; a look dated 2990 (etcd: the
    // client's clock before it was sent) shows the next token.
    let history = |dating, answered_ms| {
        let mut h = H::new()
            .dated(dating)
            .at(1000)
            .acquired("a", "t", "r1", 1, 1000, 3000)
            .at(2990)
            .look("t", l(2, "r2", 5000), 2990)
            .build();
        h.sightings[0].at_ms = answered_ms;
        h
    };
    // Answered after the expiry: it may have been read after it.
    assert_eq!(
        found(&history(Dating::ClientBeforeSend, 3100)),
        Vec::<String>::new()
    );
    // Answered before the expiry: the lie is caught.
    let early = found(&history(Dating::ClientBeforeSend, 2995));
    assert!(
        early[0].contains("at 2995 the target was held by r2"),
        "{early:?}"
    );
    // Where the store dates the look, its date is when it was read.
    let valkey = found(&history(Dating::Store, 3100));
    assert!(
        valkey[0].contains("at 2990 the target was held by r2"),
        "{valkey:?}"
    );
    // A refused release, then a look dated before the expiry that finds
    // the lease gone: the same rule.
    let refused = |answered_ms| {
        let mut h = H::new()
            .dated(Dating::ClientBeforeSend)
            .at(1000)
            .acquired("a", "t", "r1", 1, 1000, 3000)
            .release("a", "t", 1, said("not_holder"), 1600)
            .at(2990)
            .look("t", None, 2990)
            .build();
        h.sightings[0].at_ms = answered_ms;
        h
    };
    assert_eq!(found(&refused(3100)), Vec::<String>::new());
    assert!(
        found(&refused(2995))[0].contains("reported as refused"),
        "{:?}",
        found(&refused(2995))
    );
}

#[test]
fn a_renewal_reported_done_that_never_ran_is_caught() {
    // Control: a lost reply reported as renewed.
    let h = H::new()
        .acquired("a", "t", "r1", 1, 1000, 3000)
        .renew("a", "t", ("r1", 1), said("renewed"), 1200, 3200)
        .look("t", l(1, "r1", 3000), 1300)
        .build();
    assert!(
        found(&h)[0].contains("its expiry was 3000"),
        "{:?}",
        found(&h)
    );
    let gone = H::new()
        .acquired("a", "t", "r1", 1, 1000, 3000)
        .renew("a", "t", ("r1", 1), said("renewed"), 2900, 4900)
        .look("t", None, 3500)
        .build();
    assert!(found(&gone)[0].contains("the target was free"));
    // A data-loss fault in between: the look proves nothing.
    let lost = H::new()
        .acquired("a", "t", "r1", 1, 1000, 3000)
        .renew("a", "t", ("r1", 1), said("renewed"), 2900, 4900)
        .lossy_fault()
        .look("t", None, 3500)
        .build();
    assert_eq!(found(&lost), Vec::<String>::new());
}

#[test]
fn a_release_or_revoke_reported_done_that_never_ran_is_caught() {
    let h = H::new()
        .acquired("a", "t", "r1", 1, 1000, 3000)
        .release("a", "t", 1, said("released"), 1600)
        .look("t", l(1, "r1", 3000), 1700)
        .build();
    assert!(
        found(&h)[0].contains("reported released"),
        "{:?}",
        found(&h)
    );
    let h = H::new()
        .acquired("a", "t", "r1", 1, 1000, 3000)
        .revoke("t", "v1", 1, said("revoked"))
        .look("t", l(1, "r1", 3000), 1700)
        .build();
    assert!(found(&h)[0].contains("reported revoked"), "{:?}", found(&h));
}

#[test]
fn refusals_that_took_effect_are_caught() {
    // A renewal reported unavailable that set an expiry.
    let h = H::new()
        .acquired("a", "t", "r1", 1, 1000, 3000)
        .renew("a", "t", ("r1", 1), Answer::Unavailable, 0, 0)
        .look("t", l(1, "r1", 3400), 1500)
        .build();
    assert!(found(&h)[0].contains("no acknowledged operation set"));
    // ... unless a renewal of it had an unknown outcome.
    let h = H::new()
        .acquired("a", "t", "r1", 1, 1000, 3000)
        .renew("a", "t", ("r1", 1), Answer::Unknown, 0, 0)
        .look("t", l(1, "r1", 3400), 1500)
        .build();
    assert_eq!(found(&h), Vec::<String>::new());
    // A release reported unavailable after which the lease was gone early.
    let h = H::new()
        .acquired("a", "t", "r1", 1, 1000, 3000)
        .release("a", "t", 1, Answer::Unavailable, 0)
        .look("t", None, 1500)
        .build();
    assert!(
        found(&h).iter().any(|d| d.contains("before its expiry")),
        "{:?}",
        found(&h)
    );
}

/// An acquire whose reply was lost, retried with the same request after a
/// restart lost what its first run set, is the same lease twice: the first
/// run's expiry, seen before a later renew of it was refused, is not that
/// renew's doing. Seen after the renew was sent, it is.
#[test]
fn an_expiry_seen_before_a_refused_renew_was_sent_is_not_its_doing() {
    let before = H::new()
        .acquire_answer("a", "t", "r1", Answer::Unknown, None, 0)
        .look("t", l(12, "r1", 3000), 1000)
        .lossy_fault()
        .acquired("a", "t", "r1", 12, 1300, 3300)
        .renew("a", "t", ("r1", 12), said("not_owner"), 1500, 0)
        .build();
    assert_eq!(found(&before), Vec::<String>::new());
    let after = H::new()
        .acquire_answer("a", "t", "r1", Answer::Unknown, None, 0)
        .lossy_fault()
        .acquired("a", "t", "r1", 12, 1300, 3300)
        .renew("a", "t", ("r1", 12), said("not_owner"), 1500, 0)
        .look("t", l(12, "r1", 3000), 1600)
        .build();
    assert!(
        found(&after)
            .iter()
            .any(|d| d.contains("renew renew-1500") && d.contains("no acknowledged operation set")),
        "{:?}",
        found(&after)
    );
}

/// A token issued twice (a restart lost the counter) names two leases:
/// what one of them was told says nothing about the other. Here the first
/// lease's renew was refused, the second lease's acquire reply was lost, and
/// an observer sees the second lease with the expiry its own acquire set.
#[test]
fn a_token_issued_twice_is_two_leases() {
    let h = H::new()
        .acquired("a", "t", "r1", 12, 1000, 3000)
        .renew("a", "t", ("r1", 12), Answer::Unavailable, 0, 0)
        .lossy_fault()
        .acquire_answer("b", "t", "r2", Answer::Unknown, None, 0)
        .look("t", l(12, "r2", 5400), 3500)
        .build();
    assert_eq!(found(&h), Vec::<String>::new());
    // A refused renew that does not name its lease (an empty issue)
    // explains nothing by itself: the acquire's expiry is still what
    // was reported.
    let h = H::new()
        .acquired("a", "t", "r1", 12, 1000, 3000)
        .renew("a", "t", ("", 12), Answer::Unavailable, 0, 0)
        .look("t", l(12, "r1", 5400), 1500)
        .build();
    assert!(
        found(&h)[0].contains("no acknowledged operation set"),
        "{:?}",
        found(&h)
    );
    // The same look at the first lease is the lie it always was.
    let h = H::new()
        .acquired("a", "t", "r1", 12, 1000, 3000)
        .renew("a", "t", ("r1", 12), Answer::Unavailable, 0, 0)
        .look("t", l(12, "r1", 5400), 1500)
        .build();
    assert!(
        found(&h)[0].contains("no acknowledged operation set"),
        "{:?}",
        found(&h)
    );
}

/// A write applied just before a loss and answered after the loss healed
/// was lost, not misreported: no honesty violation (its loss is judged as
/// durability). The same history without the loss is a lie.
#[test]
fn a_write_applied_before_a_loss_and_answered_after_it_is_no_lie() {
    let commit = |h: H| {
        h.at(1000)
            .write(Sink::Commit, "t", 14, "c1", said("committed"), 1000)
            .read("t", Some((1, "c2")), 1010)
    };
    let lost = commit(H::new().lossy_fault_at(1000, 1000)).build();
    assert_eq!(found(&lost), Vec::<String>::new());
    let lie = commit(H::new()).build();
    assert!(
        found(&lie)[0].contains("carried token 1"),
        "{:?}",
        found(&lie)
    );
    // A renewal: applied, then everything lost, answered after.
    let renew = |h: H| {
        h.acquired("a", "t", "r1", 1, 100, 900)
            .at(1000)
            .renew("a", "t", ("r1", 1), said("renewed"), 1000, 3000)
            .look("t", None, 1010)
    };
    assert_eq!(
        found(&renew(H::new().lossy_fault_at(1000, 1000)).build()),
        Vec::<String>::new()
    );
    assert!(!found(&renew(H::new()).build()).is_empty());
}

#[test]
fn a_commit_reported_done_that_never_landed_is_caught() {
    let h = H::new()
        .write(Sink::Commit, "t", 1, "c1", said("committed"), 1000)
        .write(Sink::Commit, "t", 2, "c2", said("committed"), 1100)
        .read("t", Some((1, "c1")), 1200)
        .build();
    assert!(found(&h)[0].contains("carried token 1"), "{:?}", found(&h));
    let h = H::new()
        .write(Sink::Commit, "t", 2, "c1", said("committed"), 1000)
        .write(Sink::Commit, "t", 2, "c2", said("committed"), 1100)
        .read("t", Some((2, "c1")), 1200)
        .build();
    assert!(found(&h)[0].contains("acknowledged before it was sent"));
    // The same token read back from a commit that may be later: fine.
    let h = H::new()
        .write(Sink::Commit, "t", 2, "c1", Answer::Unknown, 0)
        .write(Sink::Commit, "t", 2, "c2", said("committed"), 1100)
        .write(Sink::Commit, "t", 2, "c1", said("committed"), 1150)
        .read("t", Some((2, "c1")), 1200)
        .build();
    assert_eq!(found(&h), Vec::<String>::new());
}

//! Release notices: a waiter subscribed to one target hears that target's
//! lease end (release, revoke, and expiry where the store sees it), and
//! nothing about other targets or about renewals.

use futures::StreamExt;
use targetlease::store::{Notice, Notices};

use super::*;

/// Long enough for a notice to arrive on a loaded machine.
const HEARD_WITHIN: Duration = Duration::from_secs(5);
/// How long to listen before concluding that nothing was announced.
const QUIET_FOR: Duration = Duration::from_millis(300);

async fn next_notice(n: &mut Notices, within: Duration) -> Option<Notice> {
    tokio::time::timeout(within, n.next()).await.ok().flatten()
}

/// Release and revoke of the target are announced to a waiter on another
/// client; a release of another target and a renewal are not.
pub async fn an_ending_lease_is_announced_to_the_targets_waiters<H: Harness>(h: &H) {
    let (s, t, other) = (h.store(), target("watched"), target("unwatched"));
    let alice = held(&*s, &t, "alice", LONG).await;
    let waiter = h.another_client().await;
    let mut n = waiter.notices(&t).await.expect("subscribe");

    let o = held(&*s, &other, "carol", LONG).await;
    assert_eq!(release(&*s, &other, &o).await.outcome, Outcome::Released);
    assert_eq!(next_notice(&mut n, QUIET_FOR).await, None, "another target");

    assert_eq!(release(&*s, &t, &alice).await.outcome, Outcome::Released);
    assert_eq!(next_notice(&mut n, HEARD_WITHIN).await, Some(Notice::Freed));

    let bob = held(&*s, &t, "bob", LONG).await;
    let renewed = s
        .renew(&RenewRequest::new(t.clone(), handle(&bob), LONG))
        .await
        .expect("renew");
    assert_eq!(renewed.outcome, Outcome::Renewed);
    assert_eq!(next_notice(&mut n, QUIET_FOR).await, None, "acquire, renew");

    let revoked = s
        .revoke(&RevokeRequest::new(t.clone()))
        .await
        .expect("revoke");
    assert_eq!(revoked.outcome, Outcome::Revoked);
    assert_eq!(next_notice(&mut n, HEARD_WITHIN).await, Some(Notice::Freed));
}

/// An expiry is announced by a store that sees it happen (etcd deletes the
/// record itself); the others announce nothing, and waiters ask again at the
/// holder's expiry instead (docs/protocol.md).
pub async fn an_expiry_is_announced_only_where_the_store_sees_it<H: Harness>(h: &H) {
    let (s, t) = (h.store(), target("expiring"));
    held(&*s, &t, "alice", h.short()).await;
    let waiter = h.another_client().await;
    let mut n = waiter.notices(&t).await.expect("subscribe");
    h.advance(h.past_short()).await;
    let heard = next_notice(&mut n, QUIET_FOR).await;
    if h.announces_expiry() {
        assert_eq!(heard, Some(Notice::Freed), "the expiry was not announced");
    } else {
        assert_eq!(heard, None, "this store announces no expiry");
    }
    assert_eq!(
        acquire(&*s, &t, "bob", LONG).await.outcome,
        Outcome::Acquired
    );
}

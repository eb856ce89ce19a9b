//! etcd's release watches under the faults a long-lived stream meets: the
//! stream breaks (the member's connection reset while a lease ends) and the
//! watch resumes from where it stopped, so the deletion in between is still
//! heard; the point to resume from was compacted away, and the waiter is
//! told it may have missed a notice. The operator's watch of every lease
//! record names each target whose lease ends, and nothing else.
//!
//! The waiter talks to one member through a proxy the test can cut; the
//! lease ends through a direct client meanwhile.

use std::time::Duration;

use etcd_client::{Client, CompactionOptions};
use futures::StreamExt;
use futures::stream::BoxStream;
use targetlease::store::etcd::{EtcdConfig, EtcdStore};
use targetlease::store::{
    LeaseStore, Notice, Notices, Outcome, RenewRequest, RevokeRequest, Target,
};

use crate::cases::{LONG, handle, held, release, target};
use crate::etcd_cluster::EtcdCluster;
use crate::support::tcp_proxy::TcpProxy;

/// Long enough for a resumed watch to hear what it missed on a loaded
/// machine (reconnect backoff included).
const HEARD_WITHIN: Duration = Duration::from_secs(10);
/// How long to listen before concluding that nothing was announced.
const QUIET_FOR: Duration = Duration::from_millis(500);

struct Setup {
    cluster: EtcdCluster,
    /// A client on every member, for ending leases while the waiter is cut off.
    direct: EtcdStore,
    raw: Client,
    /// In front of member 0, the waiter's only way in.
    proxy: TcpProxy,
    waiter: EtcdStore,
}

async fn setup() -> Setup {
    let cluster = tokio::task::spawn_blocking(EtcdCluster::start)
        .await
        .expect("start the etcd cluster");
    let direct = connect(cluster.url()).await;
    let raw = Client::connect(cluster.endpoints(), None)
        .await
        .expect("raw etcd client");
    let proxy = TcpProxy::start(&cluster.endpoints()[0]);
    let waiter = connect(format!("etcd://127.0.0.1:{}", proxy.port)).await;
    Setup {
        cluster,
        direct,
        raw,
        proxy,
        waiter,
    }
}

async fn connect(url: String) -> EtcdStore {
    EtcdStore::connect(&EtcdConfig {
        url,
        ..EtcdConfig::default()
    })
    .await
    .expect("connect to the etcd cluster")
}

async fn next<T>(s: &mut BoxStream<'static, T>, within: Duration) -> Option<T> {
    tokio::time::timeout(within, s.next()).await.ok().flatten()
}

impl Setup {
    /// Cuts the waiter off: its connections reset, new ones refused.
    fn cut(&self) {
        self.proxy.refuse_new(true);
        self.proxy.reset_connections();
    }

    fn heal(&self) {
        self.proxy.refuse_new(false);
    }

    /// A waiter subscribed to `name`, then cut off; the lease it waits on
    /// is released meanwhile. Still cut off on return.
    async fn released_while_cut_off(&self, name: &str) -> (Target, Notices) {
        let t = target(name);
        let alice = held(&self.direct, &t, "alice", LONG).await;
        let notices = self.waiter.notices(&t).await.expect("subscribe");
        self.cut();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            release(&self.direct, &t, &alice).await.outcome,
            Outcome::Released
        );
        (t, notices)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broken_watch_resumes_and_hears_the_release_it_was_cut_off_from() {
    let s = setup().await;
    let (_, mut notices) = s.released_while_cut_off("resumed").await;
    // The release lands while the waiter cannot hear anything.
    tokio::time::sleep(Duration::from_secs(1)).await;
    s.heal();
    assert_eq!(
        next(&mut notices, HEARD_WITHIN).await,
        Some(Notice::Freed),
        "the resumed watch did not hear the release made while it was cut off (member 0 log: {})",
        s.cluster.log_path(0).display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watch_whose_resume_point_was_compacted_says_it_may_have_missed_a_notice() {
    let s = setup().await;
    let (t, mut notices) = s.released_while_cut_off("compacted").await;
    // Compact past the release: the watch cannot resume where it stopped.
    let mut kv = s.raw.kv_client();
    let put = kv.put("unrelated", "x", None).await.expect("put");
    let revision = put.header().expect("a header").revision();
    s.raw
        .clone()
        .compact(revision, Some(CompactionOptions::new().with_physical()))
        .await
        .expect("compact");
    s.heal();
    assert_eq!(
        next(&mut notices, HEARD_WITHIN).await,
        Some(Notice::Resubscribed),
        "a watch that could not resume must say it may have missed a notice"
    );
    // Watching again from now: the next release is heard as usual.
    let bob = held(&s.direct, &t, "bob", LONG).await;
    assert_eq!(
        release(&s.direct, &t, &bob).await.outcome,
        Outcome::Released
    );
    assert_eq!(next(&mut notices, HEARD_WITHIN).await, Some(Notice::Freed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_operators_watch_names_every_target_whose_lease_ends_and_nothing_else() {
    let s = setup().await;
    let (a, b, c) = (target("a"), target("b/with-slash"), target("c"));
    let alice = held(&s.direct, &a, "alice", LONG).await;
    held(&s.direct, &b, "bob", LONG).await;
    let carol = held(&s.direct, &c, "carol", LONG).await;
    let mut ended = s.waiter.release_notices().await.expect("watch");

    // A renewal, a new acquisition and a fenced commit are not ends.
    let renewed = s
        .direct
        .renew(&RenewRequest::new(c.clone(), handle(&carol), LONG))
        .await
        .expect("renew");
    assert_eq!(renewed.outcome, Outcome::Renewed);
    held(&s.direct, &target("d"), "dave", LONG).await;
    assert_eq!(next(&mut ended, QUIET_FOR).await, None, "a renew or grant");

    assert_eq!(
        release(&s.direct, &a, &alice).await.outcome,
        Outcome::Released
    );
    assert_eq!(next(&mut ended, HEARD_WITHIN).await, Some(a));
    let revoked = s
        .direct
        .revoke(&RevokeRequest::new(b.clone()))
        .await
        .expect("revoke");
    assert_eq!(revoked.outcome, Outcome::Revoked);
    assert_eq!(next(&mut ended, HEARD_WITHIN).await, Some(b));

    // etcd deletes an expired record itself: that end is named too.
    let e = target("expiring");
    held(&s.direct, &e, "erin", Duration::from_secs(1)).await;
    assert_eq!(next(&mut ended, HEARD_WITHIN).await, Some(e));
}

/// Long enough for a client pinging more often than etcd allows to be cut
/// off even by the most lenient rule (three pings too many, 10 s apart,
/// with no call open).
const IDLE_FOR: Duration = Duration::from_secs(50);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_connections_are_not_closed_by_the_members_for_pinging_too_often() {
    let s = setup().await;
    let t = target("idle");
    let alice = held(&s.direct, &t, "alice", Duration::from_secs(120)).await;
    // One client waits on a Watch; another has nothing open at all.
    let mut notices = s.waiter.notices(&t).await.expect("subscribe");
    let quiet_proxy = TcpProxy::start(&s.cluster.endpoints()[0]);
    let quiet = connect(format!("etcd://127.0.0.1:{}", quiet_proxy.port)).await;
    let (watching, idle) = (s.proxy.accepted(), quiet_proxy.accepted());

    tokio::time::sleep(IDLE_FOR).await;
    assert_eq!(
        release(&s.direct, &t, &alice).await.outcome,
        Outcome::Released
    );
    assert_eq!(next(&mut notices, HEARD_WITHIN).await, Some(Notice::Freed));
    let free = quiet.get(&t).await.expect("get after idling");
    assert_eq!(free.outcome, Outcome::NotFound);
    assert_eq!(
        (s.proxy.accepted(), quiet_proxy.accepted()),
        (watching, idle),
        "a member closed a connection while it idled, so the client connected again \
         (members' logs, \"too many pings\": {})",
        s.cluster.log_path(0).display()
    );
}

//! etcd has no clock, so the store judges a holder's deadline by the
//! client's clock, and must judge it when the write is sent, not when the
//! record was read: over a slow link a renewal or a fenced commit whose
//! read began just before the deadline is sent after it, and must be
//! refused (`expired`), not applied to a lease whose holder has stopped.
//!
//! The store reaches one member through a proxy that holds every read on
//! the link; etcd itself still keeps the record past the deadline (its
//! lease is whole seconds), so a write sent late would still find it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use targetlease::store::etcd::{EtcdConfig, EtcdStore};
use targetlease::store::{CommitRequest, Lease, LeaseStore, Outcome, RenewRequest, Target};

use crate::cases::{handle, held, target};
use crate::etcd_cluster::EtcdCluster;
use crate::support::tcp_proxy::{Mode, TcpProxy};

/// The lease's life: etcd's lease is 2 s (whole seconds, rounded up), so
/// etcd keeps the record about 0.9 s past the holder's deadline.
const TTL: Duration = Duration::from_millis(1100);
/// How long the proxy holds each read either way: a round trip takes at
/// least twice this.
const SLOW: Duration = Duration::from_millis(100);
/// How long before the deadline the request is made: less than one round
/// trip over the slow link, so its write is always sent after the deadline.
const BEFORE_MS: u64 = 150;
/// How late the request may start and still be read before the deadline
/// (a loaded machine oversleeps): later, the test takes another lease.
const LATE_MS: u64 = 50;

struct Slow {
    _cluster: EtcdCluster,
    proxy: TcpProxy,
    store: EtcdStore,
}

async fn slow() -> Slow {
    let cluster = tokio::task::spawn_blocking(EtcdCluster::start)
        .await
        .expect("start the etcd cluster");
    let proxy = TcpProxy::start(&cluster.endpoints()[0]);
    let store = EtcdStore::connect(&EtcdConfig {
        url: format!("etcd://127.0.0.1:{}", proxy.port),
        timeout: Duration::from_secs(10),
        ..EtcdConfig::default()
    })
    .await
    .expect("connect through the proxy");
    Slow {
        _cluster: cluster,
        proxy,
        store,
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

impl Slow {
    /// A lease on a target named after `name`, [`BEFORE_MS`] (give or take
    /// [`LATE_MS`]) before its deadline, with the link slowed down: the
    /// target and the lease.
    async fn lease_about_to_end(&self, name: &str) -> (Target, Lease) {
        for attempt in 0..5 {
            self.proxy.set_mode(Mode::Pass);
            let t = target(&format!("{name}-{attempt}"));
            let lease = held(&self.store, &t, "alice", TTL).await;
            let wait = lease.expires_at_ms.saturating_sub(BEFORE_MS + now_ms());
            tokio::time::sleep(Duration::from_millis(wait)).await;
            self.proxy.set_mode(Mode::Delay(SLOW));
            if now_ms() + BEFORE_MS <= lease.expires_at_ms + LATE_MS {
                return (t, lease);
            }
        }
        panic!("five times the machine slept far past the moment to send the request");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewal_sent_after_the_deadline_is_refused_though_read_before_it() {
    let s = slow().await;
    let (t, lease) = s.lease_about_to_end("late-renew").await;
    let r = s
        .store
        .renew(&RenewRequest::new(t, handle(&lease), TTL))
        .await
        .expect("renew");
    assert_eq!(
        r.outcome,
        Outcome::Expired,
        "a renewal made {BEFORE_MS} ms before the deadline, its write sent after it: {r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_sent_after_the_deadline_is_refused_though_read_before_it() {
    let s = slow().await;
    let (t, lease) = s.lease_about_to_end("late-commit").await;
    let r = s
        .store
        .commit(&CommitRequest::new(t, lease.fencing_token, "k", "v"))
        .await
        .expect("commit");
    assert_eq!(
        r.outcome,
        Outcome::Expired,
        "a commit made {BEFORE_MS} ms before the deadline, its write sent after it: {r:?}"
    );
}

/// A ttl that is not whole seconds: etcd's lease for it is 3 s (long
/// enough to be read after an acquire over the slow link).
const FRACTIONAL_TTL: Duration = Duration::from_millis(2500);
/// The link's delay for the grant test, each way.
const GRANT_SLOW: Duration = Duration::from_millis(250);

/// The holder's deadline (`expires_at_ms`) counts from a moment before
/// etcd's lease was granted, and that lease is the ttl rounded up to whole
/// seconds: the deadline ends first, however slow the link. Over a slow
/// link, an acquire reads the target (one round trip), samples the clock,
/// then grants etcd's lease (another round trip): the deadline's start must
/// come before the grant could have been answered, so well within two
/// round trips of the request (one is timed just before, by a `get`, the
/// same read).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_holders_deadline_ends_before_etcds_lease() {
    let s = slow().await;
    let raw = etcd_client::Client::connect(s._cluster.endpoints(), None)
        .await
        .expect("raw etcd client");
    let ttl = FRACTIONAL_TTL.as_millis() as u64;
    // The request cache's bucket lease is granted once and then shared,
    // unless an acquire's window falls in the next minute's bucket: then
    // its grant comes before the sample too, so one try may be late for
    // that reason alone (or for a stall of the loaded machine).
    held(&s.store, &target("grant-warm"), "alice", FRACTIONAL_TTL).await;
    let mut tries = Vec::new();
    for attempt in 0..3 {
        let t = target(&format!("grant-{attempt}"));
        s.proxy.set_mode(Mode::Delay(GRANT_SLOW));
        let timed = now_ms();
        s.store.get(&t).await.expect("get over the slow link");
        let round_trip = now_ms() - timed;
        let before = now_ms();
        let lease = held(&s.store, &t, "alice", FRACTIONAL_TTL).await;
        s.proxy.set_mode(Mode::Pass);
        let record = raw
            .kv_client()
            .get(s.store.keys().lease(&t).as_str(), None)
            .await
            .expect("read the record");
        let etcd_lease = record
            .kvs()
            .first()
            .expect("the record is gone already: its etcd lease was shorter than granted")
            .lease();
        let granted = raw
            .lease_client()
            .time_to_live(etcd_lease, None)
            .await
            .expect("the record's etcd lease")
            .granted_ttl();
        assert_eq!(
            granted, 3,
            "a {FRACTIONAL_TTL:?} lease's etcd lease is {granted} s, not its ttl rounded up"
        );
        let started = lease.expires_at_ms - ttl - before;
        tries.push((started, round_trip));
        if started < round_trip + round_trip / 2 {
            return;
        }
    }
    panic!(
        "the deadline started this long (ms) after the request, with a round trip taking this \
         long (ms): {tries:?}; it counts from after etcd's lease was granted"
    );
}

//! A member that falls silent without closing its connections (a middlebox
//! that drops the flow, a frozen VM): the calls sent to it end at their
//! deadline until the client's keep-alive finds it — a ping once a call has
//! heard nothing from it for the connect timeout, unanswered within the
//! connect timeout — and then the other members take every call. The
//! client talks to each member through a proxy; one proxy turns its open
//! connections into black holes (new ones pass, as after a dropped flow).

use std::time::{Duration, Instant};

use targetlease::store::LeaseStore;
use targetlease::store::etcd::{EtcdConfig, EtcdStore};

use crate::cases::target;
use crate::etcd_cluster::EtcdCluster;
use crate::support::tcp_proxy::TcpProxy;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the calls' connection may hear nothing, with a call open,
/// before it is pinged: the connect timeout.
const PINGED_AFTER: Duration = CONNECT_TIMEOUT;
/// Each call's deadline: a call to the silent member ends this late.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// Timers on a loaded machine.
const SLACK: Duration = Duration::from_secs(3);
/// A deadline longer than three connect timeouts.
const LONG_CALL_TIMEOUT: Duration = Duration::from_secs(9);
/// How long calls are made after the member fell silent.
const WATCHED_FOR: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_gone_silent_is_given_up_within_the_keep_alive_bound() {
    let failed_at = calls_after_a_member_falls_silent(CALL_TIMEOUT).await;
    let last = *failed_at
        .last()
        .expect("no call went to the silent member: the test proved nothing");
    let bound = PINGED_AFTER + CONNECT_TIMEOUT + CALL_TIMEOUT + SLACK;
    assert!(
        last <= bound,
        "calls still failed {last:?} after a member fell silent (bound {bound:?}); \
         failures at {failed_at:?}"
    );
}

/// With a `--timeout` longer than three connect timeouts the connection is
/// pinged after a third of it (a member closes a connection pinged more
/// often than it answers), and a silent member is still given up then plus
/// the connect timeout: a call open on it ends there, not at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_long_timeout_a_silent_member_is_given_up_after_a_third_of_it() {
    let timeout = LONG_CALL_TIMEOUT;
    let failed_at = calls_after_a_member_falls_silent(timeout).await;
    let last = *failed_at
        .last()
        .expect("no call went to the silent member: the test proved nothing");
    let bound = timeout / 3 + CONNECT_TIMEOUT + SLACK;
    // Not earlier either: timers never fire early, so a member given up
    // sooner was pinged after less than a third of the timeout.
    let earliest = timeout / 3 + CONNECT_TIMEOUT - Duration::from_millis(500);
    assert!(
        last >= earliest,
        "a call open on the silent member failed at {last:?}, before a ping sent after a \
         third of --timeout {timeout:?} could have gone unanswered ({earliest:?}); \
         failures at {failed_at:?}"
    );
    assert!(
        last <= bound && bound < timeout,
        "calls still failed {last:?} after a member fell silent (bound {bound:?}, \
         --timeout {timeout:?}); failures at {failed_at:?}"
    );
}

/// When each call made for [`WATCHED_FOR`] after one of three members fell
/// silent failed, counted from that moment.
async fn calls_after_a_member_falls_silent(call_timeout: Duration) -> Vec<Duration> {
    let cluster = tokio::task::spawn_blocking(EtcdCluster::start)
        .await
        .expect("start the etcd cluster");
    let proxies: Vec<TcpProxy> = cluster.endpoints().iter().map(TcpProxy::start).collect();
    let url = proxies
        .iter()
        .map(|p| format!("127.0.0.1:{}", p.port))
        .collect::<Vec<_>>()
        .join(",");
    let store = EtcdStore::connect(&EtcdConfig {
        url: format!("etcd://{url}"),
        timeout: call_timeout,
        connect_timeout: CONNECT_TIMEOUT,
        ..EtcdConfig::default()
    })
    .await
    .expect("connect through the proxies");
    let t = target("silent");
    for _ in 0..30 {
        store.get(&t).await.expect("get before the fault");
    }
    let accepted: Vec<u64> = proxies.iter().map(TcpProxy::accepted).collect();
    assert!(
        accepted.iter().all(|n| *n >= 1),
        "the client did not connect to every member: {accepted:?}"
    );

    proxies[0].hang_open();
    let silent_since = Instant::now();
    let mut failed_at = Vec::new();
    while silent_since.elapsed() < WATCHED_FOR {
        if store.get(&t).await.is_err() {
            failed_at.push(silent_since.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        proxies[0].accepted() > accepted[0],
        "the silent member's connection was never replaced"
    );
    drop(cluster);
    failed_at
}

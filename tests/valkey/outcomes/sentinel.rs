//! Sentinel: one unhealthy Sentinel must not hide a healthy one.

use super::*;

use crate::support::sentinel::Sentinel;

async fn acquire_through_sentinels(
    first: u16,
    second: u16,
    name: &str,
) -> Result<Reply, StoreError> {
    let store = ValkeyStore::connect(&config(format!(
        "redis-sentinel://127.0.0.1:{first}?sentinelServiceName=mymaster&node=127.0.0.1:{second}"
    )))
    .await?;
    store
        .acquire(&AcquireRequest::new(target(name), "a", TTL))
        .await
}

/// docs/valkey.md: "Every new connection asks the Sentinels for the primary";
/// the URL lists several Sentinels so that one being down does not take the
/// lease service down. A first Sentinel that accepts and never answers eats
/// the whole connect deadline: the second, healthy one is never asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_first_sentinel_does_not_hide_a_healthy_second_one() {
    let primary = ValkeyServer::start();
    let good = Sentinel::start(&primary);
    let silent = FaultProxy::silent();
    let r = acquire_through_sentinels(silent.port(), good.port, "silent-sentinel").await;
    assert!(
        matches!(&r, Ok(reply) if reply.outcome == Outcome::Acquired),
        "a healthy Sentinel and primary were reachable, got {r:?}"
    );
}

/// Same clause: a first Sentinel that still names a primary that is gone
/// (stale view, or it monitors a dead address) ends the connect with an error
/// instead of asking the next Sentinel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_naming_a_dead_primary_does_not_hide_one_naming_the_live_primary() {
    let primary = ValkeyServer::start();
    let stale = Sentinel::watching(free_port(), ""); // monitors an address nobody listens on
    let good = Sentinel::start(&primary);
    let r = acquire_through_sentinels(stale.port, good.port, "stale-sentinel").await;
    assert!(
        matches!(&r, Ok(reply) if reply.outcome == Outcome::Acquired),
        "the second Sentinel names a live primary, got {r:?}"
    );
}

/// A password-protected primary watched by Sentinels that have no password
/// of their own (the usual layout: `sentinel auth-pass` for the data nodes,
/// Sentinels open on a private network). The client sends the data password
/// to the Sentinels too (`AUTH` on every connection of the dialer), which a
/// Sentinel without a password refuses, so the deployment is unusable. There
/// is no way to give Sentinels their own credentials (or none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_without_a_password_in_front_of_a_protected_primary() {
    let primary = ValkeyServer::start_with(&["--requirepass", "s3cret"]);
    let sentinel = Sentinel::watching(primary.port, "sentinel auth-pass mymaster s3cret\n");
    let store = ValkeyStore::connect(&ValkeyConfig {
        password: Some(targetlease::store::valkey::Secret::new("s3cret")),
        ..config(format!(
            "redis-sentinel://127.0.0.1:{}?sentinelServiceName=mymaster",
            sentinel.port
        ))
    })
    .await;
    let store = match store {
        Ok(s) => s,
        Err(e) => panic!("sentinel without a password, protected primary: {e}"),
    };
    let r = store
        .acquire(&AcquireRequest::new(target("sentinel-auth"), "a", TTL))
        .await;
    assert!(
        matches!(&r, Ok(reply) if reply.outcome == Outcome::Acquired),
        "{r:?}"
    );
}

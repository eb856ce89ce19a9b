//! A replica that becomes leader while Valkey is down must still get release
//! notifications once Valkey is back: a waiter is woken by an outside release
//! long before the outside lease would have expired.

use std::time::{Duration, Instant};

use targetlease::operator::crd::Phase;
use targetlease::store::valkey::{ValkeyConfig, ValkeyStore};
use targetlease::store::{LeaseStore, Outcome, ReleaseRequest, Target};

use super::{SOON, election, is_leader, spec, start_operator};
use crate::support::kube_env::eventually;
use crate::support::operator_env::{OperatorEnv, http_get, summary};
use crate::support::resp::Resp;

/// Subscribers of the release channel, as Valkey counts them.
fn subscribers(env: &OperatorEnv) -> Option<i64> {
    let mut conn = crate::support::resp::Conn::connect(&env.valkey.addr()).ok()?;
    match conn
        .try_cmd(&["PUBSUB", "NUMSUB", "targetlease:events"])
        .ok()?
    {
        Resp::Array(Some(reply)) => reply.get(1).map(Resp::int),
        _ => None,
    }
}

#[tokio::test]
async fn a_leader_elected_while_valkey_is_down_subscribes_once_it_is_back() {
    let mut env = OperatorEnv::start_without_operator("subscribe").await;
    let flags = election(&env, "6s", "4s", "500ms");
    let a = start_operator(&mut env, &flags);
    eventually("the first replica to lead", SOON, || async {
        is_leader(&env, a).filter(|l| *l)
    })
    .await;
    let b = start_operator(&mut env, &flags);
    eventually("the standby to be ready", SOON, || async {
        http_get(env.admin_port(b), "/readyz").filter(|(c, _)| *c == 200)
    })
    .await;

    // Valkey goes down, then the leader hands over: b starts leading (and
    // subscribing) while nothing answers.
    env.valkey.kill();
    let status = env.stop_operator(a);
    assert!(status.success(), "operator exited with {status}");
    eventually("the standby to lead", SOON, || async {
        is_leader(&env, b).filter(|l| *l)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    env.valkey.restart();
    eventually(
        "the new leader to subscribe to release notifications",
        SOON,
        || async { subscribers(&env).filter(|n| *n >= 1) },
    )
    .await;

    // An outside holder (60s), a waiter, then an early release.
    let store = ValkeyStore::connect(&ValkeyConfig {
        url: env.valkey.url(),
        ..ValkeyConfig::default()
    })
    .await
    .expect("connect to the test valkey");
    let target = Target::new(&env.ns, "q");
    let outside = env
        .hold_outside(&store, &target, "cron", Duration::from_secs(60))
        .await;
    env.create("waiter", spec("q")).await;
    env.wait_reason("waiter", "TargetHeld", SOON).await;
    let released = store
        .release(&ReleaseRequest::new(
            target,
            outside.lease.unwrap().handle().unwrap(),
        ))
        .await
        .unwrap();
    assert_eq!(released.outcome, Outcome::Released);
    let woken = Instant::now();
    let held = env
        .wait_phase("waiter", Phase::Held, Duration::from_secs(5))
        .await;
    assert_eq!(summary(&held).1.as_deref(), Some("q"));
    assert!(woken.elapsed() < Duration::from_secs(5));
}

//! Handoff: two TargetLeases per target; delete the holder, time the next Held.
//! Measured twice: on an operator holding nothing else (before the scale
//! step), and on the operator still holding the last scale's leases.

use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams};
use targetlease::operator::crd::{Phase, TargetLease};

use super::objects::{contended, create_all};
use super::process::Operator;
use super::{Bench, Handoffs};
use crate::tracker::Tracker;

/// The series on an operator of its own with no other lease (its own
/// namespace; the operator is stopped afterwards).
pub(super) async fn quiet(b: &Bench<'_>) -> Handoffs {
    let ns = b.cp.namespace("handoff-quiet").await;
    let tracker = Tracker::start(&b.client, &ns);
    // Operator numbers 0.. are the scale step's; this one is apart.
    let mut op = Operator::start(&b.cp, &b.valkey, &ns, b.dir.path(), 98);
    assert!(
        op.wait_ready(Duration::from_secs(60)).await,
        "operator not ready"
    );
    eprintln!("bench: handoff with no other lease");
    let h = series(b, &ns, &tracker, 0).await;
    op.stop();
    h
}

/// The series on the operator in `ns`, which holds `background` other leases.
pub(super) async fn series(
    b: &Bench<'_>,
    ns: &str,
    tracker: &Tracker,
    background: usize,
) -> Handoffs {
    eprintln!(
        "bench: handoff, {} trials, {background} other leases",
        b.p.handoff_trials
    );
    let mut h = Handoffs {
        trials: Vec::new(),
        failures: 0,
        background,
    };
    let api: Api<TargetLease> = Api::namespaced(b.client.clone(), ns);
    let trials = b.p.handoff_trials;
    let pair = |i: usize, side: &str| {
        contended(
            &format!("handoff-{i:03}-{side}"),
            ns,
            &format!("handoff-{i:03}"),
            side,
        )
    };
    create_all(&api, (0..trials).map(|i| pair(i, "a")).collect(), 16).await;
    tracker
        .wait(Duration::from_secs(60), |t| {
            (0..trials).all(|i| {
                t.get(&format!("handoff-{i:03}-a"))
                    .is_some_and(|s| s.held())
            })
        })
        .await
        .expect("handoff holders Held");
    create_all(&api, (0..trials).map(|i| pair(i, "b")).collect(), 16).await;
    tracker
        .wait(Duration::from_secs(60), |t| {
            (0..trials).all(|i| {
                t.get(&format!("handoff-{i:03}-b"))
                    .is_some_and(|s| s.phase == Some(Phase::Pending))
            })
        })
        .await
        .expect("handoff waiters Pending");
    for i in 0..trials {
        let (a, b) = (format!("handoff-{i:03}-a"), format!("handoff-{i:03}-b"));
        let t0 = Instant::now();
        api.delete(&a, &DeleteParams::default())
            .await
            .expect("delete holder");
        match tracker
            .wait(Duration::from_secs(10), |t| {
                t.get(&b).is_some_and(|s| s.held())
            })
            .await
        {
            Some(t1) => h.trials.push(t1 - t0),
            None => h.failures += 1,
        }
        if h.failures >= 3 {
            eprintln!("bench: handoff: 3 trials timed out, stopping the series");
            break;
        }
    }
    h
}

//! Handoff: two TargetLeases per target; delete the holder, time the next Held.

use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams};
use targetlease::operator::crd::TargetLease;

use super::objects::{contended, create_all};
use super::{Bench, Results};
use crate::tracker::Tracker;

pub(super) async fn handoff(
    b: &Bench<'_>,
    ns: &str,
    tracker: &Tracker,
    n: usize,
    results: &mut Results,
) {
    // Handoff: two TargetLeases per target; delete the holder, time the next Held.
    eprintln!("bench: handoff, {} trials", b.p.handoff_trials);
    results.handoff_background = n;
    let api: Api<TargetLease> = Api::namespaced(b.client.clone(), ns);
    let firsts: Vec<_> = (0..b.p.handoff_trials)
        .map(|i| {
            contended(
                &format!("handoff-{i:03}-a"),
                ns,
                &format!("handoff-{i:03}"),
                "a",
            )
        })
        .collect();
    create_all(&api, firsts, 16).await;
    let trials = b.p.handoff_trials;
    tracker
        .wait(Duration::from_secs(60), |t| {
            (0..trials).all(|i| {
                t.get(&format!("handoff-{i:03}-a"))
                    .is_some_and(|s| s.held())
            })
        })
        .await
        .expect("handoff holders Held");
    let seconds: Vec<_> = (0..b.p.handoff_trials)
        .map(|i| {
            contended(
                &format!("handoff-{i:03}-b"),
                ns,
                &format!("handoff-{i:03}"),
                "b",
            )
        })
        .collect();
    create_all(&api, seconds, 16).await;
    tracker
        .wait(Duration::from_secs(60), |t| {
            (0..trials).all(|i| {
                t.get(&format!("handoff-{i:03}-b"))
                    .is_some_and(|s| s.phase == Some(targetlease::operator::crd::Phase::Pending))
            })
        })
        .await
        .expect("handoff waiters Pending");
    for i in 0..b.p.handoff_trials {
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
            Some(t1) => results.handoff.push(t1 - t0),
            None => results.handoff_failures += 1,
        }
        if results.handoff_failures >= 3 {
            eprintln!("bench: handoff: 3 trials timed out, stopping the series");
            break;
        }
    }
}

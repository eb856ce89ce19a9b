//! Races between whole lease lifetimes on one target: a grant decided on a
//! state that another holder's acquire and release have since moved past
//! must not reuse that holder's token.

use super::*;

/// Clients that each acquire and at once release one target, over and
/// over: every grant gets its own token, the granted tokens are exactly
/// 1..=n (each acquisition moved the counter by one, nothing else did), and
/// the next acquisition gets n + 1. A grant that trusted a counter it read
/// before another client's acquire and release (the target looks free both
/// times) would hand that client's token out again.
pub async fn acquire_release_races_never_repeat_a_token(h: &impl Harness) {
    const CLIENTS: usize = 8;
    const ATTEMPTS: usize = 30;
    let t = target("churn");
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let c = h.another_client().await;
        let t = t.clone();
        tasks.push(tokio::spawn(async move {
            let mut tokens = Vec::new();
            for _ in 0..ATTEMPTS {
                let req = AcquireRequest::new(t.clone(), format!("owner-{i}"), LONG);
                let r = c.acquire(&req).await.expect("acquire");
                match r.outcome {
                    Outcome::Acquired => {
                        let l = r.lease.unwrap();
                        tokens.push(l.fencing_token);
                        let rel = release(&*c, &t, &l).await;
                        assert_eq!(rel.outcome, Outcome::Released, "{rel:?}");
                    }
                    Outcome::Held => tokio::task::yield_now().await,
                    other => panic!("unexpected outcome {other}: {r:?}"),
                }
            }
            tokens
        }));
    }
    let mut granted = Vec::new();
    for task in tasks {
        granted.extend(task.await.unwrap());
    }
    granted.sort_unstable();
    let n = granted.len() as u64;
    assert!(
        n >= CLIENTS as u64,
        "only {n} grants: too little contention"
    );
    let repeated: Vec<u64> = granted
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    assert!(repeated.is_empty(), "tokens granted twice: {repeated:?}");
    assert_eq!(granted, (1..=n).collect::<Vec<_>>(), "tokens are dense");
    let s = h.store();
    assert_eq!(held(&*s, &t, "next", LONG).await.fencing_token, n + 1);
}

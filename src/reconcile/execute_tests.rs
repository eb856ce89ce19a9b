use super::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// An acquire or release still waiting when the gate closes is dropped
/// there (never sent later), and reported as of unknown outcome.
#[tokio::test]
async fn a_gated_call_ends_when_the_gate_closes() {
    let gate = Leadership::elected();
    let never = async { Ok(unreachable_reply()) };
    assert_eq!(
        gated(&gate, never).await.err(),
        Some(NotLeader),
        "closed: not even started"
    );

    gate.lead_until(Instant::now() + Duration::from_millis(200));
    let sent = Arc::new(AtomicBool::new(false));
    let flag = sent.clone();
    let slow = async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        flag.store(true, Ordering::SeqCst);
        Ok(unreachable_reply())
    };
    let started = Instant::now();
    let reply = gated(&gate, slow).await.unwrap();
    assert!(
        matches!(reply, Err(StoreError::OutcomeUnknown(_))),
        "{reply:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!sent.load(Ordering::SeqCst), "dropped, not left running");

    let always = Leadership::always();
    let quick = async { Ok(unreachable_reply()) };
    assert!(gated(&always, quick).await.unwrap().is_ok());
}

fn unreachable_reply() -> Reply {
    Reply {
        outcome: crate::store::Outcome::Released,
        lease: None,
        server_time_ms: 0,
        message: String::new(),
    }
}

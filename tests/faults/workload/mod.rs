//! What runs against the system while faults are injected: lease clients
//! (library and CLI), an observer, a holder process that gets paused, and the
//! operator with TargetLeases and an election. Everything they see goes into
//! the [`Recorder`](crate::history::Recorder).

pub mod cli;
pub mod client;
pub mod holder;
pub mod lag;
pub mod observer;
pub mod operator;
pub mod revoker;
pub mod watch;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use targetlease::store::{Lease, Reply, StoreError, Target};

use crate::history::{Answer, LeaseView, OpKind, OpRecord, now_ms};

/// The failover's lag-window holder (`lag.rs`): not a part judged for
/// recovery (it acts only around failovers), and its lease is never revoked.
pub const LAG_HOLDER: &str = "lagholder";

/// A call without an answer this long (its deadline is 500 ms; the CLI is cut off sooner) is a hang:
/// recorded, and the run fails.
pub const HANG: std::time::Duration = std::time::Duration::from_secs(30);

/// Tells every workload task to finish its current step and stop.
#[derive(Clone, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    pub fn set(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Sleeps up to `d`, waking early once stopped; true when stopped.
    pub async fn sleep(&self, d: std::time::Duration) -> bool {
        let end = tokio::time::Instant::now() + d;
        while tokio::time::Instant::now() < end {
            if self.is_set() {
                return true;
            }
            let left = end - tokio::time::Instant::now();
            tokio::time::sleep(left.min(std::time::Duration::from_millis(50))).await;
        }
        self.is_set()
    }
}

/// The lease as the history keeps it: who asked for it is the request id the
/// workload put in the metadata (`req`), or the operator's acquisition id.
pub fn view_of(l: &Lease) -> LeaseView {
    let meta = |k: &str| {
        l.metadata
            .as_ref()
            .and_then(|m| m.get(k))
            .and_then(|v| v.as_str())
            .map(String::from)
    };
    LeaseView {
        owner: l.owner.clone(),
        token: l.fencing_token,
        issue: meta("req")
            .or_else(|| meta("acquisition"))
            .or_else(|| l.lease_id.clone())
            .unwrap_or_default(),
        acquired_at_ms: l.acquired_at_ms,
        expires_at_ms: l.expires_at_ms,
    }
}

/// The record of one attempt at `kind` by `client`, invoked at `invoke_ms`
/// and completed now with `result`; `issue` names the lease acted on.
#[allow(clippy::too_many_arguments)]
pub fn op_record(
    client: &str,
    kind: OpKind,
    target: &Target,
    request_id: &str,
    token: Option<u64>,
    issue: Option<&str>,
    invoke_ms: u64,
    result: &Result<Reply, StoreError>,
) -> OpRecord {
    let (answer, lease, server_ms) = answer_of(result);
    OpRecord {
        client: client.to_string(),
        kind,
        target: target.name.clone(),
        request_id: request_id.to_string(),
        invoke_ms,
        complete_ms: now_ms(),
        answer,
        lease,
        token,
        server_ms,
        issue: issue.map(String::from),
        detail: detail_of(result),
    }
}

/// The first words of a failure's message (`BUSY`, `OOM`, …), for the
/// fault's verified effect; empty for a reply.
pub fn detail_of<T>(r: &Result<T, StoreError>) -> String {
    let msg = match r {
        Ok(_) => return String::new(),
        Err(StoreError::BackendUnavailable(m) | StoreError::OutcomeUnknown(m)) => m,
        Err(StoreError::Invalid(m)) => m,
    };
    msg.chars().take(80).collect()
}

/// What the caller was told, the lease it carried, and the server's clock.
pub fn answer_of(r: &Result<Reply, StoreError>) -> (Answer, Option<LeaseView>, u64) {
    match r {
        Ok(rep) => (
            Answer::Said(rep.outcome.as_str().to_string()),
            rep.lease.as_ref().map(view_of),
            rep.server_time_ms,
        ),
        Err(StoreError::BackendUnavailable(_)) => (Answer::Unavailable, None, 0),
        Err(StoreError::OutcomeUnknown(_)) => (Answer::Unknown, None, 0),
        // Nothing was sent: a harness bug, recorded as a refusal so it shows.
        Err(StoreError::Invalid(msg)) => (Answer::Said(format!("invalid: {msg}")), None, 0),
    }
}

//! An administrator: every so often it reads a target's live lease and
//! revokes exactly that lease (`revoke` with its token), retrying an
//! `outcome_unknown` with the same request id. Its revokes are judged like
//! every other operation (a `revoked` must have ended the lease, a
//! `not_owner`/`not_found` must have changed nothing), and the holders it
//! cuts short must notice (the operator must withdraw `Held`).

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use targetlease::store::{LeaseStore, Outcome, RevokeRequest, StoreError, Target, new_request_id};

use super::{HANG, Stop, op_record, view_of};
use crate::history::{OpKind, Recorder, now_ms};

/// Attempts per revoke while its outcome is unknown.
const ATTEMPTS: usize = 4;

/// Revokes a live lease of one of `targets` about every `every`.
pub async fn run(
    store: Arc<dyn LeaseStore>,
    targets: Vec<Target>,
    every: Duration,
    rec: Recorder,
    stop: Stop,
) {
    let name = "revoker";
    loop {
        let jitter = rand::rng().random_range(0..every.as_millis() as u64 / 2 + 1);
        if stop.sleep(every + Duration::from_millis(jitter)).await {
            return;
        }
        let t = targets[rand::rng().random_range(0..targets.len())].clone();
        let Ok(Ok(seen)) = tokio::time::timeout(HANG, store.get(&t)).await else {
            continue;
        };
        let Some(lease) = seen.lease.filter(|_| seen.outcome == Outcome::Found) else {
            continue;
        };
        // The lag-window holder's lease must live into the failover (lag.rs).
        if lease.owner == super::LAG_HOLDER {
            continue;
        }
        let view = view_of(&lease);
        let mut req = RevokeRequest::new(t.clone());
        req.token = Some(lease.fencing_token);
        req.request_id = new_request_id();
        for attempt in 1..=ATTEMPTS {
            let invoke_ms = now_ms();
            let result = match tokio::time::timeout(HANG, store.revoke(&req)).await {
                Ok(r) => r,
                Err(_) => {
                    rec.hang(format!("{name}: a revoke invoked at {invoke_ms} hung"));
                    Err(StoreError::OutcomeUnknown("harness: no answer".into()))
                }
            };
            rec.op(op_record(
                name,
                OpKind::Revoke,
                &t,
                &req.request_id,
                Some(lease.fencing_token),
                Some(&view.issue),
                invoke_ms,
                &result,
            ));
            if !matches!(result, Err(StoreError::OutcomeUnknown(_))) || attempt == ATTEMPTS {
                break;
            }
            if stop
                .sleep(Duration::from_millis(100 * attempt as u64))
                .await
            {
                break;
            }
        }
    }
}

//! Reads every target's live lease (`get`, no lease id) and its fenced-commit
//! value every few tens of milliseconds, on a connection of its own straight
//! to the server (never through a faulty proxy): these observations let the
//! checker see what operations did, whatever their callers were told.

use std::sync::Arc;
use std::time::Duration;

use targetlease::store::{LeaseStore, Outcome, Target};

use super::client::COMMIT_KEY;
use super::{HANG, Stop, view_of};
use crate::history::{ReadRecord, Recorder, Sighting, now_ms};

/// Observes `targets`; `commits` says whether they carry the workload's
/// fenced-commit key (the operator's targets do not).
pub async fn run(
    store: Arc<dyn LeaseStore>,
    targets: Vec<(Target, bool)>,
    rec: Recorder,
    stop: Stop,
) {
    while !stop.is_set() {
        for (t, commits) in &targets {
            let invoke_ms = now_ms();
            let Ok(reply) = tokio::time::timeout(HANG, store.get(t)).await else {
                rec.hang(format!(
                    "observer: get {} had no answer after {HANG:?}",
                    t.name
                ));
                continue;
            };
            if let Ok(reply) = reply
                && matches!(reply.outcome, Outcome::Found | Outcome::NotFound)
            {
                rec.sighting(Sighting {
                    target: t.name.clone(),
                    at_ms: now_ms(),
                    lease: reply.lease.as_ref().map(view_of),
                    invoke_ms,
                    server_ms: reply.server_time_ms,
                });
            }
            if !commits {
                continue;
            }
            let invoke_ms = now_ms();
            let Ok(read) = tokio::time::timeout(HANG, store.read(t, COMMIT_KEY)).await else {
                rec.hang(format!(
                    "observer: read {} had no answer after {HANG:?}",
                    t.name
                ));
                continue;
            };
            if let Ok(read) = read
                && matches!(read.outcome, Outcome::Found | Outcome::NotFound)
            {
                rec.read(ReadRecord {
                    resource: t.name.clone(),
                    invoke_ms,
                    complete_ms: now_ms(),
                    server_ms: read.server_time_ms,
                    committed: read.committed.map(|c| (c.fencing_token, c.value)),
                });
            }
        }
        stop.sleep(Duration::from_millis(30)).await;
    }
}

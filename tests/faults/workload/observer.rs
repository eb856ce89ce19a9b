//! Reads every target's live lease (`get`, no lease id) every few tens of
//! milliseconds: these sightings let the checker see effects of operations
//! their callers were told did not happen.

use std::sync::Arc;
use std::time::Duration;

use targetlease::store::{LeaseStore, Outcome, Target};

use super::{HANG, Stop, view_of};
use crate::history::{Recorder, Sighting, now_ms};

pub async fn run(store: Arc<dyn LeaseStore>, targets: Vec<Target>, rec: Recorder, stop: Stop) {
    while !stop.is_set() {
        for t in &targets {
            let Ok(reply) = tokio::time::timeout(HANG, store.get(t)).await else {
                rec.hang(format!(
                    "observer: get {} had no answer after {HANG:?}",
                    t.name
                ));
                continue;
            };
            if let Ok(reply) = reply
                && reply.outcome == Outcome::Found
                && let Some(lease) = &reply.lease
            {
                rec.sighting(Sighting {
                    target: t.name.clone(),
                    at_ms: now_ms(),
                    lease: view_of(lease),
                });
            }
        }
        stop.sleep(Duration::from_millis(50)).await;
    }
}

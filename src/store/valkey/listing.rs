//! `list`: every target key under a SCAN pattern, on every primary, each
//! read through the get script; targets without a lease record are left out.

use futures::{StreamExt, TryStreamExt};
use tokio::time::Instant;

use super::ValkeyStore;
use super::errors::{Effect, unanswered};
use crate::store::{LeaseStore, Listed, Outcome, Reply, StoreError, Target};

/// Gets in flight at once while listing.
const IN_FLIGHT: usize = 32;

/// The lease records of `namespace` (all when `None`) whose targets start
/// with `target_prefix`, sorted, each read like `get`.
pub(super) async fn list(
    store: &ValkeyStore,
    namespace: Option<&str>,
    target_prefix: &str,
) -> Result<Vec<Listed>, StoreError> {
    if let Some(ns) = namespace {
        crate::store::check_name("namespace", ns)?;
    }
    let pattern = store.keys.target_pattern(namespace, target_prefix);
    let deadline = Instant::now() + store.timeout;
    let keys = store
        .client
        .scan_primaries(&pattern, deadline)
        .await
        .map_err(|e| unanswered(e, Effect::Read, store.timeout))?;
    let mut targets: Vec<Target> = keys
        .iter()
        .filter_map(|k| store.keys.target_of_key(k))
        .filter(|t| namespace.is_none_or(|n| t.namespace == n))
        .filter(|t| t.name.starts_with(target_prefix))
        .collect();
    targets.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    targets.dedup();
    // Reads go out together (pipelined on the store's connections, a
    // bounded number in flight), answers kept in order.
    futures::stream::iter(targets)
        .map(|target| async move {
            // No request can write a record under an invalid name: it is
            // not understood, so not read (get would refuse the name).
            if let Err(StoreError::Invalid(why)) = target.validate() {
                let reply = Reply {
                    outcome: Outcome::CorruptState,
                    lease: None,
                    server_time_ms: 0,
                    message: format!("the record's key names no valid target ({why})"),
                };
                return Ok(Some(Listed { target, reply }));
            }
            // Every target ever used keeps its key (its fence counter):
            // one without a lease record is not listed.
            let reply = store.get(&target).await?;
            Ok((reply.outcome != Outcome::NotFound).then(|| Listed::from_get(target, reply)))
        })
        .buffered(IN_FLIGHT)
        .try_filter_map(|listed| async move { Ok(listed) })
        .try_collect()
        .await
}

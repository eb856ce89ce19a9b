//! Floors of targets nobody uses any more are folded into their namespace's
//! base (`--floor-retention`): a namespace's floors shrink to what was
//! deleted recently, and no token can repeat (the base is at least every
//! folded floor).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;

use crate::operator::floor::{FloorPolicy, floor_key};
use crate::operator::reconcile::Context;

/// How often the floors are looked at: an eighth of the retention, between
/// one second and one hour (an entry is folded at most that late).
pub fn period(policy: FloorPolicy) -> Duration {
    (policy.retention / 8).clamp(Duration::from_secs(1), Duration::from_secs(3600))
}

/// Every [`period`]: [`once`], for as long as the controller runs.
pub async fn expire_floors(ctx: Arc<Context>, policy: FloorPolicy) {
    loop {
        tokio::time::sleep(period(policy)).await;
        once(&ctx).await;
    }
}

/// Folds every floor raised a retention ago or earlier whose target no
/// TargetLease names (a target in use keeps its entry: folding it would
/// only make the namespace's other targets jump). Nothing before the caches
/// synced or while this replica cannot prove it leads.
pub async fn once(ctx: &Context) {
    if !ctx.ready.is_ready() || ctx.leadership.check().is_err() {
        return;
    }
    let in_use: HashSet<(String, String)> = ctx
        .leases
        .state()
        .iter()
        .map(|tl| {
            let ns = tl.namespace().unwrap_or_default();
            let key = floor_key(&ns, &tl.spec.target);
            (ns, key)
        })
        .collect();
    match ctx.floors.expire(&in_use).await {
        Ok(folds) => {
            for (ns, fold) in folds {
                tracing::info!(
                    namespace = %ns,
                    folded = fold.folded,
                    kept = fold.kept,
                    base = fold.base,
                    "folded the token floors of targets unused for the retention into the namespace's base"
                );
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot fold expired token floors; trying again later")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_is_an_eighth_of_the_retention_within_bounds() {
        let at = |secs| {
            period(FloorPolicy {
                max_entries: 1,
                retention: Duration::from_secs(secs),
            })
        };
        assert_eq!(at(30 * 86_400), Duration::from_secs(3600));
        assert_eq!(at(80), Duration::from_secs(10));
        assert_eq!(at(2), Duration::from_secs(1));
    }
}

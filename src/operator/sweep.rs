//! The minute sweep of what no reconcile will clean up: marks of TargetLeases
//! that are gone, what this process remembers of them (their compiled
//! selectors too), and floor raises the floor cache shows.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;

use crate::operator::reconcile::name::NsName;
use crate::operator::reconcile::{self, Context};

/// Things judged gone: missing now and at the sweep before (`missing`), so a
/// cache that lags behind a new object never costs it. Returns them and what
/// is missing now (the next sweep's `missing`). No client required.
pub fn gone<T: Clone + Eq + Hash>(
    now_missing: impl IntoIterator<Item = T>,
    missing: &HashSet<T>,
) -> (HashSet<T>, HashSet<T>) {
    let now: HashSet<T> = now_missing.into_iter().collect();
    let gone = now.intersection(missing).cloned().collect();
    (gone, now)
}

/// How often the sweep runs.
pub const EVERY: Duration = Duration::from_secs(60);

/// Every [`EVERY`]: [`Sweep::once`], for as long as the controller runs.
pub async fn sweep(ctx: Arc<Context>) {
    let mut sweep = Sweep::default();
    loop {
        tokio::time::sleep(EVERY).await;
        sweep.once(&ctx).await;
    }
}

/// What one sweep leaves the next: what was missing from the caches.
#[derive(Default)]
pub struct Sweep {
    suspects: HashSet<(String, String, String)>,
    missing: HashSet<NsName>,
}

impl Sweep {
    /// What the sweep judges from one snapshot of the caches, dropped
    /// before anything is sent: forgets the TargetLeases gone, and returns
    /// the marks to remove as (namespace, pod, TargetLease); `None` once
    /// this replica cannot prove it leads.
    fn judge(&mut self, ctx: &Context) -> Option<HashSet<(String, String, String)>> {
        // Borrowed from one snapshot of the cache: a sweep of 10,000
        // TargetLeases copies no name, UID or key to look them up.
        let cached = ctx.leases.state();
        let uids: HashSet<&str> = cached
            .iter()
            .filter_map(|tl| tl.metadata.uid.as_deref())
            .collect();
        ctx.selectors.retain(|uid| uids.contains(uid));
        if ctx.leadership.check().is_err() {
            return None;
        }
        let leases: HashSet<(&str, &str)> = cached
            .iter()
            .map(|tl| {
                let ns = tl.metadata.namespace.as_deref().unwrap_or_default();
                (ns, tl.metadata.name.as_deref().unwrap_or_default())
            })
            .collect();
        let present = |k: &NsName| leases.contains(&(k.namespace(), k.name()));
        let unseen: Vec<_> = {
            let carryover = ctx.carryover.lock().unwrap_or_else(|p| p.into_inner());
            carryover.keys().filter(|k| !present(k)).cloned().collect()
        };
        let unseen = unseen
            .into_iter()
            .chain(ctx.keeper.keys_where(|k| !present(k)));
        let (vanished, now) = gone(unseen, &self.missing);
        ctx.forget_vanished(|k| !vanished.contains(k));
        ctx.keeper.retain(|k| !vanished.contains(k));
        self.missing = now;

        let mut marked = Vec::new();
        for pod in ctx.pods.store.state() {
            let ns = pod.namespace().unwrap_or_default();
            for name in reconcile::marks::marked_by(&pod) {
                if !leases.contains(&(ns.as_str(), name.as_str())) {
                    marked.push((ns.clone(), pod.name_any(), name));
                }
            }
        }
        let (orphans, now) = gone(marked, &self.suspects);
        self.suspects = now;
        Some(orphans)
    }

    /// Removes marks whose TargetLease is gone (a finalizer removed by hand,
    /// a crash between the status write of a deletion and its unmark),
    /// forgets what this process remembered of such TargetLeases (the keeper
    /// stops renewing their leases, which then run out), forgets the
    /// floor raises the floor cache shows, and the names no map holds. Something is judged gone once it
    /// has been missing from the synced cache at two sweeps in a row
    /// ([`gone`]); a pod is unmarked only if it is still the version the
    /// sweep judged (its resourceVersion is the patch's precondition).
    /// Nothing before the caches synced, and nothing but the floor raises
    /// once this replica cannot prove it leads.
    pub async fn once(&mut self, ctx: &Context) {
        if !ctx.ready.is_ready() {
            // Caches that never sync still see TargetLeases come and go.
            NsName::forget_unused();
            return;
        }
        ctx.floors.prune();
        let orphans = self.judge(ctx);
        // The names of what was just forgotten, and of whatever else no map
        // holds any more (see `NsName`).
        NsName::forget_unused();
        let Some(orphans) = orphans else {
            return;
        };
        for (ns, pod, name) in orphans {
            if ctx.leadership.check().is_err() {
                break;
            }
            let Some(cached) = ctx.pods.get(&ns, &pod) else {
                continue;
            };
            match reconcile::marks::unmark_unchanged(&ctx.client, &ns, &name, &cached).await {
                Ok(true) => {
                    tracing::info!(namespace = %ns, pod = %pod, lease = %name, "removed the marks of a TargetLease that no longer exists")
                }
                Ok(false) => {
                    tracing::debug!(namespace = %ns, pod = %pod, "the pod changed; looking again at the next sweep")
                }
                Err(e) => tracing::warn!(error = %e, "cannot remove orphaned marks"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_two_sweeps_missed_in_a_row_is_gone() {
        let (gone1, missing) = gone(["a", "b"], &HashSet::new());
        assert!(gone1.is_empty(), "the cache may lag behind a new object");
        let (gone2, missing) = gone(["b", "c"], &missing);
        assert_eq!(gone2, HashSet::from(["b"]));
        let (gone3, _) = gone(["c"], &missing);
        assert_eq!(gone3, HashSet::from(["c"]));
    }
}

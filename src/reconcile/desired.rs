//! Who should hold the lease, as the executor asks it each step: the pure
//! answer from the caches ([`pods::desired_holder`]), and for an election
//! nobody qualifies for, why (from the API server: the pod cache keeps no
//! labels of pods that opted in to nothing).

use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::pass::Pass;
use super::plan::Desired;
use super::pods::{self, CachedPod};
use super::spec::Holders;
use crate::conditions::Reason;

/// How long why-nobody-is-elected, listed from the API server, is reused.
const NOBODY_RELIST: Duration = Duration::from_secs(10);

impl Pass<'_> {
    /// Who should hold the lease (nobody, for an invalid spec).
    pub(super) async fn desired(&self) -> Desired {
        let valid = match &self.spec {
            Ok(valid) => valid,
            Err(message) => {
                return Desired::Nobody {
                    reason: Reason::InvalidSpec,
                    message: message.clone(),
                };
            }
        };
        let desired = pods::desired_holder(&self.tl, valid, &self.ctx.pods);
        match (&valid.holders, &desired) {
            (
                Holders::Elected(selector),
                Desired::Nobody {
                    reason: Reason::NoReadyCandidate,
                    ..
                },
            ) => self.nobody_elected(selector).await.unwrap_or(desired),
            _ => desired,
        }
    }

    /// Why nobody qualifies for this election, from the pods its selector
    /// matches as the API server lists them (the cache keeps no labels of pods
    /// that opted in to nothing). Listed at most once per
    /// [`NOBODY_RELIST`] and generation; `None` when the list fails.
    async fn nobody_elected(&self, selector: &kube::core::Selector) -> Option<Desired> {
        let generation = self.tl.metadata.generation;
        if let Some((at, g, d)) = self.ctx.recall(&self.key).nobody
            && g == generation
            && at.elapsed() < NOBODY_RELIST
        {
            return Some(d);
        }
        let ns = self.tl.namespace()?;
        let api: Api<CachedPod> = Api::namespaced(self.ctx.client.clone(), &ns);
        let params = ListParams::default().labels(&selector.to_string());
        let listed = match api.list(&params).await {
            Ok(list) => list.items,
            Err(e) => {
                tracing::debug!(error = %e, "listing an election's pods failed");
                return None;
            }
        };
        let d = pods::nobody_elected(&self.tl.name_any(), selector, &listed);
        let kept = d.clone();
        self.ctx.remember(&self.key, |m| {
            m.nobody = Some((Instant::now(), generation, kept))
        });
        Some(d)
    }
}

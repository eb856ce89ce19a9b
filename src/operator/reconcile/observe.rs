//! What a pass reads to plan, and never writes: who should hold the lease
//! (the pure answer from the pod cache, [`pods::desired_holder`], and for an
//! election nobody qualifies for, why: one page listed from the API server,
//! since the pod cache keeps no labels of pods that opted in to nothing);
//! the object's published status and the spec's timing; what the keeper last
//! confirmed with the store; and the other TargetLeases on the target (queue,
//! Held elsewhere, token floor). The plan decides from these
//! ([`plan::Observed`]).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::ListParams;
use kube::core::{ObjectList, Request};
use serde::Deserialize;

use super::keeper::Confirmation;
use super::pass::Pass;
use super::plan::{self, Desired, timing};
use super::spec::Holders;
use super::transition::{self, Facts};
use super::{FINALIZER, pods, spec};
use crate::operator::cache::LIST_PAGE;
use crate::operator::conditions::Reason;
use crate::operator::crd::TargetLeaseStatus;
use crate::store::Target;

/// How long why-nobody-is-elected, listed from the API server, is reused
/// (a failed list too: it is not asked again sooner).
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
            ) => self.nobody_elected(selector, desired).await,
            _ => desired,
        }
    }

    /// Why nobody qualifies for this election: the pods its selector matches
    /// that did not opt in, as the first page of the API server's list shows
    /// them (the cache keeps no labels of pods that opted in to nothing),
    /// Ready by the cache. Asked at
    /// most once per [`NOBODY_RELIST`] and generation; `cached` (the answer
    /// from the cache) when the list fails.
    async fn nobody_elected(&self, selector: &kube::core::Selector, cached: Desired) -> Desired {
        let generation = self.tl.metadata.generation;
        if let Some((at, g, d)) = self.ctx.recall(&self.key).nobody
            && g == generation
            && at.elapsed() < NOBODY_RELIST
        {
            return d;
        }
        let d = self.ask_why(selector).await.unwrap_or(cached);
        let kept = d.clone();
        self.ctx.remember(&self.key, |m| {
            m.nobody = Some((Instant::now(), generation, kept))
        });
        d
    }

    async fn ask_why(&self, selector: &kube::core::Selector) -> Option<Desired> {
        let (ns, name) = (self.tl.namespace()?, self.tl.name_any());
        let opt_in = pods::opt_in_label(&name);
        let ready = |n: &String| {
            self.ctx
                .pods
                .get(&ns, n)
                .is_some_and(|p| pods::is_ready(&p))
        };
        let listed = |also: String| first_page(&self.ctx.client, &ns, selector, also);
        let not_opted = match listed(format!("{opt_in}!=true")).await {
            Ok(page) => pods::NotOptedIn {
                listed: page.names.len(),
                ready: page.names.into_iter().filter(ready).collect(),
                rest: page.rest,
            },
            Err(e) => {
                tracing::debug!(error = %e, "listing an election's pods failed");
                return None;
            }
        };
        // Opted in, but with more labels than the cache keeps (so it cannot
        // tell whether the selector matches): asked only when the cache
        // holds such a pod.
        let dropped: Vec<String> = self
            .ctx
            .pods
            .opted_in(&ns, &name)
            .iter()
            .filter(|p| p.labels_dropped && pods::is_ready(p))
            .map(|p| p.name_any())
            .collect();
        let mut too_big = Vec::new();
        if not_opted.ready.is_empty() && !dropped.is_empty() {
            match listed(format!("{opt_in}=true")).await {
                Ok(page) => {
                    too_big = page
                        .names
                        .into_iter()
                        .filter(|n| dropped.contains(n))
                        .collect()
                }
                Err(e) => tracing::debug!(error = %e, "listing an election's pods failed"),
            }
        }
        Some(pods::nobody_elected(&name, not_opted, too_big))
    }

    pub(super) fn deleting(&self) -> bool {
        self.tl.metadata.deletion_timestamp.is_some()
    }

    pub(super) fn has_finalizer(&self) -> bool {
        self.tl.finalizers().iter().any(|f| f == FINALIZER)
    }

    pub(super) fn published(&self) -> TargetLeaseStatus {
        self.tl.status.clone().unwrap_or_default()
    }

    pub(super) fn facts(&self) -> Facts {
        let ns = self.tl.namespace().unwrap_or_default();
        Facts {
            generation: self.tl.metadata.generation,
            // Whole seconds, what the API server keeps: a status read back
            // equals the one written (no write repeats one just made).
            now: Time(Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_default()),
            server_now_ms: self.ctx.server_now_ms(),
            me: format!("{ns}/{}", self.tl.name_any()),
            deleting: self.deleting(),
            renew_interval: self.renew_interval(),
            expiry_margin: plan::expiry_margin(self.renew_interval()),
            confirmed: self.confirmation().map(|c| transition::Confirmed {
                sent_ms: self.ctx.clock.at(c.at).unwrap_or(0),
                expires_ms: c.expires_ms,
            }),
        }
    }

    /// What Valkey last confirmed to this process of the lease status names.
    pub(super) fn confirmation(&self) -> Option<Confirmation> {
        let token = self.working.fencing_token?;
        self.ctx
            .keeper
            .confirmation(&self.key)
            .filter(|c| c.token == token)
    }

    pub(super) fn renew_interval(&self) -> Duration {
        self.spec
            .as_ref()
            .map_or(Duration::from_secs(30), |s| s.timing.renew)
    }

    /// The acquisition in effect: recorded in status, or — for a resource that
    /// never published a token — the implicit first one, derived from its UID
    /// (stable across crashes, so the acquire needs no status write first).
    pub(super) fn acquisition(&self) -> Option<String> {
        let w = &self.working;
        if w.acquisition_id.is_some() {
            return w.acquisition_id.clone();
        }
        let fresh = w.fencing_token.is_none()
            && w.releasing_acquisition_id.is_none()
            && !self.ctx.recall(&self.key).first_acquisition_spent;
        fresh
            .then(|| self.tl.uid().map(|uid| format!("first-{uid}")))
            .flatten()
    }

    /// What the timing of the lease status names depends on, as observed
    /// now (`None`: the spec is invalid).
    pub(super) fn lease_timing(&self) -> Option<timing::LeaseTiming> {
        let spec = self.spec.as_ref().ok()?;
        let confirmation = self.confirmation();
        Some(timing::LeaseTiming {
            renew: spec.timing.renew,
            max_lifetime: spec.timing.max_lifetime,
            server_now_ms: self.ctx.server_now_ms(),
            confirmed_ago: confirmation.as_ref().map(|c| c.at.elapsed()),
            enforced_end_ms: confirmation.and_then(|c| c.max_expires_ms),
            acquired_ms: self
                .working
                .acquired_at
                .as_ref()
                .map(|t| t.0.as_millisecond().max(0) as u64),
        })
    }

    /// A renewal is due ([`timing::renew_due`]).
    pub(super) fn renew_due(&self) -> bool {
        let published_ok = transition::published_left(&self.facts(), &self.working).is_some();
        timing::renew_due(
            self.lease_timing().as_ref(),
            self.ctx.recall(&self.key).confirm,
            published_ok,
        )
    }

    /// The lease's hard end is within one renew interval ([`timing::rotation_due`]).
    pub(super) fn rotation_due(&self) -> bool {
        timing::rotation_due(self.lease_timing().as_ref())
    }

    /// The target, in the store's terms.
    pub(super) fn target(&self) -> Target {
        Target::new(
            self.tl.namespace().unwrap_or_default(),
            self.tl.spec.target.clone(),
        )
    }

    pub(super) fn queued_behind(&self) -> Option<String> {
        let pods = &self.ctx.pods;
        // Read before the pods `wants` reads: an answer is kept under it.
        let epoch = pods.epoch(&self.tl.namespace().unwrap_or_default());
        self.ctx
            .lease_index
            .queued_behind(&self.ctx.leases, &self.tl, epoch, |other| {
                spec::validate(other).is_ok_and(|v| pods::qualifies(other, &v, pods))
            })
    }

    /// Another TargetLease on the target still published as Held, its
    /// expiry not passed by the store's clock (see [`Observed::held_elsewhere`]).
    pub(super) fn held_elsewhere(&self) -> Option<plan::HeldElsewhere> {
        let now_ms = self.ctx.server_now_ms();
        let me = self.tl.name_any();
        self.siblings()
            .held
            .iter()
            .find(|(name, expires)| **name != *me && *expires > now_ms)
            .map(|(name, expires)| plan::HeldElsewhere {
                name: name.to_string(),
                recheck: plan::retry_after_held(*expires, now_ms),
            })
    }

    /// What the TargetLeases on this target publish (from the index).
    pub(super) fn siblings(&self) -> std::sync::Arc<super::index::Published> {
        let ns = self.tl.namespace().unwrap_or_default();
        self.ctx
            .lease_index
            .published(&self.ctx.leases, &ns, &self.tl.spec.target)
    }

    /// The token every new acquisition must exceed: the highest published for
    /// the target (statuses in the cache, this process's own writes) or kept
    /// by the floor for deleted leases.
    pub(super) fn token_floor(&self) -> u64 {
        let ns = self.tl.namespace().unwrap_or_default();
        let target = &self.tl.spec.target;
        let own = self
            .ctx
            .published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&super::name::NsName::new(&ns, target))
            .copied();
        super::floor::token_floor(
            self.siblings().max_token,
            own,
            self.working.fencing_token,
            self.ctx.floors.get(&ns, target),
        )
    }
}

/// A pod of a metadata list, decoded to its name alone (labels and
/// annotations are skipped unread).
#[derive(Clone, Deserialize)]
struct Named {
    metadata: Name,
}

#[derive(Clone, Deserialize)]
struct Name {
    #[serde(default)]
    name: String,
}

/// The first page of a list of pods: its names, and how many pods follow.
struct Page {
    names: Vec<String>,
    rest: pods::Rest,
}

/// The first [`LIST_PAGE`] pods of `ns` that `selector` and `also` match,
/// by name: the API server filters and sends metadata only (no spec, no
/// status). One request, however many pods match: the reason names only a
/// few, and counts the rest from the list's `remainingItemCount` when the
/// server gives it (it does not for a label-selected list, so far).
async fn first_page(
    client: &kube::Client,
    ns: &str,
    selector: &kube::core::Selector,
    also: String,
) -> Result<Page, kube::Error> {
    let page: ObjectList<Named> = client
        .request(first_page_request(ns, selector, also)?)
        .await?;
    let more = page
        .metadata
        .continue_
        .as_ref()
        .is_some_and(|token| !token.is_empty());
    let rest = match (more, page.metadata.remaining_item_count) {
        (false, _) => pods::Rest::None,
        (true, Some(n)) if n > 0 => pods::Rest::Counted(n as u64),
        (true, _) => pods::Rest::Uncounted,
    };
    Ok(Page {
        names: page.items.into_iter().map(|p| p.metadata.name).collect(),
        rest,
    })
}

/// The request for [`first_page`]: a metadata list, filtered, one page.
fn first_page_request(
    ns: &str,
    selector: &kube::core::Selector,
    also: String,
) -> Result<http::Request<Vec<u8>>, kube::Error> {
    let labels = [selector.to_string(), also]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(",");
    let params = ListParams::default().labels(&labels).limit(LIST_PAGE);
    Request::new(<Pod as kube::Resource>::url_path(&(), Some(ns)))
        .list_metadata(&params)
        .map_err(kube::Error::BuildRequest)
}

#[cfg(test)]
mod tests;

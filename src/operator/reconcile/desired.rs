//! Who should hold the lease, as the executor asks it each step: the pure
//! answer from the caches ([`pods::desired_holder`]), and for an election
//! nobody qualifies for, why (from the API server: the pod cache keeps no
//! labels of pods that opted in to nothing).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::ListParams;
use kube::core::{ObjectList, Request};
use serde::Deserialize;

use super::pass::Pass;
use super::plan::Desired;
use super::pods;
use super::spec::Holders;
use crate::operator::cache::LIST_PAGE;
use crate::operator::conditions::Reason;

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

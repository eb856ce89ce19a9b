//! The executor: performs what the plan and its transitions decided, and
//! nothing else — Kubernetes writes (finalizer, pod marks, status, Events,
//! the token floor) and store calls (acquire, renew, release, one read).
//!
//! THE fixed order. A step publishes first whatever its store call depends
//! on (a recorded acquisition before its acquire; the withdrawal of Held,
//! marks and status, before a release; at deletion, the token floor over the
//! last published token before anything is given back:
//! [`publish::before_store_call`], [`publish::floor_first`]), then makes its
//! one store call, then publishes its transition: unmark the pods the new status
//! does not name → write status (conditional on the version planned from) →
//! mark the pod it names (before status instead when its expiry moves
//! earlier: a mark never shows a later expiry than status) → Events →
//! wake-ups ([`publish::order`]).
//!
//! Leadership: every Kubernetes write passes the client's write gate
//! (`election::write_gate`; its refusal is [`Error::NotLeader`]), every
//! store call that takes or gives a lease passes [`gated`]; no write here
//! checks it again. (`flush` asks the gate one thing besides: whether to
//! tell the keeper what it is about to publish, which a replica that may
//! not write must not.)

use std::time::{Duration, Instant};

use crate::operator::events::Event;
use kube::api::{Patch, PatchParams};
use kube::{Resource, ResourceExt};

use super::name::NsName;
use super::pass::Pass;
use super::plan;
use super::plan::publish::{self, Write};
use super::spec;
use super::transition::{self, META_ACQUISITION, META_TARGETLEASE, Note};
use super::{Error, FIELD_MANAGER, FINALIZER, floor, marks};
use crate::operator::crd::TargetLease;
use crate::operator::leadership::{Leadership, NotLeader};
use crate::store::{
    AcquireRequest, LeaseHandle, LeaseStore, ReleaseRequest, RenewRequest, Reply, StoreError,
};

impl Pass<'_> {
    /// Adds the finalizer (JSON patch, conditional on the list it saw).
    pub(super) async fn ensure_finalizer(&mut self) -> Result<(), Error> {
        if self.has_finalizer() {
            return Ok(());
        }
        let finalizers = self.tl.finalizers().to_vec();
        let ops = if finalizers.is_empty() {
            serde_json::json!([
                { "op": "test", "path": "/metadata/finalizers", "value": null },
                { "op": "add", "path": "/metadata/finalizers", "value": [FINALIZER] },
            ])
        } else {
            serde_json::json!([
                { "op": "test", "path": "/metadata/finalizers", "value": finalizers },
                { "op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER },
            ])
        };
        let generation = self.tl.metadata.generation;
        self.patch_metadata(ops).await?;
        // The patch is not conditional on the version: its reply can show a
        // spec edited meanwhile, which the pass plans from (and reports the
        // generation of), so it validates that spec instead.
        if self.tl.metadata.generation != generation {
            self.spec = spec::validate(&self.tl).map_err(|e| e.to_string());
        }
        Ok(())
    }

    /// Removes the finalizer: nothing of this resource is left in the store.
    pub(super) async fn remove_finalizer(&mut self) -> Result<(), Error> {
        let Some(i) = self.tl.finalizers().iter().position(|f| f == FINALIZER) else {
            return Ok(());
        };
        let ops = serde_json::json!([
            { "op": "test", "path": format!("/metadata/finalizers/{i}"), "value": FINALIZER },
            { "op": "remove", "path": format!("/metadata/finalizers/{i}") },
        ]);
        match self.patch_metadata(ops).await {
            // Already gone: the finalizer went with it.
            Err(Error::Kube(kube::Error::Api(s))) if s.code == 404 => Ok(()),
            other => other,
        }
    }

    async fn patch_metadata(&mut self, ops: serde_json::Value) -> Result<(), Error> {
        let patch: json_patch::Patch =
            serde_json::from_value(ops).map_err(|e| Error::Kube(kube::Error::SerdeError(e)))?;
        let writing = self.ctx.echoes.writing(&self.key);
        let updated = self
            .api
            .patch(
                &self.tl.name_any(),
                &PatchParams::default(),
                &Patch::Json::<()>(patch),
            )
            .await?;
        writing.wrote(updated.resource_version());
        self.adopt(updated);
        Ok(())
    }

    /// The server's copy after a write of ours becomes the one we plan from
    /// (and tells the keeper for certain whether the lease is published).
    fn adopt(&mut self, updated: TargetLease) {
        self.ctx
            .remember(&self.key, |m| m.known_version = updated.resource_version());
        self.tl = updated;
        self.ctx.keeper.acknowledged(&self.key, &self.published());
    }

    /// Publishes the working status: the writes of [`publish::order`], then
    /// Events, then wake-ups.
    pub(super) async fn flush(&mut self) -> Result<(), Error> {
        self.working.observed_generation = self
            .working
            .observed_generation
            .or(self.tl.metadata.generation);
        let published = self.published();
        let name = self.tl.name_any();
        let ns = self.tl.namespace().unwrap_or_default();
        let wanted = marks::wanted(&self.working);
        let previous = marks::wanted(&published).map(|m| m.pod);
        let pods = self.ctx.pods.in_namespace(&ns);
        let in_ns: Vec<_> = pods.iter().map(|p| &**p).collect();
        let todo = marks::plan(&name, wanted.as_ref(), &in_ns, previous.as_deref());
        // Every write below may publish the working status (its token and
        // expiry) even if its reply is lost: the keeper renews the lease from
        // now. A replica that may not write tells the keeper nothing (the
        // client's write gate refuses each of its writes; this asks the gate,
        // it does not stand in for it).
        if self.ctx.leadership.is_leading() {
            self.ctx
                .keeper
                .may_publish(&self.key, &self.working, self.term);
        }
        let mark_first = crate::store::failpoints::on("mark-before-unmark");
        let changed = self.working != published;
        for write in publish::order(&published, &todo, changed, mark_first) {
            match write {
                Write::Unmark(pod) => {
                    marks::unmark(&self.ctx.client, &ns, &name, &pod).await?;
                }
                Write::Status => {
                    self.write_status().await?;
                    self.wake |= publish::withdraws_held(&published, &self.working);
                }
                Write::Mark(m) => {
                    marks::mark_now(&self.ctx.client, &self.ctx.pods, &ns, &name, &m).await?;
                }
            }
        }
        for note in std::mem::take(&mut self.notes) {
            self.event(note).await;
        }
        if std::mem::take(&mut self.wake) {
            self.wake_waiters();
        }
        Ok(())
    }

    /// Server-side apply of status, conditional on the version planned from.
    async fn write_status(&mut self) -> Result<(), Error> {
        let patch = serde_json::json!({
            "apiVersion": "targetlease.dev/v1alpha1",
            "kind": "TargetLease",
            "metadata": { "resourceVersion": self.tl.resource_version() },
            "status": self.working,
        });
        let writing = self.ctx.echoes.writing(&self.key);
        let updated = self
            .api
            .patch_status(
                &self.tl.name_any(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        writing.wrote(updated.resource_version());
        if let Some(token) = self.working.fencing_token {
            let mut own = self.ctx.published.lock().unwrap_or_else(|p| p.into_inner());
            let key = NsName::shared(
                updated.metadata.namespace.as_deref().unwrap_or_default(),
                &updated.spec.target,
            );
            super::floor::published(&mut own, key, token);
        }
        self.adopt(updated);
        Ok(())
    }

    async fn event(&self, note: Note) {
        if note.reason == crate::operator::conditions::Reason::LeaseLost {
            self.ctx.metrics.lease_lost();
        }
        let ev = Event {
            warning: note.warning,
            reason: note.reason.as_str(),
            action: transition::event_action(&note),
            note: note.message,
        };
        if let Err(e) = self
            .ctx
            .recorder
            .publish(ev, &self.tl.object_ref(&()))
            .await
        {
            tracing::debug!(error = %e, "cannot publish event");
        }
    }

    /// A store call leaves now.
    fn sending(&mut self) -> Instant {
        let now = Instant::now();
        self.sent = Some(now);
        now
    }

    /// The reply to a call sent at `sent` tells Valkey's clock.
    fn saw(&self, reply: &Result<Reply, StoreError>, sent: Instant) {
        if let Ok(r) = reply {
            self.ctx.clock.anchor(r.server_time_ms, sent);
        }
    }

    pub(super) async fn acquire(
        &mut self,
        owner: String,
        acquisition: &str,
        t: spec::Timing,
    ) -> Result<Result<Reply, StoreError>, Error> {
        let acquisition = acquisition.to_owned();
        let mut req = AcquireRequest::new(self.target(), owner, t.ttl);
        // Not the acquisition id itself: that is public, and a replay of this
        // request hands back the lease id.
        req.request_id = self.ctx.lease_ids.request_id(&acquisition);
        req.lease_id = Some(self.ctx.lease_ids.derive(&acquisition));
        req.max_lifetime = t.max_lifetime;
        let floor = self.token_floor();
        req.token_floor = (floor > 0).then_some(floor);
        let mut meta = serde_json::Map::new();
        meta.insert(META_TARGETLEASE.into(), self.facts().me.into());
        meta.insert(META_ACQUISITION.into(), acquisition.into());
        req.metadata = Some(meta);
        let sent = self.sending();
        let reply = gated(&self.ctx.leadership, self.ctx.store.acquire(&req)).await?;
        self.saw(&reply, sent);
        Ok(reply)
    }

    pub(super) async fn renew(
        &mut self,
        lease: &plan::Recorded,
        ttl: Duration,
    ) -> Result<Result<Reply, StoreError>, Error> {
        let token = lease.token;
        let handle = LeaseHandle {
            owner: lease.owner.clone(),
            lease_id: self.ctx.lease_ids.derive(&lease.acquisition),
            token,
        };
        let req = RenewRequest::new(self.target(), handle, ttl);
        // A reply that would come after the published expiry comes too late:
        // stop waiting then, so Held is withdrawn in time. The call itself runs
        // on (its outcome is unknown, which is what the transition assumes).
        // Renewals pass the write gate: they extend only this exact lease
        // (docs/consistency.md), and only extend it once this replica stops
        // leading ([`renew_as`]). They never overlap the keeper's.
        let limit = transition::left_before_expiry(&self.facts(), &self.working);
        let serial = self.ctx.keeper.serial(&self.key);
        let (store, gate) = (self.ctx.store.clone(), self.ctx.leadership.clone());
        let sent = self.sending();
        let call = tokio::spawn(async move {
            let _serial = match serial {
                Some(s) => Some(s.lock_owned().await),
                None => None,
            };
            renew_as(&gate, &*store, req).await
        });
        let reply = match limit {
            None => call.await.unwrap_or_else(|e| Err(lost(e))),
            Some(limit) => match tokio::time::timeout(limit, call).await {
                Ok(joined) => joined.unwrap_or_else(|e| Err(lost(e))),
                Err(_) => Err(StoreError::OutcomeUnknown(
                    "no answer before the published expiry".into(),
                )),
            },
        };
        self.saw(&reply, sent);
        if matches!(reply, Err(StoreError::OutcomeUnknown(_))) {
            self.ctx.keeper.maybe_renewed(&self.key, token);
        }
        Ok(reply)
    }

    /// Releases the lease of `acquisition` (its lease id derives from it); the
    /// request id derives from it too, so a retry after a lost reply replays.
    pub(super) async fn release(
        &mut self,
        owner: &str,
        acquisition: &str,
        token: u64,
    ) -> Result<Result<Reply, StoreError>, Error> {
        let handle = LeaseHandle {
            owner: owner.to_owned(),
            lease_id: self.ctx.lease_ids.derive(acquisition),
            token,
        };
        let mut req = ReleaseRequest::new(self.target(), handle);
        req.request_id = format!("release-{acquisition}");
        let sent = self.sending();
        let reply = gated(&self.ctx.leadership, self.ctx.store.release(&req)).await?;
        self.saw(&reply, sent);
        Ok(reply)
    }
    /// Reads the lease on the target (the one read the steps make of the store).
    pub(super) async fn read_lease(&mut self) -> Result<Reply, StoreError> {
        let sent = self.sending();
        let reply = self.ctx.store.get(&self.target()).await;
        self.saw(&reply, sent);
        reply
    }

    /// Covers the last published token with the floor before anything is released.
    pub(super) async fn raise_floor(&mut self) -> Result<(), Error> {
        if crate::store::failpoints::on("floor-skip-raise") {
            return Ok(());
        }
        let Some(token) = self.published().fencing_token else {
            return Ok(());
        };
        let ns = self.tl.namespace().unwrap_or_default();
        let target = self.tl.spec.target.clone();
        if floor::covers(self.ctx.floors.get(&ns, &target), token) {
            return Ok(());
        }
        match self.ctx.floors.raise(&ns, &target, token).await {
            Ok(None) => Ok(()),
            Ok(Some(fold)) => {
                let t = transition::floors_folded(&self.facts(), &self.working, &ns, &fold);
                self.absorb(t);
                Ok(())
            }
            Err(e) => {
                let e = Error::from(e);
                if matches!(e, Error::NotLeader(_)) {
                    return Err(e);
                }
                let why = floor::unwritten(&e);
                tracing::warn!(namespace = %ns, token, error = %e, "cannot raise the token floor; the finalizer stays");
                let t = transition::floor_unwritten(&self.facts(), &self.working, &ns, token, &why);
                self.absorb(t);
                // Say so on the resource (best effort: the API may be what fails).
                if let Err(shown) = self.flush().await {
                    tracing::debug!(error = %shown, "cannot show why the floor was not written");
                }
                Err(e)
            }
        }
    }

    /// The floor now covers what this process published for the target.
    pub(super) fn forget_published(&self) {
        let ns = self.tl.metadata.namespace.as_deref().unwrap_or_default();
        let target = &self.tl.spec.target;
        let floor = self.ctx.floors.get(ns, target);
        let mut published = self.ctx.published.lock().unwrap_or_else(|p| p.into_inner());
        floor::forget_covered(&mut published, NsName::new(ns, target), floor);
    }
}

/// Runs a store call that can take or give a lease (acquire, release): only
/// while the gate is open, and no longer than it stays open, so a call that
/// has not left when this replica stops leading never does (the store client
/// takes back a request it has not written when its caller goes away).
async fn gated<F>(gate: &Leadership, call: F) -> Result<Result<Reply, StoreError>, NotLeader>
where
    F: std::future::Future<Output = Result<Reply, StoreError>>,
{
    match gate.open_until()? {
        None => Ok(call.await),
        Some(until) => Ok(tokio::time::timeout_at(until.into(), call)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::OutcomeUnknown(
                    "this replica stopped leading before the store answered".into(),
                ))
            })),
    }
}

/// A reconcile's renewal, sent once its turn comes: plain while this
/// replica leads (that is how a shorter `leaseDuration` takes effect), and
/// no longer than it leads; extend-only, like the keeper's, once it does
/// not — a pass still running after its replica stepped down must never
/// shorten a lease the new leader renewed for longer.
async fn renew_as(
    gate: &Leadership,
    store: &dyn LeaseStore,
    req: RenewRequest,
) -> Result<Reply, StoreError> {
    match gated(gate, store.renew(&req)).await {
        Ok(reply) => reply,
        Err(NotLeader) => store.renew(&req.extending_only()).await,
    }
}

/// A store call whose task failed (panicked or was cancelled): it may have run.
fn lost(e: tokio::task::JoinError) -> StoreError {
    StoreError::OutcomeUnknown(format!("store call did not complete: {e}"))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod writes;

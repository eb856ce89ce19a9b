//! One pass over one TargetLease: the object it planned from, the status it
//! is building, and the writes, always in the same order (`flush`):
//! unmark pods the new status does not name → write status (conditional on
//! the version planned from) → mark the pod it names → Events → wake-ups.

use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::keeper::{Confirmation, Kept};
use super::plan::publish::{self, Write};
use super::plan::timing;
use super::spec::{self, ValidSpec};
use super::transition::{self, Facts, Memory as Remembered, Next, Note, Transition};
use super::{Context, Error, FIELD_MANAGER, FINALIZER, marks, plan, with_jitter};
use crate::crd::{TargetLease, TargetLeaseStatus};
use crate::store::{LeaseHandle, Target};

pub(super) struct Pass<'a> {
    pub(super) ctx: &'a Context,
    pub(super) api: Api<TargetLease>,
    /// The object as the API server last showed it to this process.
    pub(super) tl: TargetLease,
    pub(super) key: ObjectRef<TargetLease>,
    /// The status this pass will publish.
    pub(super) working: TargetLeaseStatus,
    pub(super) spec: Result<ValidSpec, String>,
    /// When the last store call of this pass was sent (what a reply's server
    /// time is anchored at).
    pub(super) sent: Option<Instant>,
    /// The keeper's term this pass started in: once it ends, nothing this
    /// pass learns reaches the keeper.
    pub(super) term: u64,
    notes: Vec<Note>,
    wake: bool,
}

impl<'a> Pass<'a> {
    /// Starts a pass from `cached`, re-reading the object when the cache may be
    /// older than this process's own last write. `None`: the object is gone.
    pub(super) async fn start(
        ctx: &'a Context,
        cached: &TargetLease,
    ) -> Result<Option<Self>, Error> {
        let ns = cached.namespace().ok_or(Error::NoNamespace)?;
        let api: Api<TargetLease> = Api::namespaced(ctx.client.clone(), &ns);
        let key = ObjectRef::from_obj(cached);
        let term = ctx.keeper.term();
        let memory = ctx.recall(&key);
        let known = memory.known_version;
        let tl = if memory.reread || (known.is_some() && known != cached.resource_version()) {
            match api.get_opt(&cached.name_any()).await? {
                Some(fresh) => fresh,
                None => return Ok(None),
            }
        } else {
            cached.clone()
        };
        ctx.remember(&key, |m| {
            m.known_version = tl.resource_version();
            m.reread = false;
        });
        let working = tl.status.clone().unwrap_or_default();
        let spec = spec::validate(&tl).map_err(|e| e.to_string());
        let pass = Self {
            ctx,
            api,
            key,
            working,
            spec,
            tl,
            sent: None,
            term,
            notes: Vec::new(),
            wake: false,
        };
        pass.ctx
            .keeper
            .may_publish(&pass.key, &pass.published(), pass.term);
        Ok(Some(pass))
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
            now: Time(Timestamp::now()),
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
        self.patch_metadata(ops).await
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
        let updated = self
            .api
            .patch(
                &self.tl.name_any(),
                &PatchParams::default(),
                &Patch::Json::<()>(patch),
            )
            .await?;
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

    /// Takes in a transition: its status becomes the working status; Events
    /// and wake-ups wait for the next flush.
    pub(super) fn absorb(&mut self, t: Transition) -> Next {
        self.working = t.status;
        self.notes.extend(t.notes);
        self.wake |= t.wake_waiters;
        match t.memory {
            Remembered::Keep => {}
            Remembered::Confirmed {
                expires_ms,
                max_expires_ms,
            } => {
                self.keep(expires_ms, max_expires_ms);
                self.ctx.remember(&self.key, |m| m.confirm = false);
            }
            Remembered::Forget => {
                self.ctx.keeper.forget(&self.key);
                self.ctx.remember(&self.key, |m| m.confirm = false);
            }
        }
        if t.forget_acquisition {
            self.ctx
                .remember(&self.key, |m| m.first_acquisition_spent = true);
        }
        match t.store_answered {
            Some(true) => self.ctx.remember(&self.key, |m| m.failures = 0),
            Some(false) => self.ctx.remember(&self.key, |m| {
                m.failures = m.failures.saturating_add(1);
            }),
            None => {}
        }
        t.next
    }

    /// Hands the lease the working status holds, just confirmed by the store
    /// call sent at `self.sent`, to the keeper.
    fn keep(&self, expires_ms: u64, max_expires_ms: Option<u64>) {
        let w = &self.working;
        let (Some(owner), Some(acquisition), Some(token), Ok(valid)) = (
            w.holder.clone(),
            w.acquisition_id.as_deref(),
            w.fencing_token,
            &self.spec,
        ) else {
            return;
        };
        let handle = LeaseHandle {
            owner,
            lease_id: self.ctx.lease_ids.derive(acquisition),
            token,
        };
        let target = Target::new(
            self.tl.namespace().unwrap_or_default(),
            self.tl.spec.target.clone(),
        );
        let kept = Kept::new(
            target,
            handle,
            (valid.timing.ttl, valid.timing.renew),
            self.sent.unwrap_or_else(Instant::now),
            (expires_ms, max_expires_ms),
        );
        self.ctx.keeper.confirmed(&self.key, kept, self.term);
        self.ctx
            .keeper
            .may_publish(&self.key, &self.published(), self.term);
    }

    /// Publishes the working status, in the one safe order.
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
        let mark_first = crate::failpoints::on("mark-before-unmark");
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
        let updated = self
            .api
            .patch_status(
                &self.tl.name_any(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        if let Some(token) = self.working.fencing_token {
            let mut own = self.ctx.published.lock().unwrap_or_else(|p| p.into_inner());
            let key = (
                updated.namespace().unwrap_or_default(),
                updated.spec.target.clone(),
            );
            super::floor::published(&mut own, key, token);
        }
        self.adopt(updated);
        Ok(())
    }

    async fn event(&self, note: Note) {
        if note.reason == crate::conditions::Reason::LeaseLost {
            self.ctx.metrics.lease_lost();
        }
        let ev = Event {
            type_: if note.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: note.reason.as_str().into(),
            action: action_of(&note),
            note: Some(note.message),
            secondary: None,
        };
        if let Err(e) = self
            .ctx
            .recorder
            .publish(&ev, &self.tl.object_ref(&()))
            .await
        {
            tracing::debug!(error = %e, "cannot publish event");
        }
    }

    /// Wakes the other TargetLeases on the same target (the queue may have moved).
    pub(super) fn wake_waiters(&self) {
        let ns = self.tl.namespace().unwrap_or_default();
        let on_target = self
            .ctx
            .lease_index
            .on_target(&self.ctx.leases, &ns, &self.tl.spec.target);
        for other in on_target {
            if ObjectRef::from_obj(&*other) != self.key {
                let _ = self.ctx.wake.unbounded_send(ObjectRef::from_obj(&*other));
            }
        }
    }

    /// When to look again, for a transition's [`Next`].
    pub(super) fn action(&self, next: &Next) -> Action {
        let held = self.held();
        let renewal = timing::until_renewal(
            self.renew_interval(),
            self.confirmation().map(|c| c.at.elapsed()),
            held.as_ref().and_then(timing::until_rotation),
        );
        let failures = self.ctx.recall(&self.key).failures;
        timing::action(next, renewal, failures, with_jitter)
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
    pub(super) fn held(&self) -> Option<timing::Held> {
        let spec = self.spec.as_ref().ok()?;
        let confirmation = self.confirmation();
        Some(timing::Held {
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
            self.held().as_ref(),
            self.ctx.recall(&self.key).confirm,
            published_ok,
        )
    }

    /// The lease's hard end is within one renew interval ([`timing::rotation_due`]).
    pub(super) fn rotation_due(&self) -> bool {
        timing::rotation_due(self.held().as_ref())
    }
}

/// The Event's action. kube's Recorder folds Events of one object that share
/// type, reason and action into one series and keeps the first note, so two
/// grants (two holders, two tokens) would read `Acquired (x2)` with the
/// first token. The action carries a digest of the note: only Events that
/// say exactly the same thing fold.
fn action_of(note: &Note) -> String {
    let digest = sha1_smol::Sha1::from(note.message.as_bytes())
        .digest()
        .bytes();
    format!(
        "Reconcile-{:02x}{:02x}{:02x}{:02x}",
        digest[0], digest[1], digest[2], digest[3]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditions::Reason;

    fn note(message: &str) -> Note {
        Note {
            warning: false,
            reason: Reason::Acquired,
            message: message.into(),
        }
    }

    #[test]
    fn two_grants_never_share_an_action_and_a_repeat_does() {
        let first = action_of(&note("acquired by web-0 with fencing token 1"));
        let second = action_of(&note("acquired by web-1 with fencing token 2"));
        assert_ne!(first, second);
        assert_eq!(
            first,
            action_of(&note("acquired by web-0 with fencing token 1"))
        );
        assert!(first.len() <= 128, "the API's limit on an action");
    }
}

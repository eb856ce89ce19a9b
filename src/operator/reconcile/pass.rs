//! One pass over one TargetLease: the object it planned from, the status it
//! is building, and what it observes for the plan (the caches, the keeper's
//! confirmations, the store's clock). Its steps are in `steps.rs`, its
//! writes in `executor.rs`.

use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use super::keeper::{Confirmation, Kept};
use super::plan::timing;
use super::spec::{self, ValidSpec};
use super::transition::{self, Facts, Learned, Next, Note, Transition};
use super::{Context, Error, FINALIZER, plan, pods, with_jitter};
use crate::operator::crd::{TargetLease, TargetLeaseStatus};
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
    /// Events to publish at the next flush.
    pub(super) notes: Vec<Note>,
    /// Wake the waiters at the next flush.
    pub(super) wake: bool,
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
        let carried = ctx.recall(&key);
        let known = carried.known_version;
        let tl = if carried.reread || (known.is_some() && known != cached.resource_version()) {
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
            m.renewal_at = None;
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

    /// Takes in a transition: its status becomes the working status; Events
    /// and wake-ups wait for the next flush.
    pub(super) fn absorb(&mut self, t: Transition) -> Next {
        self.working = t.status;
        self.notes.extend(t.notes);
        self.wake |= t.wake_waiters;
        match t.learned {
            Learned::Keep => {}
            Learned::Confirmed {
                expires_ms,
                max_expires_ms,
            } => {
                self.keep(expires_ms, max_expires_ms);
                self.ctx.remember(&self.key, |m| m.confirm = false);
            }
            Learned::Forget => {
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
        let renewal_at = matches!(next, Next::Renewal).then(|| Instant::now() + renewal);
        self.ctx.remember(&self.key, |m| m.renewal_at = renewal_at);
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
            .find(|(name, expires)| *name != me && *expires > now_ms)
            .map(|(name, expires)| plan::HeldElsewhere {
                name: name.clone(),
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
            .get(&(ns.clone(), target.clone()))
            .copied();
        super::floor::token_floor(
            self.siblings().max_token,
            own,
            self.working.fencing_token,
            self.ctx.floors.get(&ns, target),
        )
    }
}

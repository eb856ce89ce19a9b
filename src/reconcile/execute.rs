//! The executor: runs each planned step (the store call, if any), hands the
//! reply to the pure transition, and publishes before every store call that
//! depends on what is published (an acquire needs its attempt recorded; a
//! release needs the lease unpublished first).

use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::pass::Pass;
use super::plan::{self, Desired, Observed, Step};
use super::transition::{self, META_ACQUISITION, META_TARGETLEASE, Next, Transition};
use super::{Error, pods, spec};
use crate::conditions::Reason;
use crate::leadership::{Leadership, NotLeader};
use crate::store::{
    AcquireRequest, LeaseHandle, LeaseStore, ReleaseRequest, RenewRequest, Reply, StoreError,
    Target,
};

/// Steps one pass may take before it yields (a release, a new attempt and an
/// acquire, with a reclaim in between, fit comfortably).
const MAX_STEPS: usize = 8;

impl Pass<'_> {
    /// Makes a live resource's lease what its spec and the pods call for.
    pub(super) async fn converge(mut self) -> Result<Action, Error> {
        let check = self.spec.as_ref().map(|_| ()).map_err(Clone::clone);
        self.working = transition::spec_checked(&self.facts(), &self.working, &check);
        for _ in 0..MAX_STEPS {
            let desired = self.desired().await;
            let observed = Observed {
                status: &self.working,
                generation: self.tl.metadata.generation,
                desired: desired.clone(),
                queued_behind: self.queued_behind(),
                held_elsewhere: self.held_elsewhere(),
                renew_due: self.renew_due(),
                rotation_due: self.rotation_due(),
                acquisition: self.acquisition().is_some(),
            };
            let step = plan::plan(&observed);
            let t = self.take(step, &desired).await?;
            if let Some(action) = self.settle(t).await? {
                return Ok(action);
            }
        }
        self.yield_pass().await
    }

    /// Takes in a transition; unless the plan continues in this pass,
    /// publishes and says when to look again.
    async fn settle(&mut self, t: Transition) -> Result<Option<Action>, Error> {
        match self.follow(t).await? {
            Next::PlanAgain => Ok(None),
            next => {
                self.flush().await?;
                Ok(Some(self.action(&next)))
            }
        }
    }

    /// The step budget of one pass is spent: publish and continue at once.
    async fn yield_pass(&mut self) -> Result<Action, Error> {
        self.flush().await?;
        Ok(Action::requeue(Duration::ZERO))
    }

    /// Gives back everything this resource has in the store, then lets the
    /// finalizer go. Held is withdrawn first (marks, then status), then the
    /// last published token is covered by the floor, then the store lets go:
    /// a floor write that fails leaves the lease unpublished, never Held.
    pub(super) async fn cleanup(mut self) -> Result<Action, Error> {
        if !self.has_finalizer() {
            self.ctx.forget(&self.key);
            return Ok(Action::await_change());
        }
        // Deleting it moved the queue: the next one looks now (and waits for
        // Held to be withdrawn, or to expire, if it is still published).
        self.wake_waiters();
        let mut looked = false;
        let mut floored = false;
        for _ in 0..MAX_STEPS {
            let step = plan::plan_cleanup(&self.working, looked);
            looked |= step == Step::Abandon;
            // Everything but the step that withdraws Held gives back to the store.
            if !floored && !matches!(step, Step::Release { .. }) {
                self.flush().await?;
                self.raise_floor().await?;
                floored = true;
            }
            if step == Step::Finalize {
                // Nothing left to publish but the marks' removal (status goes with the object).
                self.working = self.published();
                self.flush().await?;
                self.remove_finalizer().await?;
                self.forget_published();
                self.ctx.keeper.forget(&self.key);
                self.ctx.forget(&self.key);
                self.wake_waiters();
                return Ok(Action::await_change());
            }
            let deleted = Desired::Nobody {
                reason: Reason::Released,
                message: "the TargetLease is being deleted".into(),
            };
            let t = self.take(step, &deleted).await?;
            if let Some(action) = self.settle(t).await? {
                return Ok(action);
            }
        }
        self.yield_pass().await
    }

    /// Absorbs a transition and runs its reclaim, if any; returns what follows.
    async fn follow(&mut self, t: Transition) -> Result<Next, Error> {
        let mut next = self.absorb(t);
        while let Next::Reclaim(r) = next {
            let reply = self.release(&r.owner, &r.acquisition, r.token).await?;
            let t = transition::after_reclaim(&self.facts(), &self.working, &r, reply);
            next = self.absorb(t);
        }
        Ok(next)
    }

    /// Runs one step: the store call it needs, then its pure transition.
    async fn take(&mut self, step: Step, desired: &Desired) -> Result<Transition, Error> {
        let f = self.facts();
        let t = match step {
            Step::RecordAcquisition => {
                transition::record_acquisition(&f, &self.working, crate::store::new_request_id())
            }
            Step::Acquire { owner } => {
                // A recorded attempt is published before the store sees it (the
                // implicit first one needs nothing: it derives from the UID).
                if self.working.acquisition_id.is_some()
                    && self.published().acquisition_id != self.working.acquisition_id
                {
                    self.flush().await?;
                }
                let pod = match desired {
                    Desired::Holder { pod, .. } => pod.clone(),
                    Desired::Nobody { .. } => None,
                };
                let timing = match &self.spec {
                    Ok(valid) => valid.timing,
                    // (The plan acquires only for a valid spec.)
                    Err(message) => {
                        return Ok(transition::wait(
                            &f,
                            &self.working,
                            Reason::InvalidSpec,
                            message,
                        ));
                    }
                };
                let acquisition = self.acquisition().unwrap_or_default();
                let reply = self.acquire(owner, &acquisition, timing).await?;
                let mut t =
                    transition::after_acquire(&f, &self.working, &acquisition, pod.as_ref(), reply);
                self.flag_overlap(&mut t);
                t
            }
            Step::Renew { lease } => {
                let ttl = match &self.spec {
                    Ok(valid) => valid.timing.ttl,
                    // (The plan releases the lease of an invalid spec first.)
                    Err(message) => {
                        return Ok(transition::begin_release(
                            &f,
                            &self.working,
                            Reason::InvalidSpec,
                            message,
                        ));
                    }
                };
                if let Some(t) = transition::before_renew(&f, &self.working, ttl) {
                    self.absorb(t);
                    self.flush().await?;
                }
                let reply = self.renew(&lease, ttl).await?;
                transition::after_renew(&self.facts(), &self.working, reply)
            }
            Step::Idle => {
                let pod = match desired {
                    Desired::Holder { pod, .. } => pod.clone(),
                    Desired::Nobody { .. } => None,
                };
                transition::idle(&f, &self.working, pod.as_ref())
            }
            Step::Release { reason, message } => {
                transition::begin_release(&f, &self.working, reason, &message)
            }
            Step::FinishRelease { lease } => {
                // The lease is unpublished (status and marks) before Valkey lets go.
                self.flush().await?;
                let reply = self
                    .release(&lease.owner, &lease.acquisition, lease.token)
                    .await?;
                transition::after_release(&self.facts(), &self.working, reply)
            }
            Step::ForgetRelease => transition::release_unrecorded(&f, &self.working),
            Step::Abandon => {
                let sent = self.sending();
                let reply = self.ctx.store.get(&self.target()).await;
                self.saw(&reply, sent);
                transition::after_abandon_read(&self.facts(), &self.working, reply)
            }
            Step::Wait {
                reason,
                message,
                recheck,
            } => {
                let mut t = transition::wait(&f, &self.working, reason, &message);
                if let (Some(r), Next::Requeue(d)) = (recheck, &t.next) {
                    t.next = Next::Requeue((*d).min(r));
                }
                t
            }
            Step::Finalize => transition::idle(&f, &self.working, None),
        };
        Ok(t)
    }

    fn target(&self) -> Target {
        Target::new(
            self.tl.namespace().unwrap_or_default(),
            self.tl.spec.target.clone(),
        )
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

    async fn acquire(
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

    async fn renew(
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
    async fn release(
        &mut self,
        owner: &str,
        acquisition: &str,
        token: u64,
    ) -> Result<Result<Reply, StoreError>, Error> {
        let holder = LeaseHandle {
            owner: owner.to_owned(),
            lease_id: self.ctx.lease_ids.derive(acquisition),
            token,
        };
        let mut req = ReleaseRequest::new(self.target(), holder);
        req.request_id = format!("release-{acquisition}");
        let sent = self.sending();
        let reply = gated(&self.ctx.leadership, self.ctx.store.release(&req)).await?;
        self.saw(&reply, sent);
        Ok(reply)
    }

    fn queued_behind(&self) -> Option<String> {
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
    fn held_elsewhere(&self) -> Option<plan::HeldElsewhere> {
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
    fn siblings(&self) -> std::sync::Arc<super::index::Published> {
        let ns = self.tl.namespace().unwrap_or_default();
        self.ctx
            .lease_index
            .published(&self.ctx.leases, &ns, &self.tl.spec.target)
    }

    /// The token every new acquisition must exceed: the highest published for
    /// the target (statuses in the cache, this process's own writes) or kept
    /// by the floor for deleted leases.
    fn token_floor(&self) -> u64 {
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

    /// An election won a pod another election also selects: say so once, at acquisition.
    fn flag_overlap(&self, t: &mut Transition) {
        if self.tl.spec.candidates.is_none() {
            return;
        }
        let Some(pod_name) = transition::granted_pod(t) else {
            return;
        };
        let ns = self.tl.namespace().unwrap_or_default();
        let Some(pod) = self.ctx.pods.get(&ns, pod_name) else {
            return;
        };
        let others = pods::overlapping_elections(
            &self.tl,
            &pod,
            &self.ctx.lease_index.in_namespace(&self.ctx.leases, &ns),
            &self.ctx.selectors,
        );
        let warning = transition::overlap_warning(pod_name, &others);
        t.notes.extend(warning);
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
#[path = "execute_tests.rs"]
mod tests;

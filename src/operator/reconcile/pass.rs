//! One pass over one TargetLease, from the object to what it publishes: it
//! starts from the object (re-read when the cache may be older than this
//! process's own last write), validates the spec, and then, step by step,
//! has the pure [`plan`] choose a step from what it observes (`observe.rs`),
//! has the executor perform the step's store call (`executor.rs`), and takes
//! in the step's pure [`transition`], until the plan waits; then the executor
//! publishes and the pass says when to look again.

use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use super::keeper::Kept;
use super::plan::timing;
use super::plan::{Desired, Observed, Step, publish};
use super::spec::{self, ValidSpec};
use super::transition::{self, Learned, Next, Note, Transition};
use super::{Context, Error, plan, pods, with_jitter};
use crate::operator::conditions::Reason;
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

/// Steps one pass may take before it yields (a release, a new attempt and an
/// acquire, with a reclaim in between, fit comfortably).
const MAX_STEPS: usize = 8;

impl<'a> Pass<'a> {
    /// Starts a pass from `cached`, re-reading the object when the cache may be
    /// older than this process's own last write. `None`: the object is gone.
    pub(super) async fn start(
        ctx: &'a Context,
        cached: &TargetLease,
    ) -> Result<Option<Self>, Error> {
        let ns = cached.namespace().ok_or(Error::NoNamespace)?;
        let api: Api<TargetLease> = Api::namespaced(ctx.client.clone(), &ns);
        let key = super::key_of(cached);
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
    /// finalizer go, in the executor's fixed order: a floor write that fails
    /// leaves the lease unpublished, never Held.
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
            if publish::floor_first(&step, floored) {
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
        if publish::before_store_call(&step, &self.published(), &self.working) {
            self.flush().await?;
        }
        let f = self.facts();
        let t = match step {
            Step::RecordAcquisition => transition::record_acquisition(
                &f,
                &self.working,
                crate::operator::lease_id::new_acquisition_id(),
            ),
            Step::Acquire { owner } => {
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
            Step::Idle => transition::idle(&f, &self.working),
            Step::Release { reason, message } => {
                transition::begin_release(&f, &self.working, reason, &message)
            }
            Step::FinishRelease { lease } => {
                let reply = self
                    .release(&lease.owner, &lease.acquisition, lease.token)
                    .await?;
                transition::after_release(&self.facts(), &self.working, reply)
            }
            Step::ForgetRelease => transition::release_unrecorded(&f, &self.working),
            Step::Abandon => {
                let reply = self.read_lease().await;
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
            Step::Finalize => transition::idle(&f, &self.working),
        };
        Ok(t)
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

    /// Wakes the other TargetLeases on the same target (the queue may have
    /// moved). A waiter woken before the cache shows the status this pass
    /// wrote plans from the old one; where that status withdrew Held or
    /// left the queue, the waiter is woken again when the cache takes it
    /// (see [`super::index`]).
    pub(super) fn wake_waiters(&self) {
        let ns = self.tl.namespace().unwrap_or_default();
        for other in self
            .ctx
            .lease_index
            .on_target(&self.ctx.leases, &ns, &self.tl.spec.target)
        {
            let other = ObjectRef::from_obj(&*other);
            if other != self.key {
                let _ = self.ctx.wake.unbounded_send(other);
            }
        }
    }

    /// When to look again, for a transition's [`Next`].
    pub(super) fn action(&self, next: &Next) -> Action {
        let lease = self.lease_timing();
        let renewal = timing::until_renewal(
            self.renew_interval(),
            self.confirmation().map(|c| c.at.elapsed()),
            lease.as_ref().and_then(timing::until_rotation),
        );
        let failures = self.ctx.recall(&self.key).failures;
        let renewal_at = matches!(next, Next::Renewal).then(|| Instant::now() + renewal);
        self.ctx.remember(&self.key, |m| m.renewal_at = renewal_at);
        if let Some(at) = renewal_at {
            // Kept in `renewals`, not in the controller's scheduler.
            self.ctx.renewals.schedule(&self.key, at);
            return Action::await_change();
        }
        timing::action(next, renewal, failures, with_jitter)
    }
}

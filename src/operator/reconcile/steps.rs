//! The steps of a pass: plan a step from what the pass observes, have the
//! executor perform it (`executor.rs`), take in its pure transition, until
//! the plan waits.

use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::pass::Pass;
use super::plan::{self, Desired, Observed, Step};
use super::transition::{self, Next, Transition};
use super::{Error, pods};
use crate::operator::conditions::Reason;

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
            Step::RecordAcquisition => transition::record_acquisition(
                &f,
                &self.working,
                crate::operator::lease_id::new_acquisition_id(),
            ),
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
            Step::Finalize => transition::idle(&f, &self.working, None),
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
}

//! Transitions of holding and letting go: renewals, withdrawing Held in
//! time, releases, waits.

use std::time::Duration;

use super::{Draft, Facts, Learned, Next, Transition, answered, time_ms, unexpected};
use crate::operator::conditions::{self, ConditionStatus, HELD, Reason};
use crate::operator::crd::{Phase, TargetLeaseStatus};
use crate::operator::reconcile::plan;
use crate::store::{Outcome, Reply, StoreError};

/// After [`plan::Step::Renew`].
pub fn after_renew(
    f: &Facts,
    status: &TargetLeaseStatus,
    reply: Result<Reply, StoreError>,
) -> Transition {
    let mut d = Draft::new(f, status);
    let reply = match reply {
        Ok(r) => r,
        Err(e) => {
            d.store_failed(&e);
            let left = left_before_expiry(f, status);
            if left.is_none() {
                d.unconfirmed();
                return d.done(Next::Backoff { not_after: None });
            }
            return d.done(Next::Backoff { not_after: left });
        }
    };
    d.store_ok();
    match (reply.outcome, reply.lease) {
        (Outcome::Renewed, Some(lease)) => {
            let published = status.expires_at.as_ref().map(|t| t.0.as_millisecond());
            let was_unknown = status.phase == Some(Phase::Unknown);
            if was_unknown
                || plan::expiry_to_publish(
                    published,
                    lease.expires_at_ms,
                    reply.server_time_ms,
                    f.renew_interval,
                    f.expiry_margin,
                )
            {
                d.t.status.expires_at = time_ms(lease.expires_at_ms);
            }
            d.t.status.phase = Some(Phase::Held);
            let message = format!(
                "held by {} with fencing token {}",
                lease.owner, lease.fencing_token
            );
            d.applied();
            d.condition(HELD, ConditionStatus::True, Reason::Acquired, &message);
            d.t.learned = Learned::Confirmed {
                expires_ms: lease.expires_at_ms,
                max_expires_ms: lease.max_expires_at_ms,
            };
            d.done(Next::Renewal)
        }
        (Outcome::CorruptState, _) => d.corrupt(&reply.message),
        (_, _) if crate::store::failpoints::on("held-after-lost") => d.done(Next::Renewal),
        (outcome, _) => {
            // expired / not_owner: Valkey no longer has this lease.
            d.t.status.acquisition_id = None;
            // The token names the grant, so two grants lost are two Events.
            let grant = status
                .fencing_token
                .map(|t| format!(" with fencing token {t}"))
                .unwrap_or_default();
            let message = format!(
                "the lease{grant} ended in the store ({outcome}): {}",
                reply.message
            );
            d.not_held(Phase::Lost, Reason::LeaseLost, &message);
            d.note(true, Reason::LeaseLost, message);
            d.t.learned = Learned::Forget;
            d.t.wake_waiters = true;
            d.done(Next::PlanAgain)
        }
    }
}

/// How long `Held` may stay published without a new confirmation (the
/// margin deducted): until the published expiry — or, when the store
/// confirmed the lease to a request sent after that expiry had passed (the
/// keeper renewed it while status could not be written, so Held could not
/// be withdrawn either), until the expiry that confirmation gave. `None`
/// when that has (about to have) passed.
pub fn left_before_expiry(f: &Facts, status: &TargetLeaseStatus) -> Option<Duration> {
    let published = status.expires_at.as_ref()?.0.as_millisecond();
    let until = match f.confirmed {
        Some(c) if c.sent_ms as i64 > published => published.max(c.expires_ms as i64),
        _ => published,
    };
    left_until(f, until)
}

/// How long the published expiry leaves (the margin deducted); `None` when
/// there is none or it has (about to have) passed.
pub fn published_left(f: &Facts, status: &TargetLeaseStatus) -> Option<Duration> {
    left_until(f, status.expires_at.as_ref()?.0.as_millisecond())
}

fn left_until(f: &Facts, until_ms: i64) -> Option<Duration> {
    let left = until_ms - f.server_now_ms as i64 - f.expiry_margin.as_millis() as i64;
    (left > 0).then(|| Duration::from_millis(left as u64))
}

/// Before a renewal with `ttl`: nothing published may be later than what the
/// renewal can set (a shorter `leaseDuration`: lower `expiresAt` and the pod
/// annotation first, so a lost reply cannot leave them later than Valkey's),
/// and `Held` is withdrawn if the published expiry is about to pass — unless
/// it has already passed and this process knows nothing newer of the lease
/// ([`renews_first`]), or Valkey confirmed a later expiry that has time left
/// ([`later_confirmed`]): that one is published instead. `None` when nothing
/// changes.
pub fn before_renew(f: &Facts, status: &TargetLeaseStatus, ttl: Duration) -> Option<Transition> {
    if status.phase != Some(Phase::Held) {
        return None;
    }
    let mut d = Draft::new(f, status);
    let floor = f.server_now_ms + ttl.as_millis() as u64;
    let published = status.expires_at.as_ref().map(|t| t.0.as_millisecond());
    if published.is_some_and(|p| p > floor as i64) {
        d.t.status.expires_at = time_ms(floor);
    }
    if left_before_expiry(f, &d.t.status).is_none() && !renews_first(f, &d.t.status) {
        match later_confirmed(f, &d.t.status, floor) {
            Some(expiry) => d.t.status.expires_at = time_ms(expiry),
            None => d.unconfirmed(),
        }
    }
    (d.t.status != *status).then(|| d.done(Next::PlanAgain))
}

/// A confirmation of the lease whose expiry is later than the one status
/// publishes and still leaves time (the margin deducted): the expiry to
/// republish (no later than `floor`, what the renewal about to be sent can
/// set) instead of withdrawing `Held` as the published one is about to
/// pass. However it came — the keeper renewed the lease while the API
/// server could not be written and is back just before the published
/// expiry, or a renewal was not republished because the published expiry
/// still had time — Valkey holds the lease at least until then: an
/// extend-only renewal never shortens it, and a confirmation a plain one
/// may have undone is not shown (a lost reply, another leader since). So
/// `Held` stays, with an expiry that is true, and does not flap to
/// `Unknown` and back.
pub fn later_confirmed(f: &Facts, status: &TargetLeaseStatus, floor: u64) -> Option<u64> {
    let published = status.expires_at.as_ref()?.0.as_millisecond();
    let expiry = f.confirmed?.expires_ms.min(floor);
    let shown = time_ms(expiry)?.0.as_millisecond();
    (shown > published && left_until(f, shown).is_some()).then_some(expiry)
}

/// Whether a `Held` whose published expiry has already passed is renewed
/// before anything is withdrawn: when this process has no confirmation of
/// the lease (another replica kept it alive through an API outage and this
/// one just took over, or this process just started). Withdrawing first
/// would come too late to keep `Held` within the expiry anyway, and would
/// flap a lease that may well be live: the renewal, sent with the published
/// lease handle, decides instead ([`after_renew`]) — renewed means Valkey
/// had that exact lease all along (an ended lease never comes back), so
/// `Held` stays with the new expiry; ended means `Lost`; no answer means
/// `Unknown`. An expiry that is only *about* to pass is still withdrawn
/// first, so `Held` never outlives it while a reply is awaited.
pub fn renews_first(f: &Facts, status: &TargetLeaseStatus) -> bool {
    f.confirmed.is_none()
        && status
            .expires_at
            .as_ref()
            .is_some_and(|t| t.0.as_millisecond() <= f.server_now_ms as i64)
}

/// [`plan::Step::Release`]: stop publishing the lease (status no longer Held,
/// pod marks removed) before the store is asked to release it. The keeper
/// goes on renewing the lease until that withdrawal is acknowledged (a
/// status write whose reply is lost may have published nothing new), and
/// forgets it once the store was asked ([`after_release`]).
pub fn begin_release(
    f: &Facts,
    status: &TargetLeaseStatus,
    reason: Reason,
    message: &str,
) -> Transition {
    let mut d = Draft::new(f, status);
    d.t.status.releasing_acquisition_id = d.t.status.acquisition_id.take();
    let phase = if f.deleting {
        Phase::Released
    } else {
        Phase::Pending
    };
    // Keep holder and token: they name the lease being released.
    d.t.status.phase = Some(phase);
    d.t.status.expires_at = None;
    d.warn_on_entering(reason, message);
    d.condition(HELD, ConditionStatus::False, reason, message);
    d.done(Next::PlanAgain)
}

/// After [`plan::Step::FinishRelease`].
pub fn after_release(
    f: &Facts,
    status: &TargetLeaseStatus,
    reply: Result<Reply, StoreError>,
) -> Transition {
    answered(f, status, reply, |mut d, reply| {
        let why = conditions::get(&status.conditions, HELD)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        let finished = |d: &mut Draft<'_>| d.release_finished();
        match reply.outcome {
            Outcome::Released => {
                finished(&mut d);
                d.note(false, Reason::Released, format!("lease released: {why}"));
                d.done(Next::PlanAgain)
            }
            Outcome::NotOwner | Outcome::Expired | Outcome::NotFound => {
                finished(&mut d);
                d.note(
                    true,
                    Reason::LeaseLost,
                    format!(
                        "the lease had already ended in the store ({}) when it was given back: {why}",
                        reply.outcome
                    ),
                );
                d.done(Next::PlanAgain)
            }
            Outcome::CorruptState => d.corrupt(&reply.message),
            other => unexpected(d, "release", other),
        }
    })
}

/// [`plan::Step::ForgetRelease`]: status records a release but not the lease
/// it gives back, so nothing was asked of the store (and nothing is said of
/// it); the release ends as one the store answered would.
pub fn release_unrecorded(f: &Facts, status: &TargetLeaseStatus) -> Transition {
    let mut d = Draft::new(f, status);
    d.release_finished();
    d.done(Next::PlanAgain)
}

impl Draft<'_> {
    /// The release is over: status forgets it (and, for Pending, the holder;
    /// the Held condition already says why, set when the release began).
    fn release_finished(&mut self) {
        let s = &mut self.t.status;
        s.releasing_acquisition_id = None;
        if s.phase == Some(Phase::Pending) {
            s.holder = None;
            s.holder_pod = None;
            s.holder_pod_uid = None;
            s.acquired_at = None;
        }
        self.t.wake_waiters = true;
        self.t.learned = Learned::Forget;
    }
}

/// [`plan::Step::Wait`]: Pending (Error for an invalid spec) until something changes.
pub fn wait(f: &Facts, status: &TargetLeaseStatus, reason: Reason, message: &str) -> Transition {
    let mut d = Draft::new(f, status);
    let phase = if reason == Reason::InvalidSpec {
        Phase::Error
    } else {
        Phase::Pending
    };
    d.warn_on_entering(reason, message);
    d.not_held(phase, reason, message);
    d.applied();
    let next = plan::recheck_after(reason).map_or(Next::AwaitChange, Next::Requeue);
    d.done(next)
}

/// [`plan::Step::Idle`]: nothing due.
pub fn idle(f: &Facts, status: &TargetLeaseStatus) -> Transition {
    Draft::new(f, status).done(Next::Renewal)
}

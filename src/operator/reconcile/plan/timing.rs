//! Pure: when the held lease is renewed, when it is rotated (replaced before
//! its hard end), and when a pass looks again. No clock is read here: the
//! caller passes what it observed.

use std::time::{Duration, Instant};

use kube::runtime::controller::Action;

use super::backoff;
use crate::operator::reconcile::transition::Next;

/// What the timing of the lease status names depends on, observed once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseTiming {
    /// The spec's renew interval.
    pub renew: Duration,
    /// The spec's `maxLifetime`, when it sets one.
    pub max_lifetime: Option<Duration>,
    /// The store's clock now (milliseconds).
    pub server_now_ms: u64,
    /// How long ago the request the store last confirmed this lease to (from
    /// this process) was sent; `None`: never confirmed here.
    pub confirmed_ago: Option<Duration>,
    /// The hard end the store enforces, as its last confirmation said.
    pub enforced_end_ms: Option<u64>,
    /// When the lease was acquired (status `acquiredAt`, milliseconds).
    pub acquired_ms: Option<u64>,
}

/// A renewal is due: the spec is invalid (`None`: the plan releases then),
/// a release was announced on the target (`confirm`), the store has not
/// confirmed the lease to this process within the renew interval (a tenth
/// of it early), or the published expiry is about to pass (`published_ok`
/// false: the keeper renewed it while this reconcile could not publish, so
/// publish a fresh one).
pub fn renew_due(timing: Option<&LeaseTiming>, confirm: bool, published_ok: bool) -> bool {
    let Some(h) = timing else {
        return true;
    };
    confirm
        || h.confirmed_ago
            .is_none_or(|ago| ago + h.renew / 10 >= h.renew)
        || !published_ok
}

/// The hard end of the lease held now: the earliest of what the store
/// enforces (learned from its last answer) and acquisition + the spec's
/// current `maxLifetime` (an edit that adds or shortens it applies to the
/// held lease).
pub fn hard_end_ms(timing: &LeaseTiming) -> Option<u64> {
    let wanted = timing
        .acquired_ms
        .zip(timing.max_lifetime)
        .map(|(at, max)| at + max.as_millis() as u64);
    match (timing.enforced_end_ms, wanted) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The lease's hard end is within one renew interval: replace it now.
pub fn rotation_due(timing: Option<&LeaseTiming>) -> bool {
    timing.is_some_and(|h| {
        hard_end_ms(h).is_some_and(|end| h.server_now_ms + h.renew.as_millis() as u64 >= end)
    })
}

/// How long until the rotation falls due (a renewal never sleeps past it).
pub fn until_rotation(timing: &LeaseTiming) -> Option<Duration> {
    let due = hard_end_ms(timing)?.saturating_sub(timing.renew.as_millis() as u64);
    Some(Duration::from_millis(
        due.saturating_sub(timing.server_now_ms),
    ))
}

/// How long a pass sleeps until the next renewal: the rest of the renew
/// interval since the last confirmation (`confirmed_ago`; none: at once),
/// never past the rotation (`until_rotation`), and never less than a quarter
/// interval (at most 250 ms), so a renewal that keeps coming due at once
/// does not spin.
pub fn until_renewal(
    renew: Duration,
    confirmed_ago: Option<Duration>,
    until_rotation: Option<Duration>,
) -> Duration {
    let wait = confirmed_ago.map_or(Duration::ZERO, |ago| renew.saturating_sub(ago));
    let wait = until_rotation.map_or(wait, |r| wait.min(r));
    let floor = (renew / 4).min(Duration::from_millis(250));
    wait.max(floor)
}

/// When to look again after a transition's [`Next`]: `renewal` is
/// [`until_renewal`], `failures` the consecutive failures so far and
/// `jitter` what adds jitter to a backoff.
pub fn action(
    next: &Next,
    renewal: Duration,
    failures: u32,
    jitter: impl FnOnce(Duration) -> Duration,
) -> Action {
    match next {
        Next::Renewal => Action::requeue(renewal),
        Next::Requeue(d) => Action::requeue(*d),
        Next::Backoff { not_after } => {
            let wait = jitter(backoff(failures.saturating_sub(1)));
            let wait = not_after.map_or(wait, |limit| wait.min(limit + Duration::from_millis(20)));
            Action::requeue(wait)
        }
        Next::AwaitChange => Action::await_change(),
        Next::PlanAgain | Next::Reclaim(_) => Action::requeue(Duration::ZERO),
    }
}

/// A pass that would only renew a published lease on its schedule: its
/// TargetLease is unchanged since the last pass, which asked to look again
/// at `due` to renew (or to rotate it before its hard end).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scheduled {
    /// When the last pass asked to look again.
    pub due: Instant,
    /// The spec's renew interval.
    pub renew: Duration,
    /// The spec's lease duration.
    pub ttl: Duration,
    /// When the published expiry passes (never after the hard end).
    pub expires: Instant,
}

/// By when a pass should get a reconcile slot ([`crate::operator::reconcile::slots`]):
/// at once (`now`), unless it is a renewal on its schedule (`scheduled`,
/// and `now` no earlier than a tenth of an interval before it was due: not
/// woken early by something else). Such a renewal can wait an eighth of
/// the time its lease has left after a renewal interval (half way to when
/// the keeper renews it in the reconcile's place), and never more than an
/// eighth of the time left at `due` before its published expiry (a rotation
/// before the hard end has only a renew interval left), so new TargetLeases
/// and changes go first until then.
pub fn slot_deadline(now: Instant, scheduled: Option<Scheduled>) -> Instant {
    match scheduled {
        Some(s) if now + s.renew / 10 >= s.due => {
            let slack = s.ttl.saturating_sub(s.renew) / 8;
            let left = s.expires.saturating_duration_since(s.due) / 8;
            s.due + slack.min(left)
        }
        _ => now,
    }
}

#[cfg(test)]
mod tests;

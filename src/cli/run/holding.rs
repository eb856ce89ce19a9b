//! Holding the lease for `run`: acquire within the wait, renew until lost, release.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use nix::sys::signal::Signal;
use rand::Rng;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::Signals;
use super::wake::{Waker, Woken};
use crate::cli::output::{Answer, Envelope, Report};
use crate::store::{
    AcquireRequest, Lease, LeaseHandle, LeaseStore, Outcome, ReleaseRequest, RenewRequest, Reply,
    StoreError, Target,
};

/// First pause between acquire attempts while the target is held.
const POLL_MIN: Duration = Duration::from_millis(100);
/// Longest pause between acquire attempts.
const POLL_MAX: Duration = Duration::from_secs(1);

pub(super) async fn bounded(
    backstop: Duration,
    call: impl std::future::Future<Output = Result<Reply, StoreError>>,
) -> Result<Reply, StoreError> {
    tokio::time::timeout(backstop, call)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::OutcomeUnknown(
                "no reply from the store in time".into(),
            ))
        })
}

/// How an attempt to get the lease ended without one.
pub(super) enum NotAcquired {
    Refused(Envelope),
    Usage(String),
    Interrupted(Envelope, Signal),
}

/// The lease as granted, with when it ends by the local monotonic clock.
pub(super) struct Granted {
    pub(super) lease: Lease,
    pub(super) handle: LeaseHandle,
    pub(super) expires: Instant,
}

pub(super) fn granted(reply: Reply, sent: Instant) -> Option<Granted> {
    let lease = reply.lease?;
    let handle = lease.handle()?;
    // Measured from before the request left: the server decided later, so this
    // local estimate can only be early, never late.
    let remaining = lease.expires_at_ms.saturating_sub(reply.server_time_ms);
    Some(Granted {
        expires: sent + Duration::from_millis(remaining),
        lease,
        handle,
    })
}

/// Opens a store (for `run`, a Valkey connection); called again after a
/// failed connect, within the wait.
pub(super) type Connect<'a> =
    &'a (dyn Fn() -> BoxFuture<'static, Result<Arc<dyn LeaseStore>, StoreError>> + Sync);

pub(super) fn jittered(d: Duration) -> Duration {
    d.mul_f64(rand::rng().random_range(0.8..1.2))
}

/// Connects and acquires, retrying with backoff while the target is held or
/// the backend is unreachable (connect included), until `wait` has passed.
/// One request id for the whole loop: a grant whose reply was lost is
/// returned again, and refusals are not cached. A signal ends it at once,
/// whatever it is doing. `waiting` sees every attempt that will be followed
/// by another (to tell a person what it waits for). While the target is
/// held, the waiter asks again only when woken ([`Waker`]): by the store's
/// release notices (subscribed at the first `held` answer) or at the
/// holder's expiry; polling is the fallback when the store cannot announce.
pub(super) async fn acquire_within(
    connect: Connect<'_>,
    req: &AcquireRequest,
    wait: Duration,
    backstop: Duration,
    signals: &mut Signals,
    waiting: &mut (dyn FnMut(&Envelope) + Send),
) -> Result<(Arc<dyn LeaseStore>, Granted), NotAcquired> {
    let deadline = Instant::now() + wait;
    let mut waker = Waker::default();
    let mut delay = POLL_MIN;
    let mut unknown_retries = 0;
    let mut store: Option<Arc<dyn LeaseStore>> = None;
    // Set once an attempt may have run: later definite failures of other
    // attempts do not undo that.
    let mut maybe_ran: Option<String> = None;
    loop {
        let sent = Instant::now();
        let acquiring = AtomicBool::new(false);
        let attempt = async {
            let s = match &store {
                Some(s) => s.clone(),
                None => connect().await?,
            };
            acquiring.store(true, Ordering::SeqCst);
            let r = bounded(backstop, s.acquire(req)).await;
            Ok::<_, StoreError>((s, r))
        };
        let result = tokio::select! {
            r = attempt => r,
            sig = signals.recv() => {
                let in_flight = acquiring.load(Ordering::SeqCst);
                let (status, what) = if in_flight || maybe_ran.is_some() {
                    (Answer::OutcomeUnknown, "an acquire may have gone through")
                } else {
                    (Answer::BackendUnavailable, "nothing was acquired")
                };
                let env = Envelope::from_backend_error(
                    status,
                    format!(
                        "interrupted by {sig} before the lease was acquired; {what} \
                         (a grant whose reply was cut off expires after its ttl)"
                    ),
                );
                return Err(NotAcquired::Interrupted(env, sig));
            }
        };
        let last = match result {
            Ok((s, Ok(reply))) if reply.outcome == Outcome::Acquired => {
                let envelope_if_bad = Envelope::from_reply(reply.clone());
                return granted(reply, sent).map(|g| (s, g)).ok_or_else(|| {
                    let mut e = envelope_if_bad;
                    e.message = "acquired reply carried no lease id".into();
                    NotAcquired::Refused(e)
                });
            }
            Ok((s, Ok(reply))) if reply.outcome == Outcome::Held => {
                let left = deadline.saturating_duration_since(Instant::now());
                store = Some(s.clone());
                // (`--wait 0s` / `-n` will not wait: nothing to subscribe for.)
                if !left.is_zero() && waker.subscribe_once(&*s, &req.target, left).await {
                    continue;
                }
                waker.held(&reply, sent);
                Envelope::from_reply(reply)
            }
            Ok((_, Ok(reply))) => return Err(NotAcquired::Refused(Envelope::from_reply(reply))),
            Ok((s, Err(e))) => {
                store = Some(s);
                envelope_or_usage(e).map_err(NotAcquired::Usage)?
            }
            Err(e) => envelope_or_usage(e).map_err(NotAcquired::Usage)?,
        };
        let last = still_unknown(&mut maybe_ran, last);
        let now = Instant::now();
        // A lost reply may have granted us the lease: resolve it with the same
        // request id a couple of times even past the deadline.
        let resolve = last.answer() == Answer::OutcomeUnknown && unknown_retries < 2;
        if now >= deadline && !resolve {
            return Err(NotAcquired::Refused(last));
        }
        if resolve {
            unknown_retries += 1;
        }
        waiting(&last);
        tracing::debug!(outcome = last.outcome, "target not acquired yet; waiting");
        let held = last.answer() == Answer::Store(Outcome::Held);
        let timer = if now >= deadline {
            now + POLL_MIN
        } else if held && waker.subscribed() {
            // Notices and the lease's expiry wake it; nothing to poll.
            deadline
        } else {
            now + jittered(delay).min(deadline - now)
        };
        tokio::select! {
            woken = waker.wait(timer) => match woken {
                Woken::Notice(n) => tracing::debug!(notice = ?n, "woken by a release notification"),
                Woken::Expiry => tracing::debug!("woken at the lease's expiry"),
                Woken::Timer | Woken::NoticesEnded => {}
            },
            sig = signals.recv() => {
                let mut env = last;
                env.message = format!("interrupted by {sig} while waiting for the lease");
                return Err(NotAcquired::Interrupted(env, sig));
            }
        }
        delay = (delay * 2).min(POLL_MAX);
    }
}

/// Keeps `outcome_unknown` once any attempt of one request id may have run:
/// a later attempt that was not sent, or was refused before running
/// (`backend_unavailable`), says nothing about the earlier one.
fn still_unknown(maybe_ran: &mut Option<String>, last: Envelope) -> Envelope {
    match (last.answer(), maybe_ran.as_ref()) {
        (Answer::OutcomeUnknown, _) => {
            *maybe_ran = Some(last.message.clone());
            last
        }
        (Answer::BackendUnavailable, Some(earlier)) => Envelope::from_backend_error(
            Answer::OutcomeUnknown,
            format!(
                "{}; an earlier attempt may have gone through ({earlier})",
                last.message
            ),
        ),
        _ => last,
    }
}

/// The envelope of a failed attempt, or the usage message of a request that can never work.
fn envelope_or_usage(e: StoreError) -> Result<Envelope, String> {
    match Report::from(e) {
        Report::Usage(msg) => Err(msg),
        Report::Envelope(env) => Ok(env),
    }
}

/// Keeps the lease alive until it is lost; then reports why and returns.
///
/// A renew whose outcome is unknown, or which cannot reach the backend, is
/// retried with the same request id until the lease's local expiry estimate
/// passes; only then is the lease presumed lost.
pub(super) async fn renew_until_lost(
    store: Arc<dyn LeaseStore>,
    target: Target,
    granted: Granted,
    ttl: Duration,
    lost: oneshot::Sender<Envelope>,
) {
    let handle = granted.handle;
    let mut expires = granted.expires;
    let mut period = ttl / 3;
    let mut next =
        Instant::now() + period.min(expires.saturating_duration_since(Instant::now()) / 3);
    let retry = (ttl / 10).clamp(Duration::from_millis(20), POLL_MAX);
    loop {
        tokio::time::sleep_until(next).await;
        let req = RenewRequest::new(target.clone(), handle.clone(), ttl);
        let mut maybe_ran: Option<String> = None;
        loop {
            let sent = Instant::now();
            let result = match tokio::time::timeout_at(expires, store.renew(&req)).await {
                Ok(r) => r,
                Err(_) => Err(StoreError::OutcomeUnknown(
                    "no renewal confirmed before the lease expired".into(),
                )),
            };
            match result {
                Ok(reply) if reply.outcome == Outcome::Renewed => {
                    if let Some(g) = granted_after_renew(reply, sent, &handle) {
                        expires = g;
                    }
                    let remaining = expires.saturating_duration_since(Instant::now());
                    period = (ttl / 3).min(remaining / 3).max(Duration::from_millis(10));
                    next = sent + period;
                    tracing::debug!(target = %target.name, "lease renewed");
                    break;
                }
                Ok(reply) => {
                    tracing::warn!(target = %target.name, outcome = %reply.outcome, "lease lost");
                    let _ = lost.send(Envelope::from_reply(reply));
                    return;
                }
                Err(e) => {
                    let now = Instant::now();
                    if now >= expires {
                        tracing::warn!(target = %target.name, error = e.category(), "lease lost: renewal not confirmed before expiry");
                        let env = match Report::from(e) {
                            Report::Envelope(env) => {
                                let mut env = still_unknown(&mut maybe_ran, env);
                                env.message = format!(
                                    "lease presumed lost: no renewal confirmed before it expired ({})",
                                    env.message
                                );
                                env
                            }
                            Report::Usage(msg) => {
                                Envelope::from_backend_error(Answer::BackendUnavailable, msg)
                            }
                        };
                        let _ = lost.send(env);
                        return;
                    }
                    if let StoreError::OutcomeUnknown(why) = &e {
                        maybe_ran = Some(why.clone());
                    }
                    tracing::warn!(target = %target.name, error = e.category(), "renewal failed; retrying");
                    tokio::time::sleep(retry.min(expires - now)).await;
                }
            }
        }
    }
}

pub(super) fn granted_after_renew(
    reply: Reply,
    sent: Instant,
    handle: &LeaseHandle,
) -> Option<Instant> {
    let lease = reply.lease?;
    if lease.fencing_token != handle.token {
        return None;
    }
    let remaining = lease.expires_at_ms.saturating_sub(reply.server_time_ms);
    Some(sent + Duration::from_millis(remaining))
}

/// Releases the lease, retrying an unknown outcome with the same request id.
/// A signal stops it at once: the lease then simply expires after its ttl.
pub(super) async fn release(
    store: &dyn LeaseStore,
    target: &Target,
    handle: &LeaseHandle,
    backstop: Duration,
    signals: &mut Signals,
) -> Result<Reply, StoreError> {
    let req = ReleaseRequest::new(target.clone(), handle.clone());
    let attempts = async {
        let mut result = bounded(backstop, store.release(&req)).await;
        let mut maybe_ran = None;
        for _ in 0..2 {
            match result {
                Err(StoreError::OutcomeUnknown(why)) => maybe_ran = Some(why),
                Err(StoreError::BackendUnavailable(_)) => {}
                _ => break,
            }
            tokio::time::sleep(POLL_MIN).await;
            result = bounded(backstop, store.release(&req)).await;
        }
        // A release that may have gone through stays unknown (see still_unknown).
        match (result, maybe_ran) {
            (Err(StoreError::BackendUnavailable(now)), Some(earlier)) => {
                Err(StoreError::OutcomeUnknown(format!(
                    "{now}; an earlier attempt may have gone through ({earlier})"
                )))
            }
            (result, _) => result,
        }
    };
    tokio::select! {
        result = attempts => result,
        sig = signals.recv() => Err(StoreError::OutcomeUnknown(format!(
            "release interrupted by {sig}; if it did not go through, the lease expires after its ttl"
        ))),
    }
}

#[cfg(test)]
mod tests;

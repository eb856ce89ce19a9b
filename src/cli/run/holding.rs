//! Holding the lease for `run`: acquire within the wait, renew until lost, release.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use rand::Rng;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::Signals;
use crate::cli::output::{Envelope, Report, Status};
use crate::store::valkey::ValkeyStore;
use crate::store::{
    AcquireRequest, Holder, Lease, LeaseStore, Outcome, ReleaseRequest, RenewRequest, Reply,
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
                "no reply from valkey in time".into(),
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
    pub(super) holder: Holder,
    pub(super) expires: Instant,
}

pub(super) fn granted(reply: Reply, sent: Instant) -> Option<Granted> {
    let lease = reply.lease?;
    let holder = lease.holder()?;
    // Measured from before the request left: the server decided later, so this
    // local estimate can only be early, never late.
    let remaining = lease.expires_at_ms.saturating_sub(reply.server_time_ms);
    Some(Granted {
        expires: sent + Duration::from_millis(remaining),
        lease,
        holder,
    })
}

pub(super) fn jittered(d: Duration) -> Duration {
    d.mul_f64(rand::rng().random_range(0.8..1.2))
}

/// Acquires, retrying with backoff while the target is held or the backend
/// is unreachable, until `wait` has passed. One request id for the whole
/// loop: a grant whose reply was lost is returned again, and refusals are
/// not cached.
pub(super) async fn acquire_within(
    store: &ValkeyStore,
    req: &AcquireRequest,
    wait: Duration,
    backstop: Duration,
    signals: &mut Signals,
) -> Result<Granted, NotAcquired> {
    let deadline = Instant::now() + wait;
    let mut delay = POLL_MIN;
    let mut unknown_retries = 0;
    loop {
        let sent = Instant::now();
        let last = match bounded(backstop, store.acquire(req)).await {
            Ok(reply) if reply.outcome == Outcome::Acquired => {
                let envelope_if_bad = Envelope::from_reply(reply.clone());
                return granted(reply, sent).ok_or_else(|| {
                    let mut e = envelope_if_bad;
                    e.message = "acquired reply carried no lease id".into();
                    NotAcquired::Refused(e)
                });
            }
            Ok(reply) if reply.outcome == Outcome::Held => Envelope::from_reply(reply),
            Ok(reply) => return Err(NotAcquired::Refused(Envelope::from_reply(reply))),
            Err(e) => match Report::from(e) {
                Report::Usage(msg) => return Err(NotAcquired::Usage(msg)),
                Report::Envelope(env) => env,
            },
        };
        let now = Instant::now();
        // A lost reply may have granted us the lease: resolve it with the same
        // request id a couple of times even past the deadline.
        let resolve = last.status() == Status::OutcomeUnknown && unknown_retries < 2;
        if now >= deadline && !resolve {
            return Err(NotAcquired::Refused(last));
        }
        if resolve {
            unknown_retries += 1;
        }
        tracing::debug!(outcome = last.outcome, "target not acquired yet; waiting");
        let pause = if now >= deadline {
            POLL_MIN
        } else {
            jittered(delay).min(deadline - now)
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            sig = signals.recv() => {
                let mut env = last;
                env.message = format!("interrupted by {sig} while waiting for the lease");
                return Err(NotAcquired::Interrupted(env, sig));
            }
        }
        delay = (delay * 2).min(POLL_MAX);
    }
}

/// Keeps the lease alive until it is lost; then reports why and returns.
///
/// A renew whose outcome is unknown, or which cannot reach the backend, is
/// retried with the same request id until the lease's local expiry estimate
/// passes; only then is the lease presumed lost.
pub(super) async fn renew_until_lost(
    store: Arc<ValkeyStore>,
    target: Target,
    granted: Granted,
    ttl: Duration,
    lost: oneshot::Sender<Envelope>,
) {
    let holder = granted.holder;
    let mut expires = granted.expires;
    let mut period = ttl / 3;
    let mut next =
        Instant::now() + period.min(expires.saturating_duration_since(Instant::now()) / 3);
    let retry = (ttl / 10).clamp(Duration::from_millis(20), POLL_MAX);
    loop {
        tokio::time::sleep_until(next).await;
        let req = RenewRequest::new(target.clone(), holder.clone(), ttl);
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
                    if let Some(g) = granted_after_renew(reply, sent, &holder) {
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
                            Report::Envelope(mut env) => {
                                env.message = format!(
                                    "lease presumed lost: no renewal confirmed before it expired ({})",
                                    env.message
                                );
                                env
                            }
                            Report::Usage(msg) => {
                                Envelope::from_backend_error(Status::BackendUnavailable, msg)
                            }
                        };
                        let _ = lost.send(env);
                        return;
                    }
                    tracing::warn!(target = %target.name, error = e.category(), "renewal failed; retrying");
                    tokio::time::sleep(retry.min(expires - now)).await;
                }
            }
        }
    }
}

pub(super) fn granted_after_renew(reply: Reply, sent: Instant, holder: &Holder) -> Option<Instant> {
    let lease = reply.lease?;
    if lease.fencing_token != holder.token {
        return None;
    }
    let remaining = lease.expires_at_ms.saturating_sub(reply.server_time_ms);
    Some(sent + Duration::from_millis(remaining))
}

/// Releases the lease, retrying an unknown outcome with the same request id.
pub(super) async fn release(
    store: &ValkeyStore,
    target: &Target,
    holder: &Holder,
    backstop: Duration,
) -> Result<Reply, StoreError> {
    let req = ReleaseRequest::new(target.clone(), holder.clone());
    let mut result = bounded(backstop, store.release(&req)).await;
    for _ in 0..2 {
        match &result {
            Err(StoreError::OutcomeUnknown(_)) | Err(StoreError::BackendUnavailable(_)) => {
                tokio::time::sleep(POLL_MIN).await;
                result = bounded(backstop, store.release(&req)).await;
            }
            _ => break,
        }
    }
    result
}

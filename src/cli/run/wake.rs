//! When a waiting `run` asks again for a held target: when the store
//! announces that the target may be free (its release notices: Valkey
//! pub/sub, an etcd Watch), when the holder's lease is due to end, and, only
//! when the store cannot announce, at its next poll.

use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use crate::store::{LeaseStore, Notice, Notices, Reply, Target};

/// How long after the holder's expiry (as its `held` answer reported it)
/// the waiter asks again: the estimate is made from before the request
/// left, so it is early by up to a round trip.
const EXPIRY_MARGIN: Duration = Duration::from_millis(10);

/// What ended a wait.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Woken {
    /// The store announced something about the target.
    Notice(Notice),
    /// The holder's lease was due to end.
    Expiry,
    /// The poll (or the wait's deadline) came due.
    Timer,
    /// The notices ended: from now on the waiter polls.
    NoticesEnded,
}

/// A waiter's ways of being woken.
#[derive(Default)]
pub(super) struct Waker {
    notices: Option<Notices>,
    tried: bool,
    /// When the holder's lease ends (plus the margin), and which lease that is.
    expiry: Option<(Instant, (u64, u64))>,
    /// The lease whose expiry already woke the waiter once.
    fired: Option<(u64, u64)>,
}

impl Waker {
    /// Whether release notices wake this waiter (otherwise it polls).
    pub(super) fn subscribed(&self) -> bool {
        self.notices.is_some()
    }

    /// At the first `held` answer: subscribes to the target's release
    /// notices (within `left`) and logs which way the waiter is woken. True
    /// when it just subscribed: ask again at once, since a release between
    /// that answer and the subscription was announced to nobody.
    pub(super) async fn subscribe_once(
        &mut self,
        store: &dyn LeaseStore,
        target: &Target,
        left: Duration,
    ) -> bool {
        if std::mem::replace(&mut self.tried, true) {
            return false;
        }
        match tokio::time::timeout(left, store.notices(target)).await {
            Ok(Ok(n)) => {
                tracing::info!(
                    target = %target.name,
                    "waiting for a release notification: woken when the target is \
                     released, revoked or expires, without polling"
                );
                self.notices = Some(n);
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(
                    target = %target.name,
                    error = %e,
                    "no release notifications; polling the target (100ms growing to 1s apart)"
                );
                false
            }
            Err(_) => {
                tracing::warn!(
                    target = %target.name,
                    "no release notifications in time; polling the target (100ms growing to 1s apart)"
                );
                false
            }
        }
    }

    /// Remembers when the holder's lease ends, from a `held` answer to a
    /// request sent at `sent`: the waiter asks again then (an expiry is not
    /// announced by every store). A lease whose expiry already woke the
    /// waiter and that is still there (etcd may keep a record past the
    /// holder's deadline) sets no timer again: its end is announced.
    pub(super) fn held(&mut self, reply: &Reply, sent: Instant) {
        self.expiry = reply.lease.as_ref().and_then(|l| {
            let id = (l.fencing_token, l.expires_at_ms);
            let remaining = l.expires_at_ms.saturating_sub(reply.server_time_ms);
            (self.fired != Some(id))
                .then(|| (sent + Duration::from_millis(remaining) + EXPIRY_MARGIN, id))
        });
    }

    /// Waits for the first of: a notice, the holder's expiry, `timer`.
    pub(super) async fn wait(&mut self, timer: Instant) -> Woken {
        let expiry = self.expiry.map(|(at, _)| at).filter(|at| *at < timer);
        let notice = async {
            match &mut self.notices {
                Some(n) => n.next().await,
                None => std::future::pending().await,
            }
        };
        let woken = tokio::select! {
            n = notice => match n {
                Some(n) => Woken::Notice(n),
                None => Woken::NoticesEnded,
            },
            _ = tokio::time::sleep_until(expiry.unwrap_or(timer)) => {
                if expiry.is_some() { Woken::Expiry } else { Woken::Timer }
            }
        };
        match woken {
            Woken::Expiry => self.fired = self.expiry.take().map(|(_, id)| id),
            Woken::NoticesEnded => {
                self.notices = None;
                tracing::warn!("release notifications ended; polling the target from now on");
            }
            _ => {}
        }
        woken
    }
}

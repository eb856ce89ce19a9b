//! Release notices on etcd: a Watch on one target's lease record (a CLI
//! waiter) or on every lease record (the operator) that reports only
//! deletions. A record is deleted by a release, by a revoke, and by etcd
//! itself when the record's etcd lease expires, so one watch sees all
//! three; renewals and acquisitions are puts, filtered out by etcd.
//!
//! The watch is made again when its stream breaks (a member lost, no
//! leader), from the revision after the last one it saw, so nothing
//! deleted in between is missed; if that revision was compacted away, it
//! is made from the current revision and the waiter is told it may have
//! missed a notice ([`Notice::Resubscribed`]).

use std::time::Duration;

use etcd_client::{WatchClient, WatchFilterType, WatchOptions, WatchStream};
use futures::StreamExt;
use futures::stream::BoxStream;
use rand::Rng;
use tokio::sync::mpsc;

use super::KeySpace;
use crate::store::{Notice, Notices, StoreError, Target};

/// Longest pause between attempts to make the watch again.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// A confirmed watch and the revision it sees events from.
struct Watching {
    stream: WatchStream,
    from: i64,
}

/// Why a watch could not be made.
enum Refused {
    /// The requested start revision was compacted away.
    Compacted,
    /// Anything else: the reason.
    Other(String),
}

/// What is watched: one key, or every key under a prefix.
#[derive(Clone)]
struct Watched {
    key: String,
    prefix: bool,
}

/// What the watch heard.
enum Heard {
    /// This key was deleted.
    Deleted(Vec<u8>),
    /// The watch was made again from the current revision (the one to
    /// resume from was compacted away): deletions may have been missed.
    Resubscribed,
}

/// Watches `key` for deletions from now on; the watch is confirmed by etcd
/// (within `timeout`) before this returns.
pub(super) async fn notices(
    client: WatchClient,
    key: String,
    timeout: Duration,
) -> Result<Notices, StoreError> {
    let rx = start(client, Watched { key, prefix: false }, timeout).await?;
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        let notice = match rx.recv().await? {
            Heard::Deleted(_) => Notice::Freed,
            Heard::Resubscribed => Notice::Resubscribed,
        };
        Some((notice, rx))
    });
    Ok(stream.boxed())
}

/// Every target whose lease record is deleted from now on (released,
/// revoked or expired), as the operator's waiters want them. A missed
/// stretch (compaction) is not announced: those waiters also re-check on
/// their own.
pub(super) async fn release_notices(
    client: WatchClient,
    keys: KeySpace,
    timeout: Duration,
) -> Result<BoxStream<'static, Target>, StoreError> {
    let watched = Watched {
        key: keys.range_prefix("lease", None, ""),
        prefix: true,
    };
    let rx = start(client, watched, timeout).await?;
    let stream = futures::stream::unfold((rx, keys), |(mut rx, keys)| async move {
        loop {
            if let Heard::Deleted(key) = rx.recv().await?
                && let Some(target) = keys.target_of("lease", &key)
            {
                return Some((target, (rx, keys)));
            }
        }
    });
    Ok(stream.boxed())
}

/// Makes the first watch (confirmed within `timeout`) and the task that
/// keeps it going; the receiver hears what it sees.
async fn start(
    mut client: WatchClient,
    watched: Watched,
    timeout: Duration,
) -> Result<mpsc::Receiver<Heard>, StoreError> {
    let first = match tokio::time::timeout(timeout, open(&mut client, &watched, None)).await {
        Ok(Ok(w)) => w,
        Ok(Err(Refused::Other(why))) => {
            return Err(StoreError::BackendUnavailable(format!(
                "watch refused: {why}"
            )));
        }
        Ok(Err(Refused::Compacted)) => {
            return Err(StoreError::BackendUnavailable(
                "watch refused: compacted".into(),
            ));
        }
        Err(_) => {
            return Err(StoreError::BackendUnavailable(format!(
                "no watch confirmed within {}",
                humantime::format_duration(timeout)
            )));
        }
    };
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(pump(client, watched, first, timeout, tx));
    Ok(rx)
}

/// Opens a watch of deletions of what is `watched` from revision `start`
/// (now when `None`) and waits for etcd to confirm it.
async fn open(
    client: &mut WatchClient,
    watched: &Watched,
    start: Option<i64>,
) -> Result<Watching, Refused> {
    let mut options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
    if watched.prefix {
        options = options.with_prefix();
    }
    if let Some(rev) = start {
        options = options.with_start_revision(rev);
    }
    let mut stream = client
        .watch(watched.key.as_str(), Some(options))
        .await
        .map_err(|e| Refused::Other(e.to_string()))?;
    match stream.message().await {
        Ok(Some(r)) if r.created() && !r.canceled() => {
            let now = r.header().map_or(0, |h| h.revision());
            Ok(Watching {
                stream,
                from: start.unwrap_or(now + 1),
            })
        }
        Ok(Some(r)) if r.compact_revision() > 0 => Err(Refused::Compacted),
        Ok(Some(r)) => Err(Refused::Other(format!(
            "watch not created ({})",
            r.cancel_reason()
        ))),
        Ok(None) => Err(Refused::Other("watch stream ended".into())),
        Err(e) => Err(Refused::Other(e.to_string())),
    }
}

/// Forwards deletions until the receiver is gone, making the watch again
/// whenever it ends.
async fn pump(
    mut client: WatchClient,
    watched: Watched,
    first: Watching,
    timeout: Duration,
    tx: mpsc::Sender<Heard>,
) {
    let mut watching = Some(first);
    let mut next = 0;
    let mut compacted = false;
    let mut delay = Duration::from_millis(100);
    loop {
        let Some(mut w) = watching.take() else {
            let start = (!compacted).then_some(next);
            match tokio::time::timeout(timeout, open(&mut client, &watched, start)).await {
                Ok(Ok(w)) => {
                    delay = Duration::from_millis(100);
                    if compacted {
                        compacted = false;
                        if tx.send(Heard::Resubscribed).await.is_err() {
                            return;
                        }
                    }
                    watching = Some(w);
                }
                Ok(Err(Refused::Compacted)) => compacted = true,
                Ok(Err(Refused::Other(why))) => {
                    tracing::debug!(error = %why, "release watch: cannot watch again yet");
                    if !backoff(&mut delay, &tx).await {
                        return;
                    }
                }
                Err(_) => {
                    if !backoff(&mut delay, &tx).await {
                        return;
                    }
                }
            }
            continue;
        };
        next = w.from;
        let why = loop {
            tokio::select! {
                msg = w.stream.message() => match msg {
                    Ok(Some(r)) => {
                        if r.canceled() {
                            compacted = r.compact_revision() > 0;
                            break format!("watch canceled ({})", r.cancel_reason());
                        }
                        // Only deletions are sent (puts are filtered out).
                        for event in r.events() {
                            let Some(kv) = event.kv() else { continue };
                            next = next.max(kv.mod_revision() + 1);
                            if tx.send(Heard::Deleted(kv.key().to_vec())).await.is_err() {
                                return;
                            }
                        }
                    }
                    Ok(None) => break "watch stream ended".to_owned(),
                    Err(e) => break e.to_string(),
                },
                _ = tx.closed() => return,
            }
        };
        tracing::debug!(why = %why, "release watch: lost; watching again");
    }
}

/// Waits before the next attempt (false: nobody listens any more).
async fn backoff(delay: &mut Duration, tx: &mpsc::Sender<Heard>) -> bool {
    let pause = delay.mul_f64(rand::rng().random_range(0.8..1.2));
    *delay = (*delay * 2).min(RETRY_MAX);
    tokio::select! {
        _ = tokio::time::sleep(pause) => true,
        _ = tx.closed() => false,
    }
}

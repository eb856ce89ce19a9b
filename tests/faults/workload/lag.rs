//! The failover's lag-window holder: a library client whose renewal falls
//! inside the window in which the replica misses the primary's writes.
//!
//! Told a failover is coming ([`Cue::Take`]), it takes a free target and
//! holds it, writing; told the lag has begun ([`Cue::Renew`]), it renews
//! before the primary dies, then keeps acting until a second before its new
//! deadline (no other renewal is due) and releases. Under `--durability
//! none` the renewal is acknowledged and lost with the primary: the
//! promoted replica lets the lease expire at its earlier expiry and grants
//! the target again, while this holder still claims it — the overlap (d)
//! measures, the expected cost of `none`. With `replicas:1` the renewal is
//! never acknowledged inside the window (`WAIT` gets no replica), so the
//! holder stops acting on the lease. The administrator does not revoke its
//! lease (`revoker.rs`): a revoke would end the claim before the failover.
//!
//! Inside the same window it also takes a target of its own (`lag-N`, new
//! for each failover), and takes it again once the failover is over. Under
//! `--durability none` (or `replicas:1` without its `WAIT`) the first grant
//! is acknowledged and lost, so the promoted replica's counter issues its
//! token a second time: the reissue (a) measures, on every failover rather
//! than whenever a workload client happened to acquire in the window. With
//! `replicas:1` the first grant is never acknowledged, and a token nobody
//! was told of binds nothing across the loss.

use std::time::{Duration, Instant};

use tokio::sync::watch;

use targetlease::store::Target;

use super::client::Client;
use crate::scenarios::{LAG_GRANTED, LAG_RENEWALS, LAG_RENEWED};

/// What the failover tells the lag-window holder.
#[derive(Clone, Copy, Debug)]
pub enum Cue {
    /// A failover is coming: its lag begins at this instant.
    Take(Instant),
    /// The lag has begun: the primary dies at this instant.
    Renew(Instant),
}

/// How long before its lag begins a failover tells the holder to take a
/// target: the promoted replica lets the lease expire this much (less the
/// time taken) before the renewal's deadline, so the claims overlap then.
pub const TAKE_AHEAD: Duration = Duration::from_secs(3);

/// How long before its deadline the holder stops acting on the lease.
const MARGIN: Duration = Duration::from_secs(1);

/// How long after the lag window the holder tries to take its own target
/// again (past Sentinel's down-after and the promotion).
const AGAIN_FOR: Duration = Duration::from_secs(15);

/// Waits for the next cue (None: the run is over).
async fn next(client: &Client, cue: &mut watch::Receiver<Option<Cue>>) -> Option<Cue> {
    while !client.stop.is_set() {
        match tokio::time::timeout(Duration::from_millis(100), cue.changed()).await {
            Ok(Ok(())) => {
                if let Some(c) = *cue.borrow_and_update() {
                    return Some(c);
                }
            }
            Ok(Err(_)) => return None,
            Err(_) => {}
        }
    }
    None
}

impl Client {
    /// Runs the lag-window holder until the run stops.
    pub async fn hold_across_failovers(mut self, mut cue: watch::Receiver<Option<Cue>>) {
        let mut writes = 0_u64;
        let mut failovers = 0_u64;
        while let Some(c) = next(&self, &mut cue).await {
            // A cue that came while the last lease was held is stale.
            let Cue::Take(lag_at) = c else { continue };
            let mut held = None;
            'take: while Instant::now() + Duration::from_millis(300) < lag_at {
                for target in self.targets.clone() {
                    held = self.acquire(&target).await;
                    if held.is_some() {
                        break 'take;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let Some(mut held) = held else { continue };
            // Acting on the lease until the lag begins.
            let renew_by = loop {
                if let Some(Cue::Renew(by)) = *cue.borrow() {
                    break Some(by);
                }
                if Instant::now() > lag_at + Duration::from_secs(2) || self.stop.is_set() {
                    break None;
                }
                writes += 1;
                let id = format!("{}-{writes}", self.name);
                self.write(&held, &id).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            let Some(renew_by) = renew_by else {
                self.release(&held).await;
                continue;
            };
            self.rec.effect(LAG_RENEWALS, 1);
            let renewed = self.renew(&held).await;
            if renewed.is_some() && Instant::now() < renew_by {
                self.rec.effect(LAG_RENEWED, 1);
            }
            failovers += 1;
            let own = Target::new(&held.target.namespace, format!("lag-{failovers}"));
            let granted = self.acquire(&own).await;
            if granted.is_some() && Instant::now() < renew_by {
                self.rec.effect(LAG_GRANTED, 1);
            }
            // Not renewed (or unknown): a careful holder stops acting.
            if let Some(deadline) = renewed {
                held.deadline = deadline;
                while Instant::now() + MARGIN < held.deadline && !self.stop.is_set() {
                    writes += 1;
                    let id = format!("{}-{writes}", self.name);
                    self.write(&held, &id).await;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                self.release(&held).await;
            }
            // Let go of the first grant (if it survived, the next acquire
            // succeeds at once instead of waiting out its ttl and the next
            // failover's cue), then take the target again.
            if let Some(first) = granted {
                self.release(&first).await;
                self.take_again(&own, renew_by + AGAIN_FOR).await;
            }
        }
    }

    /// Takes `target` again once the failover is over (until `by`), and
    /// lets it go.
    async fn take_again(&self, target: &Target, by: Instant) {
        while Instant::now() < by && !self.stop.is_set() {
            if let Some(held) = self.acquire(target).await {
                self.release(&held).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

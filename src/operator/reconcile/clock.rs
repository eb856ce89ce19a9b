//! Valkey's clock as the operator estimates it, never behind it.
//!
//! A reply carries the server's `TIME` as the script read it, some moment
//! after the request was sent and before the reply arrived (a durability wait
//! and queueing come after it). Paired with the instant the request was
//! *sent*, it bounds the server's clock from above: at any later instant `t`
//! the server's clock is at most `server_ms + (t - sent)`. Each reply is such
//! an anchor, too high by the time its request waited before the server read
//! its clock. The estimate is the highest anchor of the last [`WINDOW`] (the
//! latest one when none is that recent), so expiry is never judged later than
//! Valkey judges it — Held is withdrawn and renewals are sent early rather
//! than late, also right after a failover to a primary whose clock is ahead —
//! while one request that waited long (a stalled server, a reconnect) sets it
//! early for [`WINDOW`] only, not for the rest of the process. (Rates are
//! assumed equal: the monotonic clock and Valkey's do not drift apart
//! measurably within a lease duration.)

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long an anchor that says more than the later ones keeps the estimate up.
pub const WINDOW: Duration = Duration::from_secs(5);

/// The estimate, shared by every reconcile and the keeper of one process.
#[derive(Debug)]
pub struct ServerClock {
    origin: Instant,
    /// Anchors as (recorded at, server microseconds at `origin`): the highest
    /// of the last [`WINDOW`], each followed only by later, lower ones (a
    /// sliding-window maximum: the front is the estimate).
    anchors: Mutex<VecDeque<(Instant, i128)>>,
}

impl Default for ServerClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerClock {
    /// A clock that knows nothing yet.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            anchors: Mutex::new(VecDeque::new()),
        }
    }

    fn since_origin_us(&self, t: Instant) -> i128 {
        match t.checked_duration_since(self.origin) {
            Some(d) => d.as_micros() as i128,
            None => -(self.origin.duration_since(t).as_micros() as i128),
        }
    }

    /// The server answered `server_ms` to a request sent at `sent`.
    pub fn anchor(&self, server_ms: u64, sent: Instant) {
        self.anchor_at(server_ms, sent, Instant::now());
    }

    fn anchor_at(&self, server_ms: u64, sent: Instant, now: Instant) {
        let candidate = i128::from(server_ms) * 1000 - self.since_origin_us(sent);
        let mut anchors = self.anchors.lock().unwrap_or_else(|p| p.into_inner());
        while anchors.back().is_some_and(|&(_, c)| c <= candidate) {
            anchors.pop_back();
        }
        anchors.push_back((now, candidate));
        while anchors.len() > 1
            && anchors
                .front()
                .is_some_and(|&(at, _)| now.saturating_duration_since(at) > WINDOW)
        {
            anchors.pop_front();
        }
    }

    /// True once the server has answered.
    pub fn is_anchored(&self) -> bool {
        !self
            .anchors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// The server's clock at `t` (rounded up), once it has answered.
    pub fn at(&self, t: Instant) -> Option<u64> {
        let base = {
            let mut anchors = self.anchors.lock().unwrap_or_else(|p| p.into_inner());
            // Expired anchors go here too: the latest one always stays.
            while anchors.len() > 1
                && anchors
                    .front()
                    .is_some_and(|&(at, _)| t.saturating_duration_since(at) > WINDOW)
            {
                anchors.pop_front();
            }
            anchors.front()?.1
        };
        let us = base + self.since_origin_us(t);
        Some(u64::try_from((us + 999).div_euclid(1000)).unwrap_or(0))
    }

    /// The server's clock now; the local wall clock before the server ever answered.
    pub fn now_ms(&self) -> u64 {
        self.at(Instant::now()).unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);

    /// A reply whose server time was read 10 ms after it was sent, then held
    /// back 1.5 s by a durability wait: anchored at the receipt the estimate
    /// would run 1.5 s late; anchored at the send it is 10 ms early.
    #[test]
    fn a_delayed_reply_never_makes_the_estimate_late() {
        let clock = ServerClock::new();
        let sent = Instant::now();
        let server_at_sent = 1_000_000u64;
        clock.anchor(server_at_sent + 10, sent);
        let received = sent + 1510 * MS;
        let truth = server_at_sent + 1510;
        let estimate = clock.at(received).unwrap();
        assert!(estimate >= truth, "{estimate} < {truth}");
        assert_eq!(estimate, truth + 10);
    }

    #[test]
    fn the_latest_anchor_wins_whatever_order_replies_arrive_in() {
        let clock = ServerClock::new();
        let t0 = Instant::now();
        // A fast reply sent later, then a slow reply sent earlier that says less.
        clock.anchor(5_000 + 205, t0 + 200 * MS);
        clock.anchor(5_000 + 3, t0);
        assert_eq!(clock.at(t0 + 1000 * MS), Some(5_000 + 1005));
        // A later anchor that says more moves the estimate on.
        clock.anchor(5_000 + 1400, t0 + 1000 * MS);
        assert_eq!(clock.at(t0 + 1000 * MS), Some(5_000 + 1400));
    }

    /// A request that waited 1.9 s before the server read its clock (a stall)
    /// sets the estimate 1.9 s early; prompt replies after it bring it back
    /// once that anchor is older than the window, and it is never late.
    #[test]
    fn one_slow_reply_sets_the_estimate_early_for_the_window_only() {
        let clock = ServerClock::new();
        let t0 = Instant::now();
        let truth = |t: Instant| 10_000 + t.duration_since(t0).as_millis() as u64;
        // Sent at t0, read by the server 1.9 s later, answered at once.
        clock.anchor_at(truth(t0 + 1900 * MS), t0, t0 + 1900 * MS);
        for k in 0..100u32 {
            let sent = t0 + 1900 * MS + k * 100 * MS;
            clock.anchor_at(truth(sent), sent, sent + MS);
            let estimate = clock.at(sent + MS).unwrap();
            assert!(estimate >= truth(sent + MS), "late at step {k}");
        }
        let later = t0 + 1900 * MS + 100 * 100 * MS;
        let estimate = clock.at(later).unwrap();
        assert!(
            estimate >= truth(later) && estimate - truth(later) <= 1,
            "{} ms early {} s after the slow reply",
            estimate - truth(later),
            later.duration_since(t0 + 1900 * MS).as_secs()
        );
        // Within the window it still counts: never late, early by design.
        let clock = ServerClock::new();
        clock.anchor_at(truth(t0 + 1900 * MS), t0, t0 + 1900 * MS);
        clock.anchor_at(truth(t0 + 2000 * MS), t0 + 2000 * MS, t0 + 2001 * MS);
        assert_eq!(clock.at(t0 + 2001 * MS), Some(truth(t0 + 2001 * MS) + 1900));
    }

    #[test]
    fn before_any_answer_the_wall_clock_stands_in() {
        let clock = ServerClock::new();
        assert!(!clock.is_anchored());
        assert_eq!(clock.at(Instant::now()), None);
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(clock.now_ms().abs_diff(wall) < 1000);
        // Anchors from before the clock was made count too.
        let earlier = Instant::now() - Duration::from_secs(1);
        let clock = ServerClock::new();
        clock.anchor(10_000, earlier);
        assert!(clock.now_ms() >= 11_000);
    }
}

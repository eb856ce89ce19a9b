//! Valkey's clock as the operator estimates it, never behind it.
//!
//! A reply carries the server's `TIME` as the script read it, some moment
//! after the request was sent and before the reply arrived (a durability wait
//! and queueing come after it). Paired with the instant the request was
//! *sent*, it bounds the server's clock from above: at any later instant `t`
//! the server's clock is at most `server_ms + (t - sent)`. Each reply is such
//! an anchor and the estimate is the latest of them, so expiry is never
//! judged later than Valkey judges it: Held is withdrawn and renewals are sent
//! early rather than late. (Rates are assumed equal: the monotonic clock and
//! Valkey's do not drift apart measurably within a lease duration.)

use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The estimate, shared by every reconcile and the keeper of one process.
#[derive(Debug)]
pub struct ServerClock {
    origin: Instant,
    /// Server milliseconds at `origin`, by the latest anchor (microseconds).
    at_origin_us: Mutex<Option<i128>>,
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
            at_origin_us: Mutex::new(None),
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
        let candidate = i128::from(server_ms) * 1000 - self.since_origin_us(sent);
        let mut slot = self.at_origin_us.lock().unwrap_or_else(|p| p.into_inner());
        *slot = Some(slot.map_or(candidate, |c| c.max(candidate)));
    }

    /// True once the server has answered.
    pub fn is_anchored(&self) -> bool {
        self.at_origin_us
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// The server's clock at `t` (rounded up), once it has answered.
    pub fn at(&self, t: Instant) -> Option<u64> {
        let base = (*self.at_origin_us.lock().unwrap_or_else(|p| p.into_inner()))?;
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

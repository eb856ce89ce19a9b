//! The write gate: only a replica that can prove it still leads may write.
//!
//! Leader election (see [`crate::operator::election`]) extends the gate's deadline after
//! each successful renewal of the election Lease; every write the operator
//! makes (status, finalizers, pod marks, token floors, store calls) checks the
//! gate immediately before it is sent. A leader cut off from the API server
//! therefore stops writing at its renew deadline, which is shorter than the
//! Lease duration a standby waits before taking over.

use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Whether this process may write, and until when.
#[derive(Clone, Debug)]
pub struct Leadership {
    until: Arc<Mutex<Deadline>>,
}

#[derive(Clone, Copy, Debug)]
enum Deadline {
    /// No election: the only replica always writes.
    Always,
    /// Leading until this instant (monotonic clock, so a paused process that
    /// resumes sees the deadline as passed).
    Until(Instant),
    /// Not leading.
    Never,
}

/// A write was refused because this replica cannot prove it leads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this replica is not the operator leader (or cannot prove it still is)")]
pub struct NotLeader;

impl Leadership {
    /// A gate that is always open (a single replica without election).
    pub fn always() -> Self {
        Self {
            until: Arc::new(Mutex::new(Deadline::Always)),
        }
    }

    /// A gate that stays closed until [`Leadership::lead_until`] opens it.
    pub fn elected() -> Self {
        Self {
            until: Arc::new(Mutex::new(Deadline::Never)),
        }
    }

    /// Opens the gate until `deadline` (called after each successful renewal).
    pub fn lead_until(&self, deadline: Instant) {
        *self.lock() = Deadline::Until(deadline);
    }

    /// Closes the gate now.
    pub fn step_down(&self) {
        *self.lock() = Deadline::Never;
    }

    /// True while writes are allowed.
    pub fn is_leading(&self) -> bool {
        match *self.lock() {
            Deadline::Always => true,
            Deadline::Until(t) => Instant::now() < t,
            Deadline::Never => false,
        }
    }

    /// Until when writes are allowed: `Ok(None)` for good (no election),
    /// `Ok(Some(t))` until `t`, `Err` not now.
    pub fn open_until(&self) -> Result<Option<Instant>, NotLeader> {
        match *self.lock() {
            Deadline::Always => Ok(None),
            Deadline::Until(t) if Instant::now() < t => Ok(Some(t)),
            Deadline::Until(_) | Deadline::Never => Err(NotLeader),
        }
    }

    /// `Ok` while writes are allowed; call it right before every write.
    pub fn check(&self) -> Result<(), NotLeader> {
        if self.is_leading() {
            Ok(())
        } else {
            Err(NotLeader)
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Deadline> {
        self.until.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_gate_closes_at_its_deadline() {
        assert!(Leadership::always().is_leading());
        let gate = Leadership::elected();
        assert_eq!(gate.check(), Err(NotLeader));
        let until = Instant::now() + Duration::from_secs(60);
        gate.lead_until(until);
        assert!(gate.is_leading());
        assert_eq!(gate.open_until(), Ok(Some(until)));
        assert_eq!(Leadership::always().open_until(), Ok(None));
        gate.lead_until(Instant::now());
        assert_eq!(gate.open_until(), Err(NotLeader));
        assert!(!gate.is_leading());
        gate.lead_until(Instant::now() + Duration::from_secs(60));
        gate.step_down();
        assert!(!gate.is_leading());
    }
}

//! The election decision, pure: given the Lease record this replica last saw
//! and when it saw it change, claim the Lease or wait (no client required).
//!
//! Expiry is judged on the local monotonic clock, from the instant this
//! replica observed the record change, never from the timestamps inside it:
//! replicas' wall clocks may disagree, and a paused leader's record looks
//! fresh to a standby that only just read it.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

/// The election fields of a Lease (client-go's `LeaderElectionRecord`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Who holds it; `None` (or empty in the object) when free or given up.
    pub holder: Option<String>,
    /// How long the holder promised to keep it without renewing.
    pub duration_secs: Option<i32>,
    /// When the current holder took it (informational).
    pub acquire_time: Option<Timestamp>,
    /// When the holder last renewed it (informational: never used for expiry).
    pub renew_time: Option<Timestamp>,
    /// How many times it changed hands.
    pub transitions: i32,
}

impl Record {
    /// The record of `lease`.
    pub fn of(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            duration_secs: spec.lease_duration_seconds,
            acquire_time: spec.acquire_time.map(|t| t.0),
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }

    /// Whether `me` claiming this record takes the Lease over from someone
    /// else: another holder, or a released record (whoever gave it up, and
    /// another replica may have led in between without `me` seeing it). Only
    /// `me`'s own renewal is not a takeover.
    pub fn taken_over_by(&self, me: &str) -> bool {
        self.holder.as_deref() != Some(me)
    }

    /// A first record: `me` holds a Lease nobody had created.
    pub fn first(me: &str, duration: Duration, wall: Timestamp) -> Self {
        Self {
            holder: Some(me.to_string()),
            duration_secs: Some(whole_seconds(duration)),
            acquire_time: Some(wall),
            renew_time: Some(wall),
            transitions: 0,
        }
    }

    /// The record written when `me` gives the Lease up: no holder, so a
    /// standby claims it at once.
    pub fn released(&self, wall: Timestamp) -> Self {
        Self {
            holder: None,
            duration_secs: Some(1),
            renew_time: Some(wall),
            ..self.clone()
        }
    }

    /// Writes the record into `lease`, keeping its other fields.
    pub fn write_to(&self, lease: &mut Lease) {
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = self.holder.clone();
        spec.lease_duration_seconds = self.duration_secs;
        spec.acquire_time = self.acquire_time.map(MicroTime);
        spec.renew_time = self.renew_time.map(MicroTime);
        spec.lease_transitions = Some(self.transitions);
    }

    /// How long a standby waits after seeing this record change: the longer
    /// of its own setting and the holder's promise.
    fn patience(&self, own: Duration) -> Duration {
        let promised = Duration::from_secs(self.duration_secs.unwrap_or(0).max(0) as u64);
        own.max(promised)
    }
}

/// A record, and when this replica saw it change (local monotonic clock).
#[derive(Clone, Debug)]
pub struct Observed {
    /// The record as last read or written.
    pub record: Record,
    /// `metadata.resourceVersion` of that read or write: the precondition of
    /// the next update.
    pub resource_version: Option<String>,
    /// When this replica first saw this record.
    pub at: Instant,
}

impl Observed {
    /// Folds a fresh read into what was seen before: the observation instant
    /// moves whenever the object changed (another `resourceVersion`), even
    /// when the record reads the same: a holder whose renewals carry the
    /// same timestamps (a frozen or coarse clock) is still alive.
    pub fn update(
        previous: Option<&Observed>,
        record: Record,
        resource_version: Option<String>,
        now: Instant,
    ) -> Self {
        let at = match previous {
            Some(p) if p.record == record && p.resource_version == resource_version => p.at,
            _ => now,
        };
        Self {
            record,
            resource_version,
            at,
        }
    }
}

/// What to do about a Lease that exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Write this record (a renewal, or a takeover of a free or expired Lease).
    Claim(Record),
    /// Another replica holds it and may still be alive.
    Wait {
        /// The holder.
        holder: String,
        /// When this replica may take over if nothing changes.
        expires: Instant,
    },
}

/// Decides, for replica `me` with lease duration `duration`, what to do.
pub fn next(
    observed: &Observed,
    me: &str,
    duration: Duration,
    now: Instant,
    wall: Timestamp,
) -> Next {
    let r = &observed.record;
    match r.holder.as_deref() {
        Some(holder) if holder == me => Next::Claim(Record {
            duration_secs: Some(whole_seconds(duration)),
            renew_time: Some(wall),
            ..r.clone()
        }),
        Some(holder) if now < observed.at + r.patience(duration) => Next::Wait {
            holder: holder.to_string(),
            expires: observed.at + r.patience(duration),
        },
        _ => Next::Claim(Record {
            holder: Some(me.to_string()),
            duration_secs: Some(whole_seconds(duration)),
            acquire_time: Some(wall),
            renew_time: Some(wall),
            transitions: r.transitions.saturating_add(1),
        }),
    }
}

/// `leaseDurationSeconds` is whole seconds: round up, so standbys that read
/// it never wait less than the holder's setting.
fn whole_seconds(d: Duration) -> i32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn held_by(holder: &str, renewed: Timestamp) -> Record {
        Record {
            holder: Some(holder.into()),
            duration_secs: Some(15),
            acquire_time: Some(renewed),
            renew_time: Some(renewed),
            transitions: 3,
        }
    }

    fn seen(record: Record, at: Instant) -> Observed {
        Observed::update(None, record, Some("1".into()), at)
    }

    #[test]
    fn another_holder_is_waited_out_from_when_its_record_was_seen() {
        let t0 = Instant::now();
        let wall = Timestamp::now();
        // The record's own timestamps do not matter: long past, or in the future.
        for renewed in [
            wall - Duration::from_secs(3600),
            wall + Duration::from_secs(3600),
        ] {
            let o = seen(held_by("a", renewed), t0);
            assert_eq!(
                next(&o, "b", D, t0 + D - Duration::from_millis(1), wall),
                Next::Wait {
                    holder: "a".into(),
                    expires: t0 + D
                }
            );
            let Next::Claim(taken) = next(&o, "b", D, t0 + D, wall) else {
                panic!("expired after the duration");
            };
            assert_eq!(taken.holder.as_deref(), Some("b"));
            assert_eq!(taken.transitions, 4);
            assert_eq!(taken.acquire_time, Some(wall));
        }
    }

    #[test]
    fn any_change_of_the_object_restarts_the_wait_and_none_does_not() {
        let t0 = Instant::now();
        let wall = Timestamp::now();
        let first = seen(held_by("a", wall), t0);
        let later = t0 + Duration::from_secs(10);
        let unchanged = Observed::update(Some(&first), held_by("a", wall), Some("1".into()), later);
        assert_eq!(unchanged.at, t0, "the same object read again");
        // Renewals under a frozen clock write the same record: a new version still counts.
        let same = Observed::update(Some(&first), held_by("a", wall), Some("2".into()), later);
        assert_eq!(same.at, later, "a renewal that reads the same");
        assert_eq!(same.resource_version.as_deref(), Some("2"));
        assert!(matches!(
            next(&same, "b", D, t0 + D, wall),
            Next::Wait { .. }
        ));
        let renewed = held_by("a", wall + Duration::from_secs(2));
        let changed = Observed::update(Some(&first), renewed, Some("3".into()), later);
        assert_eq!(changed.at, later);
        assert!(matches!(
            next(&changed, "b", D, t0 + D, wall),
            Next::Wait { .. }
        ));
    }

    #[test]
    fn the_longer_of_the_two_durations_is_waited() {
        let t0 = Instant::now();
        let wall = Timestamp::now();
        let mut r = held_by("a", wall);
        r.duration_secs = Some(60);
        let o = seen(r, t0);
        assert!(matches!(next(&o, "b", D, t0 + D, wall), Next::Wait { .. }));
        assert!(matches!(
            next(&o, "b", D, t0 + Duration::from_secs(60), wall),
            Next::Claim(_)
        ));
    }

    #[test]
    fn the_holder_renews_and_a_released_lease_is_claimed_at_once() {
        let t0 = Instant::now();
        let wall = Timestamp::now();
        let o = seen(held_by("a", wall - Duration::from_secs(5)), t0);
        let Next::Claim(renewal) = next(&o, "a", D, t0, wall) else {
            panic!("the holder renews");
        };
        assert_eq!(renewal.renew_time, Some(wall));
        assert_eq!(renewal.acquire_time, o.record.acquire_time);
        assert_eq!(renewal.transitions, 3);

        let released = seen(o.record.released(wall), t0);
        assert_eq!(released.record.holder, None);
        let Next::Claim(taken) = next(&released, "b", D, t0, wall) else {
            panic!("a released Lease is free");
        };
        assert_eq!(taken.holder.as_deref(), Some("b"));
    }

    /// Only the holder's own renewal keeps what it confirmed before; a claim
    /// of another's record or of a released one (even one `me` released, or
    /// that another replica took and released meanwhile) is a takeover.
    #[test]
    fn a_claim_is_a_takeover_unless_the_record_names_the_claimant() {
        let wall = Timestamp::now();
        let mine = held_by("a", wall);
        assert!(!mine.taken_over_by("a"), "a renewal");
        assert!(mine.taken_over_by("b"), "another holder's record");
        assert!(mine.released(wall).taken_over_by("a"), "a released record");
    }

    #[test]
    fn records_round_trip_through_a_lease_and_durations_round_up() {
        let wall = Timestamp::now();
        let mut lease = Lease::default();
        let r = Record::first("me", Duration::from_millis(4500), wall);
        r.write_to(&mut lease);
        assert_eq!(Record::of(&lease), r);
        assert_eq!(r.duration_secs, Some(5));
        lease.spec.as_mut().unwrap().holder_identity = Some(String::new());
        assert_eq!(Record::of(&lease).holder, None, "empty means free");
    }
}

//! Leader election among operator replicas on a `coordination.k8s.io/v1`
//! Lease, with client-go's semantics, driving the write gate
//! ([`crate::operator::leadership`]).
//!
//! Why not a library: the one we used never reported "not leader" when
//! renewals failed, so a leader cut off from the API server kept writing
//! while a standby took over. Here the leader's right to write is computed
//! from the instant it *sent* its last successful renewal
//! (`sent + renew_deadline`), and a standby takes over only after a full
//! lease duration without seeing the record change (measured on its own
//! monotonic clock from when it saw the change, which is after the leader sent
//! it). Since `renew_deadline < lease_duration`, the leader's gate closes
//! before any standby can start, whatever the network or a process pause
//! does. Every update carries the `resourceVersion` it was decided from, so
//! two replicas never both win the same round.

pub mod record;
pub mod write_gate;

use crate::operator::config_error::ConfigError;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::operator::leadership::Leadership;
use record::{Next, Observed, Record};

/// The election's clocks (client-go's names and defaults: 15s, 10s, 2s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// How long a standby waits, after it last saw the Lease change, before
    /// taking over.
    pub lease_duration: Duration,
    /// How long after sending its last successful renewal the leader may
    /// still write; it stops leading then unless it renewed again.
    pub renew_deadline: Duration,
    /// How often the leader renews and a standby checks the Lease.
    pub retry_period: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl Timings {
    /// `retry_period < renew_deadline < lease_duration`, all non-zero: the gap
    /// between the last two is the margin for clock-rate differences between
    /// replicas; several retries fit in the renew deadline.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.retry_period.is_zero() {
            return Err(ConfigError::new("the retry period must be more than zero"));
        }
        if self.retry_period >= self.renew_deadline {
            return Err(ConfigError::new(format!(
                "the retry period ({}) must be shorter than the renew deadline ({})",
                humantime::format_duration(self.retry_period),
                humantime::format_duration(self.renew_deadline)
            )));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(ConfigError::new(format!(
                "the renew deadline ({}) must be shorter than the lease duration ({})",
                humantime::format_duration(self.renew_deadline),
                humantime::format_duration(self.lease_duration)
            )));
        }
        Ok(())
    }
}

/// The outcome of one round against the Lease.
enum Round {
    /// This replica holds the Lease; the write left at `sent`. `took_over`:
    /// the write claimed it from another holder or from a released record.
    Holds { sent: Instant, took_over: bool },
    /// Someone else holds it and may still be alive.
    Other(String),
    /// Someone wrote between our read and our write (the next round reads who).
    Contended,
}

/// One replica's side of the election.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timings: Timings,
    observed: Option<Observed>,
    /// Whether the last round failed (so a failure is logged once, not every retry).
    failing: bool,
    /// Called whenever a round finds another replica holding the Lease.
    on_other: Option<Box<dyn Fn() + Send + Sync>>,
    /// Called whenever this replica claims the Lease from another holder.
    on_takeover: Option<Box<dyn Fn() + Send + Sync>>,
}

impl Elector {
    /// An elector for Lease `namespace/name`. `client` must not carry the write
    /// gate (its writes are what open it). The identity is `instance` plus a
    /// random suffix, so two processes that share a name never both hold it.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        instance: &str,
        timings: Timings,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: format!("{instance}_{}", uuid::Uuid::new_v4().simple()),
            timings,
            observed: None,
            failing: false,
            on_other: None,
            on_takeover: None,
        }
    }

    /// Calls `f` whenever a round finds another replica holding the Lease
    /// (this replica's leases are that replica's to renew then).
    pub fn on_other_leader(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_other = Some(Box::new(f));
        self
    }

    /// Calls `f` whenever this replica claims the Lease from another holder
    /// or from a released record (whoever held it last, another replica may
    /// have led since this one last did, even if this one never saw it).
    pub fn on_takeover(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_takeover = Some(Box::new(f));
        self
    }

    /// The holder identity this replica writes.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Stands by until this replica holds the Lease, then opens `gate` until
    /// the renew deadline of that first write, which it returns. Cancel-safe.
    pub async fn acquire(&mut self, gate: &Leadership) -> Instant {
        let mut last_holder = None;
        loop {
            let round = tokio::time::timeout(self.timings.renew_deadline, self.round()).await;
            match self.settle(round) {
                Some(Round::Holds { sent, .. }) => {
                    let until = sent + self.timings.renew_deadline;
                    gate.lead_until(until);
                    return until;
                }
                Some(Round::Other(holder)) if last_holder.as_ref() != Some(&holder) => {
                    tracing::info!(leader = %holder, "standing by");
                    last_holder = Some(holder);
                }
                _ => {}
            }
            tokio::time::sleep(self.timings.retry_period).await;
        }
    }

    /// Renews every retry period, moving `gate`'s deadline to `sent +
    /// renew_deadline` after each success. Returns (with the gate closed) once
    /// a renewal did not succeed in time or another replica holds the Lease.
    pub async fn keep_leading(&mut self, gate: &Leadership, mut valid_until: Instant) {
        loop {
            let wake = (Instant::now() + self.timings.retry_period).min(valid_until);
            tokio::time::sleep_until(wake.into()).await;
            if Instant::now() >= valid_until {
                tracing::warn!(
                    renew_deadline = ?self.timings.renew_deadline,
                    "could not renew the leader election Lease in time; stopping"
                );
                break;
            }
            let round = tokio::time::timeout_at(valid_until.into(), self.round()).await;
            match self.settle(round) {
                Some(Round::Holds { sent, .. }) => {
                    valid_until = sent + self.timings.renew_deadline;
                    gate.lead_until(valid_until);
                }
                Some(Round::Other(holder)) => {
                    tracing::warn!(leader = %holder, "another replica holds the leader election Lease; stopping");
                    break;
                }
                Some(Round::Contended) | None => {}
            }
        }
        gate.step_down();
    }

    /// Gives the Lease up if this replica still holds it, so a standby takes
    /// over at once. Call only once the gate is closed and the controller has
    /// stopped. Returns whether it was given up.
    pub async fn release(&mut self) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(false);
        };
        let record = Record::of(&lease);
        if record.holder.as_deref() != Some(self.identity.as_str()) {
            return Ok(false);
        }
        record.released(Timestamp::now()).write_to(&mut lease);
        // The resourceVersion read above is the precondition: a Lease that
        // changed hands meanwhile is left alone.
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        self.observed = None;
        Ok(true)
    }

    /// Logs a failed round once per run of failures; `None` when it failed.
    fn settle(
        &mut self,
        round: Result<Result<Round, kube::Error>, tokio::time::error::Elapsed>,
    ) -> Option<Round> {
        let error = match round {
            Ok(Ok(r)) => {
                if std::mem::take(&mut self.failing) {
                    tracing::info!("the leader election Lease answers again");
                }
                if let (Round::Other(_), Some(f)) = (&r, &self.on_other) {
                    f();
                }
                if let (
                    Round::Holds {
                        took_over: true, ..
                    },
                    Some(f),
                ) = (&r, &self.on_takeover)
                {
                    f();
                }
                return Some(r);
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        if !std::mem::replace(&mut self.failing, true) {
            tracing::warn!(%error, lease = %self.name, "leader election round failed; retrying");
        } else {
            tracing::debug!(%error, "leader election round failed");
        }
        None
    }

    /// Reads the Lease and claims it when it is free, expired or ours
    /// (client-go's `tryAcquireOrRenew`).
    async fn round(&mut self) -> Result<Round, kube::Error> {
        let wall = Timestamp::now();
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let mut lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: None,
            };
            let record = Record::first(&self.identity, self.timings.lease_duration, wall);
            record.write_to(&mut lease);
            let sent = Instant::now();
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => Ok(self.wrote(&created, sent, true)),
                Err(e) if conflict(&e) => Ok(Round::Contended),
                Err(e) => Err(e),
            };
        };
        let now = Instant::now();
        let record = Record::of(&lease);
        let took_over = record.taken_over_by(&self.identity);
        let observed = Observed::update(
            self.observed.as_ref(),
            record,
            lease.metadata.resource_version.clone(),
            now,
        );
        let next = record::next(
            &observed,
            &self.identity,
            self.timings.lease_duration,
            now,
            wall,
        );
        self.observed = Some(observed);
        let claim = match next {
            Next::Wait { holder, .. } => return Ok(Round::Other(holder)),
            Next::Claim(claim) => claim,
        };
        claim.write_to(&mut lease);
        let sent = Instant::now();
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => Ok(self.wrote(&written, sent, took_over)),
            Err(e) if conflict(&e) => Ok(Round::Contended),
            Err(e) => Err(e),
        }
    }

    fn wrote(&mut self, lease: &Lease, sent: Instant, took_over: bool) -> Round {
        self.observed = Some(Observed::update(
            None,
            Record::of(lease),
            lease.metadata.resource_version.clone(),
            Instant::now(),
        ));
        Round::Holds { sent, took_over }
    }
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_must_nest() {
        assert_eq!(Timings::default().validate(), Ok(()));
        let t = |d, r, p| Timings {
            lease_duration: Duration::from_secs(d),
            renew_deadline: Duration::from_secs(r),
            retry_period: Duration::from_secs(p),
        };
        assert!(
            t(15, 15, 2)
                .validate()
                .unwrap_err()
                .to_string()
                .contains("renew deadline")
        );
        assert!(
            t(15, 10, 10)
                .validate()
                .unwrap_err()
                .to_string()
                .contains("retry period")
        );
        assert!(
            t(15, 10, 0)
                .validate()
                .unwrap_err()
                .to_string()
                .contains("zero")
        );
        assert_eq!(t(6, 4, 1).validate(), Ok(()));
    }
}

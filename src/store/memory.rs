//! The reference backend: the protocol's semantics in plain Rust, in memory.
//!
//! It exists so the contract suite has something obviously right to compare
//! Valkey against, and so unit tests can control time. It is not durable and
//! not shared between processes; nothing in production uses it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use super::{
    AcquireRequest, CommitRequest, Health, Holder, IDEMPOTENCY_WINDOW, Lease, LeaseStore,
    MAX_TOKEN, Outcome, ReleaseRequest, RenewRequest, Reply, RevokeRequest, StoreError, Target,
};

/// Where the memory store reads "now" from.
pub trait Clock: Send + Sync {
    /// Current time in Unix milliseconds.
    fn now_ms(&self) -> u64;
}

/// The machine's wall clock.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self(Arc::new(AtomicU64::new(start_ms)))
    }

    /// Moves time forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[derive(Clone, Debug)]
struct Record {
    lease_id: String,
    owner: String,
    token: u64,
    acquired_ms: u64,
    expires_ms: u64,
    max_expires_ms: Option<u64>,
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

impl Record {
    fn holder_matches(&self, h: &Holder) -> bool {
        self.lease_id == h.lease_id && self.owner == h.owner && self.token == h.token
    }

    fn lease(&self, target: &Target) -> Lease {
        Lease {
            target: target.name.clone(),
            lease_id: Some(self.lease_id.clone()),
            owner: self.owner.clone(),
            fencing_token: self.token,
            acquired_at_ms: self.acquired_ms,
            expires_at_ms: self.expires_ms,
            max_expires_at_ms: self.max_expires_ms,
            metadata: self.metadata.clone(),
        }
    }
}

#[derive(Clone, Debug)]
enum Slot {
    Live(Record),
    /// Unreadable state; `holder` is set when its identity fields still parse.
    Corrupt {
        holder: Option<Holder>,
    },
}

#[derive(Clone, Debug)]
struct Cached {
    fingerprint: String,
    lease_id: String,
    token: u64,
    expires_ms: u64,
}

#[derive(Default)]
struct State {
    leases: HashMap<Target, Slot>,
    counters: HashMap<Target, u64>,
    commits: HashMap<(Target, String), (u64, String)>,
    requests: HashMap<(&'static str, Target, String, String), Cached>,
}

impl State {
    /// The lease slot as seen at `now`: expired records are gone, like a backend TTL.
    fn slot(&mut self, target: &Target, now: u64) -> Option<Slot> {
        match self.leases.get(target) {
            Some(Slot::Live(r)) if r.expires_ms <= now => {
                self.leases.remove(target);
                None
            }
            other => other.cloned(),
        }
    }

    fn cached(
        &mut self,
        op: &'static str,
        target: &Target,
        scope: &str,
        request_id: &str,
        now: u64,
    ) -> Option<Cached> {
        let key = (op, target.clone(), scope.to_owned(), request_id.to_owned());
        match self.requests.get(&key) {
            Some(c) if c.expires_ms > now => Some(c.clone()),
            Some(_) => {
                self.requests.remove(&key);
                None
            }
            None => None,
        }
    }

    fn remember(
        &mut self,
        op: &'static str,
        target: &Target,
        scope: &str,
        request_id: &str,
        cached: Cached,
    ) {
        self.requests.insert(
            (op, target.clone(), scope.to_owned(), request_id.to_owned()),
            cached,
        );
    }
}

/// The in-memory reference implementation of [`LeaseStore`].
pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

impl MemoryStore {
    /// An empty store reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            state: Mutex::new(State::default()),
        }
    }

    /// Replaces the target's lease with unreadable state (for the contract suite).
    /// With `identity`, the holder fields stay readable, as when only the TTL is missing.
    pub fn put_corrupt_lease(&self, target: &Target, identity: Option<Holder>) {
        self.lock()
            .leases
            .insert(target.clone(), Slot::Corrupt { holder: identity });
    }

    /// Forgets every fencing counter, as a backend that lost data would.
    pub fn forget_counters(&self) {
        let mut st = self.lock();
        st.counters.clear();
        st.leases.clear();
        st.requests.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

fn fingerprint(parts: &[&str]) -> String {
    parts.join("\u{0}")
}

const CORRUPT: &str = "lease record is corrupt";
const CONFLICT: &str = "request id was used with different inputs";
const NOT_HOLDER: &str = "the lease is not held by this lease id, owner and token";

fn reply(now: u64, outcome: Outcome, lease: Option<Lease>, message: &str) -> Reply {
    Reply {
        outcome,
        lease,
        server_time_ms: now,
        message: message.to_owned(),
    }
}

/// A reply without a lease.
fn bare(now: u64, outcome: Outcome, message: &str) -> Reply {
    reply(now, outcome, None, message)
}

/// The live record when it is exactly `h`'s lease; otherwise the refusal.
fn held_by(slot: Option<Slot>, h: &Holder) -> Result<Record, (Outcome, &'static str)> {
    match slot {
        Some(Slot::Corrupt { .. }) => Err((Outcome::CorruptState, CORRUPT)),
        None => Err((Outcome::Expired, "the lease has ended")),
        Some(Slot::Live(r)) if !r.holder_matches(h) => Err((Outcome::NotOwner, NOT_HOLDER)),
        Some(Slot::Live(r)) => Ok(r),
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

#[async_trait]
impl LeaseStore for MemoryStore {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        let now = self.clock.now_ms();
        let t = &req.target;
        let max_life = req.max_lifetime.map(ms).unwrap_or(0).to_string();
        let fp = fingerprint(&[&ms(req.ttl).to_string(), &max_life, &req.metadata_json()]);
        let mut st = self.lock();
        let slot = st.slot(t, now);
        if let Some(c) = st.cached("acquire", t, &req.owner, &req.request_id, now) {
            if c.fingerprint != fp {
                return Ok(bare(now, Outcome::IdempotencyConflict, CONFLICT));
            }
            return Ok(match slot {
                Some(Slot::Live(r)) if r.lease_id == c.lease_id => reply(
                    now,
                    Outcome::Acquired,
                    Some(r.lease(t)),
                    "lease acquired (replayed request)",
                ),
                Some(Slot::Live(r)) => reply(
                    now,
                    Outcome::Held,
                    Some(r.lease(t).without_lease_id()),
                    "the lease this request acquired was superseded",
                ),
                Some(Slot::Corrupt { .. }) => bare(now, Outcome::CorruptState, CORRUPT),
                None => bare(
                    now,
                    Outcome::Expired,
                    "the lease this request acquired has ended",
                ),
            });
        }
        match slot {
            Some(Slot::Corrupt { .. }) => return Ok(bare(now, Outcome::CorruptState, CORRUPT)),
            Some(Slot::Live(r)) => {
                let shown = Some(r.lease(t).without_lease_id());
                return Ok(reply(now, Outcome::Held, shown, "target is held"));
            }
            None => {}
        }
        let counter = st.counters.get(t).copied().unwrap_or(0);
        let base = counter.max(req.token_floor.unwrap_or(0));
        if base >= MAX_TOKEN {
            return Ok(bare(now, Outcome::CorruptState, "fence counter exhausted"));
        }
        let max_expires_ms = req.max_lifetime.map(|m| now + ms(m));
        let expires_ms = (now + ms(req.ttl)).min(max_expires_ms.unwrap_or(u64::MAX));
        let rec = Record {
            lease_id: req.lease_id.clone().unwrap_or_else(super::new_request_id),
            owner: req.owner.clone(),
            token: base + 1,
            acquired_ms: now,
            expires_ms,
            max_expires_ms,
            metadata: req.metadata.clone(),
        };
        st.counters.insert(t.clone(), rec.token);
        st.leases.insert(t.clone(), Slot::Live(rec.clone()));
        let cached = Cached {
            fingerprint: fp,
            lease_id: rec.lease_id.clone(),
            token: rec.token,
            expires_ms: now + ms(IDEMPOTENCY_WINDOW + req.ttl),
        };
        st.remember("acquire", t, &req.owner, &req.request_id, cached);
        Ok(reply(
            now,
            Outcome::Acquired,
            Some(rec.lease(t)),
            "lease acquired",
        ))
    }

    async fn renew(&self, req: &RenewRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        let now = self.clock.now_ms();
        let (t, h) = (&req.target, &req.holder);
        let fp = fingerprint(&[&h.lease_id, &h.token.to_string(), &ms(req.ttl).to_string()]);
        let mut st = self.lock();
        let slot = st.slot(t, now);
        if let Some(c) = st.cached("renew", t, &h.owner, &req.request_id, now) {
            if c.fingerprint != fp {
                return Ok(bare(now, Outcome::IdempotencyConflict, CONFLICT));
            }
            return Ok(match slot {
                Some(Slot::Live(r)) if r.lease_id == c.lease_id && r.token == c.token => reply(
                    now,
                    Outcome::Renewed,
                    Some(r.lease(t)),
                    "lease renewed (replayed request)",
                ),
                Some(Slot::Live(_)) => bare(now, Outcome::NotOwner, "the lease was superseded"),
                Some(Slot::Corrupt { .. }) => bare(now, Outcome::CorruptState, CORRUPT),
                None => bare(now, Outcome::Expired, "the lease has ended"),
            });
        }
        let mut rec = match held_by(slot, h) {
            Ok(r) => r,
            Err((outcome, message)) => return Ok(bare(now, outcome, message)),
        };
        rec.expires_ms = (now + ms(req.ttl)).min(rec.max_expires_ms.unwrap_or(u64::MAX));
        st.leases.insert(t.clone(), Slot::Live(rec.clone()));
        let cached = Cached {
            fingerprint: fp,
            lease_id: rec.lease_id.clone(),
            token: rec.token,
            expires_ms: now + ms(IDEMPOTENCY_WINDOW),
        };
        st.remember("renew", t, &h.owner, &req.request_id, cached);
        Ok(reply(
            now,
            Outcome::Renewed,
            Some(rec.lease(t)),
            "lease renewed",
        ))
    }

    async fn release(&self, req: &ReleaseRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        let now = self.clock.now_ms();
        let (t, h) = (&req.target, &req.holder);
        let fp = fingerprint(&[&h.lease_id, &h.token.to_string()]);
        let mut st = self.lock();
        let slot = st.slot(t, now);
        if let Some(c) = st.cached("release", t, &h.owner, &req.request_id, now) {
            if c.fingerprint != fp {
                return Ok(bare(now, Outcome::IdempotencyConflict, CONFLICT));
            }
            return Ok(bare(
                now,
                Outcome::Released,
                "lease released (replayed request)",
            ));
        }
        // The exact holder may clear a corrupt record whose identity still reads.
        let released = match slot {
            Some(Slot::Corrupt {
                holder: Some(ref id),
            }) if id == h => None,
            other => match held_by(other, h) {
                Ok(r) => Some(r.lease(t)),
                Err((outcome, message)) => return Ok(bare(now, outcome, message)),
            },
        };
        st.leases.remove(t);
        let cached = Cached {
            fingerprint: fp,
            lease_id: h.lease_id.clone(),
            token: h.token,
            expires_ms: now + ms(IDEMPOTENCY_WINDOW),
        };
        st.remember("release", t, &h.owner, &req.request_id, cached);
        Ok(reply(now, Outcome::Released, released, "lease released"))
    }

    async fn get(&self, target: &Target) -> Result<Reply, StoreError> {
        target.validate()?;
        let now = self.clock.now_ms();
        Ok(match self.lock().slot(target, now) {
            Some(Slot::Live(r)) => reply(
                now,
                Outcome::Found,
                Some(r.lease(target).without_lease_id()),
                "target is held",
            ),
            Some(Slot::Corrupt { .. }) => bare(now, Outcome::CorruptState, CORRUPT),
            None => bare(now, Outcome::NotFound, "target has no live lease"),
        })
    }

    async fn revoke(&self, req: &RevokeRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        let now = self.clock.now_ms();
        let t = &req.target;
        let mut st = self.lock();
        let slot = st.slot(t, now);
        st.leases.remove(t);
        Ok(match slot {
            Some(Slot::Live(r)) => reply(
                now,
                Outcome::Revoked,
                Some(r.lease(t).without_lease_id()),
                "lease revoked",
            ),
            Some(Slot::Corrupt { .. }) => {
                bare(now, Outcome::Revoked, "corrupt lease record removed")
            }
            None => bare(now, Outcome::NotFound, "target has no live lease"),
        })
    }

    async fn commit(&self, req: &CommitRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        let now = self.clock.now_ms();
        let t = &req.target;
        let fp = fingerprint(&[&req.token.to_string(), &req.key, &req.value]);
        let mut st = self.lock();
        let slot = st.slot(t, now);
        if let Some(c) = st.cached("commit", t, "", &req.request_id, now) {
            if c.fingerprint != fp {
                return Ok(bare(now, Outcome::IdempotencyConflict, CONFLICT));
            }
            return Ok(bare(
                now,
                Outcome::Committed,
                "value committed (replayed request)",
            ));
        }
        let rec = match slot {
            Some(Slot::Corrupt { .. }) => return Ok(bare(now, Outcome::CorruptState, CORRUPT)),
            None => return Ok(bare(now, Outcome::Expired, "target has no live lease")),
            Some(Slot::Live(r)) if r.token != req.token => {
                return Ok(bare(
                    now,
                    Outcome::StaleToken,
                    "token is not the current lease's",
                ));
            }
            Some(Slot::Live(r)) => r,
        };
        let commit_key = (t.clone(), req.key.clone());
        if let Some((committed, _)) = st.commits.get(&commit_key)
            && *committed > req.token
        {
            let message = "a higher token was already committed for this key";
            return Ok(bare(now, Outcome::StaleToken, message));
        }
        st.commits
            .insert(commit_key, (req.token, req.value.clone()));
        let cached = Cached {
            fingerprint: fp,
            lease_id: String::new(),
            token: req.token,
            expires_ms: now + ms(IDEMPOTENCY_WINDOW),
        };
        st.remember("commit", t, "", &req.request_id, cached);
        let shown = Some(rec.lease(t).without_lease_id());
        Ok(reply(now, Outcome::Committed, shown, "value committed"))
    }

    async fn health(&self) -> Result<Health, StoreError> {
        let started = Instant::now();
        let now = self.clock.now_ms();
        Ok(Health {
            server_time_ms: now,
            latency: started.elapsed(),
        })
    }
}

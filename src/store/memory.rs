//! The reference backend: the protocol's semantics in plain Rust, in memory.
//!
//! It exists so the contract suite has something obviously right to compare
//! Valkey against, and so unit tests can control time. It is not durable and
//! not shared between processes; nothing in production uses it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use futures::StreamExt;
use tokio::sync::broadcast;

use super::{
    AcquireRequest, CommitRequest, Health, IDEMPOTENCY_WINDOW, Lease, LeaseHandle, LeaseStore,
    MAX_TOKEN, Notice, Notices, Outcome, ReadReply, ReleaseRequest, RenewRequest, Reply,
    RevokeRequest, StoreError, Target,
};

mod clock;

pub use clock::{Clock, ManualClock, SystemClock};

mod state;

use state::{IncomingWrite, Record, Rule, Slot, State};

/// The in-memory reference implementation of [`LeaseStore`].
pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    /// Targets whose lease a release or revoke ended (expiry is computed on
    /// read, so nothing announces it: waiters also ask at the holder's expiry).
    freed: broadcast::Sender<Target>,
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
            freed: broadcast::channel(1024).0,
        }
    }

    /// Replaces the target's lease with unreadable state (for the contract suite).
    /// With `handle`, the holder fields stay readable, as when only the TTL is missing.
    pub fn put_corrupt_lease(&self, target: &Target, handle: Option<LeaseHandle>) {
        self.lock()
            .leases
            .insert(target.clone(), Slot::Corrupt { handle });
    }

    /// Forgets every fencing counter, as a backend that lost data would.
    pub fn forget_counters(&self) {
        let mut st = self.lock();
        st.counters.clear();
        st.leases.clear();
        st.requests.clear();
    }

    /// A write arriving now; `inputs` are what a replay must repeat exactly.
    fn call<'a>(
        &self,
        op: &'static str,
        target: &'a Target,
        scope: &'a str,
        request_id: &'a str,
        inputs: &[&str],
    ) -> IncomingWrite<'a> {
        IncomingWrite {
            op,
            target,
            scope,
            request_id,
            fingerprint: inputs.join("\u{0}"),
            now: self.clock.now_ms(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

const CORRUPT: &str = "lease record is corrupt";
const CONFLICT: &str = "request id was used with different inputs";
const NOT_OWNER: &str = "the lease is not held by this lease id, owner and token";

fn reply(now: u64, outcome: Outcome, lease: Option<Lease>, message: &str) -> Reply {
    Reply {
        outcome,
        lease,
        server_time_ms: now,
        message: message.to_owned(),
    }
}

/// A fresh random lease id (for an acquire that brings none).
fn new_lease_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn bare(now: u64, outcome: Outcome, message: &str) -> Reply {
    reply(now, outcome, None, message)
}

/// The live record when it is exactly `h`'s lease; otherwise the refusal.
fn held_by(slot: Option<Slot>, h: &LeaseHandle) -> Result<Record, (Outcome, &'static str)> {
    match slot {
        Some(Slot::Corrupt { .. }) => Err((Outcome::CorruptState, CORRUPT)),
        None => Err((Outcome::Expired, "the lease has ended")),
        Some(Slot::Live(r)) if !r.handle_matches(h) => Err((Outcome::NotOwner, NOT_OWNER)),
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
        let t = &req.target;
        let max_life = req.max_lifetime.map(ms).unwrap_or(0).to_string();
        // Every input but the owner (in the cache key), as lua/acquire.lua:
        // a random lease id is not an input (each attempt draws a new one).
        let floor = req.token_floor.unwrap_or(0).to_string();
        let chosen = req.lease_id.as_deref().unwrap_or("");
        let inputs: &[&str] = &[
            &ms(req.ttl).to_string(),
            &max_life,
            &req.metadata_json(),
            &floor,
            chosen,
        ];
        let call = self.call("acquire", t, &req.owner, &req.request_id, inputs);
        let now = call.now;
        let mut st = self.lock();
        let slot = st.slot(t, now);
        let rule = Rule::Revalidate {
            live: Outcome::Acquired,
            live_msg: "lease acquired (replayed request)",
            superseded: |now, r, t| {
                let shown = Some(r.lease(t).without_lease_id());
                reply(
                    now,
                    Outcome::Held,
                    shown,
                    "the lease this request acquired was superseded",
                )
            },
            ended: "the lease this request acquired has ended",
        };
        if let Some(r) = st.replay(&call, &slot, rule) {
            return Ok(r);
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
            lease_id: req.lease_id.clone().unwrap_or_else(new_lease_id),
            owner: req.owner.clone(),
            token: base + 1,
            acquired_ms: now,
            expires_ms,
            max_expires_ms,
            metadata: req.metadata.clone(),
        };
        st.counters.insert(t.clone(), rec.token);
        st.leases.insert(t.clone(), Slot::Live(rec.clone()));
        let window = IDEMPOTENCY_WINDOW + req.ttl;
        st.remember(call, &rec.lease_id, rec.token, Outcome::Acquired, window);
        Ok(reply(
            now,
            Outcome::Acquired,
            Some(rec.lease(t)),
            "lease acquired",
        ))
    }

    async fn renew(&self, req: &RenewRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        let (t, h) = (&req.target, &req.handle);
        let (token, ttl) = (h.token.to_string(), ms(req.ttl).to_string());
        let plain: &[&str] = &[&h.lease_id, &token, &ttl];
        let extend: &[&str] = &[&h.lease_id, &token, &ttl, "extend"];
        let inputs = if req.extend_only { extend } else { plain };
        let call = self.call("renew", t, &h.owner, &req.request_id, inputs);
        let now = call.now;
        let mut st = self.lock();
        let slot = st.slot(t, now);
        let rule = Rule::Revalidate {
            live: Outcome::Renewed,
            live_msg: "lease renewed (replayed request)",
            superseded: |now, _, _| bare(now, Outcome::NotOwner, "the lease was superseded"),
            ended: "the lease has ended",
        };
        if let Some(r) = st.replay(&call, &slot, rule) {
            return Ok(r);
        }
        let mut rec = match held_by(slot, h) {
            Ok(r) => r,
            Err((outcome, message)) => return Ok(bare(now, outcome, message)),
        };
        let mut expires = now + ms(req.ttl);
        if req.extend_only {
            expires = expires.max(rec.expires_ms);
        }
        rec.expires_ms = expires.min(rec.max_expires_ms.unwrap_or(u64::MAX));
        st.leases.insert(t.clone(), Slot::Live(rec.clone()));
        st.remember(
            call,
            &rec.lease_id,
            rec.token,
            Outcome::Renewed,
            IDEMPOTENCY_WINDOW,
        );
        Ok(reply(
            now,
            Outcome::Renewed,
            Some(rec.lease(t)),
            "lease renewed",
        ))
    }

    async fn release(&self, req: &ReleaseRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        let (t, h) = (&req.target, &req.handle);
        let inputs: &[&str] = &[&h.lease_id, &h.token.to_string()];
        let call = self.call("release", t, &h.owner, &req.request_id, inputs);
        let now = call.now;
        let mut st = self.lock();
        let slot = st.slot(t, now);
        let rule = Rule::Done(|_| "lease released (replayed request)");
        if let Some(r) = st.replay(&call, &slot, rule) {
            return Ok(r);
        }
        // The exact handle may clear a corrupt record whose handle still reads.
        let released = match slot {
            Some(Slot::Corrupt {
                handle: Some(ref id),
            }) if id == h => None,
            other => match held_by(other, h) {
                Ok(r) => Some(r.lease(t)),
                Err((outcome, message)) => return Ok(bare(now, outcome, message)),
            },
        };
        st.leases.remove(t);
        let _ = self.freed.send(t.clone());
        st.remember(
            call,
            &h.lease_id,
            h.token,
            Outcome::Released,
            IDEMPOTENCY_WINDOW,
        );
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
        let t = &req.target;
        let token = req.token.map(|n| n.to_string()).unwrap_or_default();
        let call = self.call("revoke", t, "", &req.request_id, &[&token]);
        let now = call.now;
        let mut st = self.lock();
        let slot = st.slot(t, now);
        let rule = Rule::Done(|outcome| match outcome {
            Outcome::NotFound => "target had no live lease (replayed request)",
            _ => "lease revoked (replayed request)",
        });
        if let Some(r) = st.replay(&call, &slot, rule) {
            return Ok(r);
        }
        if let Some(want) = req.token {
            match &slot {
                Some(Slot::Live(r)) if r.token != want => {
                    let message = "the live lease has another fencing token";
                    return Ok(bare(now, Outcome::NotOwner, message));
                }
                Some(Slot::Corrupt { handle })
                    if handle.as_ref().map(|h| h.token) != Some(want) =>
                {
                    return Ok(bare(now, Outcome::CorruptState, CORRUPT));
                }
                _ => {}
            }
        }
        st.leases.remove(t);
        let _ = self.freed.send(t.clone());
        let (out, id, tok) = match slot {
            Some(Slot::Live(r)) => {
                let shown = Some(r.lease(t).without_lease_id());
                let out = reply(now, Outcome::Revoked, shown, "lease revoked");
                (out, r.lease_id, r.token)
            }
            Some(Slot::Corrupt { handle }) => {
                let out = bare(now, Outcome::Revoked, "corrupt lease record removed");
                let (id, tok) = handle.map(|h| (h.lease_id, h.token)).unwrap_or_default();
                (out, id, tok)
            }
            None => (
                bare(now, Outcome::NotFound, "target has no live lease"),
                String::new(),
                0,
            ),
        };
        st.remember(call, &id, tok, out.outcome, IDEMPOTENCY_WINDOW);
        Ok(out)
    }

    async fn commit(&self, req: &CommitRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        let t = &req.target;
        let inputs: &[&str] = &[&req.token.to_string(), &req.key, &req.value];
        let call = self.call("commit", t, "", &req.request_id, inputs);
        let now = call.now;
        let mut st = self.lock();
        let slot = st.slot(t, now);
        let rule = Rule::Done(|_| "value committed (replayed request)");
        if let Some(r) = st.replay(&call, &slot, rule) {
            return Ok(r);
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
        if let Some((committed, _, _)) = st.commits.get(&commit_key)
            && *committed > req.token
        {
            let message = "a higher token was already committed for this key";
            return Ok(bare(now, Outcome::StaleToken, message));
        }
        st.commits
            .insert(commit_key, (req.token, req.value.clone(), now));
        st.remember(call, "", req.token, Outcome::Committed, IDEMPOTENCY_WINDOW);
        let shown = Some(rec.lease(t).without_lease_id());
        Ok(reply(now, Outcome::Committed, shown, "value committed"))
    }

    async fn read(&self, target: &Target, key: &str) -> Result<ReadReply, StoreError> {
        target.validate()?;
        super::check_name("key", key)?;
        let now = self.clock.now_ms();
        let st = self.lock();
        let found = st.commits.get(&(target.clone(), key.to_owned()));
        Ok(match found {
            Some((token, value, at)) => ReadReply {
                outcome: Outcome::Found,
                committed: Some(super::Committed {
                    key: key.to_owned(),
                    value: value.clone(),
                    fencing_token: *token,
                    committed_at_ms: *at,
                }),
                server_time_ms: now,
                message: "value committed".into(),
            },
            None => ReadReply {
                outcome: Outcome::NotFound,
                committed: None,
                server_time_ms: now,
                message: "nothing committed under this key".into(),
            },
        })
    }

    async fn list(
        &self,
        namespace: Option<&str>,
        target_prefix: &str,
    ) -> Result<Vec<super::Listed>, StoreError> {
        let wanted: Vec<Target> = {
            let st = self.lock();
            st.leases
                .keys()
                .filter(|t| namespace.is_none_or(|n| t.namespace == n))
                .filter(|t| t.name.starts_with(target_prefix))
                .cloned()
                .collect()
        };
        let mut listed = Vec::new();
        for target in wanted {
            let reply = self.get(&target).await?;
            listed.push(super::Listed::from_get(target, reply));
        }
        listed.sort_by(|a, b| {
            (&a.target.namespace, &a.target.name).cmp(&(&b.target.namespace, &b.target.name))
        });
        Ok(listed)
    }

    async fn health(&self) -> Result<Health, StoreError> {
        let started = Instant::now();
        let now = self.clock.now_ms();
        Ok(Health {
            server_time_ms: now,
            latency: started.elapsed(),
        })
    }

    async fn notices(&self, target: &Target) -> Result<Notices, StoreError> {
        target.validate()?;
        let rx = self.freed.subscribe();
        let stream = futures::stream::unfold((rx, target.clone()), |(mut rx, t)| async move {
            loop {
                match rx.recv().await {
                    Ok(freed) if freed == t => return Some((Notice::Freed, (rx, t))),
                    Ok(_) => {}
                    // Too far behind: some notice was dropped, maybe ours.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        return Some((Notice::Resubscribed, (rx, t)));
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        Ok(stream.boxed())
    }
}

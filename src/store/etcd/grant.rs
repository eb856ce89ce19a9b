//! Acquire and renew: the operations that put a lease record on a new etcd
//! lease. Each reads the target's keys, decides, grants the etcd lease
//! (TTL: the lease's remaining life in whole seconds, rounded up) and
//! writes in one transaction guarded by the `mod_revision` of every key it
//! read; when a guard fails nothing was written, the unused etcd lease is
//! revoked and the decision is made again on what the target holds now.

use std::time::Duration;

use etcd_client::{PutOptions, TxnOp};

use super::EtcdStore;
use super::keys::hex;
use super::kv::{Deadline, Guarded, Snapshot, now_ms};
use super::records::{Cached, Record, Slot, counter, fingerprint};
use super::replay::{Rule, bare, replay, reply};
use crate::store::{
    AcquireRequest, IDEMPOTENCY_WINDOW, MAX_TOKEN, Outcome, RenewRequest, Reply, StoreError, Target,
};

/// Index of each key in an operation's snapshot.
pub(super) const FENCE: usize = 0;
pub(super) const LEASE: usize = 1;
pub(super) const REQUEST: usize = 2;

/// Rounds of read, decide, write before giving up on a target that keeps
/// changing (each failed round wrote nothing).
pub(super) const ROUNDS: usize = 16;

pub(super) const NOT_OWNER: &str = "the lease is not held by this lease id, owner and token";

pub(super) fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// A put, on etcd lease `lease` (0: none).
pub(super) fn put(key: &str, value: Vec<u8>, lease: i64) -> TxnOp {
    let opts = (lease != 0).then(|| PutOptions::new().with_lease(lease));
    TxnOp::put(key, value, opts)
}

/// The answer when every round found the target changed.
pub(super) fn busy() -> StoreError {
    StoreError::BackendUnavailable(
        "the target changed under every attempt; nothing was written".into(),
    )
}

/// The lease id of an acquire whose caller chose none: derived from what
/// identifies the request, so that a retry (same request id) asks for the
/// same lease id and the store never keeps the id itself, only its hash.
/// Knowing the request id is knowing this lease id: a request id is a
/// capability (docs/protocol.md).
fn derived_lease_id(t: &Target, owner: &str, request_id: &str) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [
        "targetlease lease id v1",
        &t.namespace,
        &t.name,
        owner,
        request_id,
    ] {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part.as_bytes());
    }
    hex(&ctx.finish().as_ref()[..16])
}

/// What one round of acquire decided.
enum Plan {
    Answer(Reply),
    Grant { token: u64 },
}

fn plan_acquire(snap: &Snapshot, req: &AcquireRequest, fp: &str, lease_id: &str) -> Plan {
    let (t, now) = (&req.target, snap.now);
    let slot = Slot::read(snap.get(LEASE), snap.get(FENCE), now);
    let rule = Rule::Revalidate {
        live: Outcome::Acquired,
        live_msg: "lease acquired (replayed request)",
        lease_id,
        superseded: |now, r, t| {
            let shown = Some(r.lease(t, None));
            reply(
                now,
                Outcome::Held,
                shown,
                "the lease this request acquired was superseded",
            )
        },
        ended: "the lease this request acquired has ended",
    };
    if let Some(r) = replay(snap.get(REQUEST), fp, &slot, now, t, rule) {
        return Plan::Answer(r);
    }
    match slot {
        Slot::Corrupt { why, .. } => return Plan::Answer(bare(now, Outcome::CorruptState, why)),
        Slot::Live(r) | Slot::Lingering(r) => {
            let shown = Some(r.lease(t, None));
            return Plan::Answer(reply(now, Outcome::Held, shown, "target is held"));
        }
        Slot::Free => {}
    }
    let counter = match snap.get(FENCE) {
        None => 0,
        // A counter on an etcd lease would expire with it.
        Some(f) if f.lease != 0 => {
            return Plan::Answer(bare(
                now,
                Outcome::CorruptState,
                "fence counter has an expiry",
            ));
        }
        Some(f) => match counter(&f.value) {
            Some(c) => c,
            None => {
                let why = "fence counter is not a number";
                return Plan::Answer(bare(now, Outcome::CorruptState, why));
            }
        },
    };
    let base = counter.max(req.token_floor.unwrap_or(0));
    if base >= MAX_TOKEN {
        return Plan::Answer(bare(now, Outcome::CorruptState, "fence counter exhausted"));
    }
    Plan::Grant { token: base + 1 }
}

pub(super) async fn acquire(s: &EtcdStore, req: &AcquireRequest) -> Result<Reply, StoreError> {
    let t = &req.target;
    let lease_id = req
        .lease_id
        .clone()
        .unwrap_or_else(|| derived_lease_id(t, &req.owner, &req.request_id));
    let max_life = req.max_lifetime.map(ms).unwrap_or(0);
    let metadata = req.metadata_json();
    let fp = fingerprint(&[
        &ms(req.ttl).to_string(),
        &max_life.to_string(),
        &metadata,
        &req.token_floor.unwrap_or(0).to_string(),
        &lease_id,
    ]);
    let keys = vec![
        s.keys.fence(t),
        s.keys.lease(t),
        s.keys.request(t, "acquire", &req.owner, &req.request_id),
    ];
    let deadline = Deadline::after(s.timeout);
    let mut snap = s.kv.read(&keys, deadline).await?;
    for _ in 0..ROUNDS {
        let token = match plan_acquire(&snap, req, &fp, &lease_id) {
            Plan::Answer(r) => return Ok(r),
            Plan::Grant { token } => token,
        };
        let bucket =
            s.kv.bucket(IDEMPOTENCY_WINDOW + req.ttl, snap.now, deadline)
                .await?;
        // The holder's deadline counts from before the grant, so etcd's
        // lease (granted after, at least as long) outlives it.
        let now = now_ms();
        let life = if max_life > 0 {
            ms(req.ttl).min(max_life)
        } else {
            ms(req.ttl)
        };
        let etcd_lease = s.kv.grant(life, deadline).await?;
        let rec = Record::new(
            token,
            now,
            now + life,
            (max_life > 0).then(|| now + max_life),
            &lease_id,
            &req.owner,
            (!metadata.is_empty()).then(|| metadata.clone()),
        );
        let cached = Cached {
            fp: fp.clone(),
            token,
            outcome: Outcome::Acquired.as_str().into(),
            lease_id_sha256: rec.lease_id_sha256.clone(),
        };
        let writes = vec![
            put(&keys[FENCE], token.to_string().into_bytes(), 0),
            put(&keys[LEASE], rec.encode(), etcd_lease),
            put(&keys[REQUEST], cached.encode(), bucket),
        ];
        match s.kv.guarded(&snap, writes, deadline).await {
            Ok(Guarded::Written) => {
                let lease = Some(rec.lease(t, Some(&lease_id)));
                return Ok(reply(now, Outcome::Acquired, lease, "lease acquired"));
            }
            Ok(Guarded::Changed(now_there)) => snap = now_there,
            Ok(Guarded::LeaseGone) => s.kv.forget_buckets(),
            Err(e) => {
                if matches!(e, StoreError::BackendUnavailable(_)) {
                    s.kv.revoke_later(etcd_lease);
                }
                return Err(e);
            }
        }
        s.kv.revoke_later(etcd_lease);
    }
    Err(busy())
}

pub(super) async fn renew(s: &EtcdStore, req: &RenewRequest) -> Result<Reply, StoreError> {
    let (t, h) = (&req.target, &req.handle);
    let (token, ttl) = (h.token.to_string(), ms(req.ttl).to_string());
    // A plain renewal keeps the fingerprint it always had; an extend-only
    // one is another request (the other stores' rule).
    let fp = if req.extend_only {
        fingerprint(&[&h.lease_id, &token, &ttl, "extend"])
    } else {
        fingerprint(&[&h.lease_id, &token, &ttl])
    };
    let keys = vec![
        s.keys.fence(t),
        s.keys.lease(t),
        s.keys.request(t, "renew", &h.owner, &req.request_id),
    ];
    let deadline = Deadline::after(s.timeout);
    let mut snap = s.kv.read(&keys, deadline).await?;
    for _ in 0..ROUNDS {
        let slot = Slot::read(snap.get(LEASE), snap.get(FENCE), snap.now);
        let rule = Rule::Revalidate {
            live: Outcome::Renewed,
            live_msg: "lease renewed (replayed request)",
            lease_id: &h.lease_id,
            superseded: |now, _, _| bare(now, Outcome::NotOwner, "the lease was superseded"),
            ended: "the lease has ended",
        };
        if let Some(r) = replay(snap.get(REQUEST), &fp, &slot, snap.now, t, rule) {
            return Ok(r);
        }
        let mut rec = match slot {
            Slot::Corrupt { why, .. } => return Ok(bare(snap.now, Outcome::CorruptState, why)),
            // A lingering record's holder has passed its deadline: it has stopped.
            Slot::Free | Slot::Lingering(_) => {
                return Ok(bare(snap.now, Outcome::Expired, "the lease has ended"));
            }
            Slot::Live(r) if !r.held_by(h) => {
                return Ok(bare(snap.now, Outcome::NotOwner, NOT_OWNER));
            }
            Slot::Live(r) => r,
        };
        // It lasts the window from any moment until the call's deadline.
        let window = IDEMPOTENCY_WINDOW + s.timeout;
        let bucket = s.kv.bucket(window, now_ms(), deadline).await?;
        let now = now_ms();
        let mut expires = now + ms(req.ttl);
        if req.extend_only {
            // Never earlier than the deadline the holder already has.
            expires = expires.max(rec.expires_ms);
        }
        let expires = expires.min(rec.max_expires_ms.unwrap_or(u64::MAX));
        if expires <= now {
            return Ok(bare(now, Outcome::Expired, "the lease has ended"));
        }
        let etcd_lease = s.kv.grant(expires - now, deadline).await?;
        // etcd has no clock: the holder's deadline is judged by this
        // client's clock just before the write is sent, not when the record
        // was read; a holder past it has stopped, and is not renewed.
        let sending = now_ms();
        if rec.expires_ms <= sending {
            s.kv.revoke_later(etcd_lease);
            return Ok(bare(sending, Outcome::Expired, "the lease has ended"));
        }
        rec.expires_ms = expires;
        let cached = Cached {
            fp: fp.clone(),
            token: rec.token,
            outcome: Outcome::Renewed.as_str().into(),
            lease_id_sha256: rec.lease_id_sha256.clone(),
        };
        let old = snap.get(LEASE).map_or(0, |l| l.lease);
        let writes = vec![
            put(&keys[LEASE], rec.encode(), etcd_lease),
            put(&keys[REQUEST], cached.encode(), bucket),
        ];
        match s.kv.guarded(&snap, writes, deadline).await {
            Ok(Guarded::Written) => {
                s.kv.revoke_later(old);
                let lease = Some(rec.lease(t, Some(&h.lease_id)));
                return Ok(reply(now, Outcome::Renewed, lease, "lease renewed"));
            }
            Ok(Guarded::Changed(now_there)) => snap = now_there,
            Ok(Guarded::LeaseGone) => s.kv.forget_buckets(),
            Err(e) => {
                if matches!(e, StoreError::BackendUnavailable(_)) {
                    s.kv.revoke_later(etcd_lease);
                }
                return Err(e);
            }
        }
        s.kv.revoke_later(etcd_lease);
    }
    Err(busy())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derived_lease_id_names_its_request_and_nothing_else() {
        let t = Target::new("ns", "t");
        let id = derived_lease_id(&t, "o", "r");
        assert_eq!(id, derived_lease_id(&t, "o", "r"));
        assert_eq!(id.len(), 32);
        for other in [
            derived_lease_id(&Target::new("ns", "u"), "o", "r"),
            derived_lease_id(&Target::new("nst", ""), "o", "r"),
            derived_lease_id(&t, "o2", "r"),
            derived_lease_id(&t, "o", "r2"),
            derived_lease_id(&t, "or", ""),
        ] {
            assert_ne!(id, other);
        }
    }
}

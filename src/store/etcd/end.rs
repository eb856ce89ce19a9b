//! Release, revoke and commit: the operations that end a lease record or
//! write beside it. Like acquire and renew, each decides on one consistent
//! read and writes in one transaction guarded by the `mod_revision` of
//! every key it read; a failed guard wrote nothing and the decision is made
//! again.

use etcd_client::TxnOp;

use super::EtcdStore;
use super::grant::{FENCE, LEASE, NOT_OWNER, REQUEST, ROUNDS, busy, put};
use super::kv::{Deadline, Guarded, Snapshot, now_ms};
use super::records::{Cached, CommitRecord, Slot, counter, fingerprint};
use super::replay::{Rule, bare, replay, reply};
use crate::store::{
    CommitRequest, IDEMPOTENCY_WINDOW, Outcome, ReleaseRequest, Reply, RevokeRequest, StoreError,
};

/// Index of the commit key in a commit's snapshot.
const COMMIT: usize = 3;

/// What one round decided: an answer as it stands, or writes whose
/// success makes `answer` true (`cache`: the outcome to remember, if any).
struct Plan {
    answer: Reply,
    writes: Vec<TxnOp>,
    cache: Option<Cached>,
}

impl Plan {
    fn answer(answer: Reply) -> Self {
        Self {
            answer,
            writes: Vec::new(),
            cache: None,
        }
    }
}

/// Runs rounds of `decide` until one answers without writing, or its
/// writes (and the request cache entry) are applied. On success the etcd
/// lease of the record as read is revoked when `ends_record` (no key uses
/// it any more).
async fn rounds(
    s: &EtcdStore,
    keys: &[String],
    ends_record: bool,
    mut decide: impl FnMut(&Snapshot) -> Plan,
) -> Result<Reply, StoreError> {
    let deadline = Deadline::after(s.timeout);
    let mut snap = s.kv.read(keys, deadline).await?;
    for _ in 0..ROUNDS {
        // The request cache's bucket is fetched before the decision that
        // is sent, so that the clock it is judged by is read as late as it
        // can be; it lasts the window from any moment until the deadline.
        let bucket = if decide(&snap).cache.is_some() {
            let window = IDEMPOTENCY_WINDOW + s.timeout;
            Some(s.kv.bucket(window, now_ms(), deadline).await?)
        } else {
            None
        };
        // etcd has no clock: a deadline is judged by this client's clock
        // just before the write is sent, not when the keys were read (a
        // record whose deadline passed meanwhile has ended).
        snap.now = now_ms();
        let Plan {
            answer,
            mut writes,
            cache,
        } = decide(&snap);
        if writes.is_empty() && cache.is_none() {
            return Ok(answer);
        }
        if let Some(cached) = cache {
            let bucket = match bucket {
                Some(b) => b,
                None => s.kv.bucket(IDEMPOTENCY_WINDOW, snap.now, deadline).await?,
            };
            writes.push(put(&keys[REQUEST], cached.encode(), bucket));
        }
        let old = snap.get(LEASE).map_or(0, |l| l.lease);
        match s.kv.guarded(&snap, writes, deadline).await? {
            Guarded::Written => {
                if ends_record {
                    s.kv.revoke_later(old);
                }
                return Ok(answer);
            }
            Guarded::Changed(now_there) => snap = now_there,
            Guarded::LeaseGone => s.kv.forget_buckets(),
        }
    }
    Err(busy())
}

fn remember(fp: &str, token: u64, outcome: Outcome, id_sha: &str) -> Option<Cached> {
    Some(Cached {
        fp: fp.to_owned(),
        token,
        outcome: outcome.as_str().into(),
        lease_id_sha256: id_sha.to_owned(),
    })
}

pub(super) async fn release(s: &EtcdStore, req: &ReleaseRequest) -> Result<Reply, StoreError> {
    let (t, h) = (&req.target, &req.handle);
    let fp = fingerprint(&[&h.lease_id, &h.token.to_string()]);
    let keys = vec![
        s.keys.fence(t),
        s.keys.lease(t),
        s.keys.request(t, "release", &h.owner, &req.request_id),
    ];
    let delete = || vec![TxnOp::delete(keys[LEASE].as_str(), None)];
    rounds(s, &keys, true, |snap| {
        let now = snap.now;
        let slot = Slot::read(snap.get(LEASE), snap.get(FENCE), now);
        let rule = Rule::Done(|_| "lease released (replayed request)");
        if let Some(r) = replay(snap.get(REQUEST), &fp, &slot, now, t, rule) {
            return Plan::answer(r);
        }
        match slot {
            // The exact handle may clear a record whose handle still reads.
            Slot::Corrupt {
                handle: Some(id), ..
            } if id.held_by(h) => Plan {
                answer: bare(
                    now,
                    Outcome::Released,
                    "corrupt lease record removed by its holder",
                ),
                writes: delete(),
                cache: remember(&fp, h.token, Outcome::Released, &id.lease_id_sha256),
            },
            Slot::Corrupt { why, .. } => Plan::answer(bare(now, Outcome::CorruptState, why)),
            Slot::Free => Plan::answer(bare(now, Outcome::Expired, "the lease has ended")),
            // Past its deadline the lease has ended; its holder may still
            // clear the record etcd keeps, so the next owner need not wait.
            Slot::Lingering(r) if r.held_by(h) => Plan {
                answer: bare(
                    now,
                    Outcome::Expired,
                    "the lease had ended; its record is removed",
                ),
                writes: delete(),
                cache: None,
            },
            Slot::Lingering(_) => Plan::answer(bare(now, Outcome::Expired, "the lease has ended")),
            Slot::Live(r) if !r.held_by(h) => Plan::answer(bare(now, Outcome::NotOwner, NOT_OWNER)),
            Slot::Live(r) => Plan {
                answer: reply(
                    now,
                    Outcome::Released,
                    Some(r.lease(t, Some(&h.lease_id))),
                    "lease released",
                ),
                writes: delete(),
                cache: remember(&fp, r.token, Outcome::Released, &r.lease_id_sha256),
            },
        }
    })
    .await
}

pub(super) async fn revoke(s: &EtcdStore, req: &RevokeRequest) -> Result<Reply, StoreError> {
    let t = &req.target;
    let fp = fingerprint(&[&req.token.map(|n| n.to_string()).unwrap_or_default()]);
    let keys = vec![
        s.keys.fence(t),
        s.keys.lease(t),
        s.keys.request(t, "revoke", "", &req.request_id),
    ];
    rounds(s, &keys, true, |snap| {
        let now = snap.now;
        let slot = Slot::read(snap.get(LEASE), snap.get(FENCE), now);
        let rule = Rule::Done(|outcome| match outcome {
            Outcome::NotFound => "target had no live lease (replayed request)",
            _ => "lease revoked (replayed request)",
        });
        if let Some(r) = replay(snap.get(REQUEST), &fp, &slot, now, t, rule) {
            return Plan::answer(r);
        }
        if let Some(want) = req.token {
            match &slot {
                Slot::Live(r) | Slot::Lingering(r) if r.token != want => {
                    let why = "the live lease has another fencing token";
                    return Plan::answer(bare(now, Outcome::NotOwner, why));
                }
                Slot::Corrupt { handle, why } if handle.as_ref().map(|i| i.token) != Some(want) => {
                    return Plan::answer(bare(now, Outcome::CorruptState, why));
                }
                _ => {}
            }
        }
        let (answer, id_sha) = match &slot {
            Slot::Free => (
                bare(now, Outcome::NotFound, "target has no live lease"),
                String::new(),
            ),
            Slot::Corrupt { handle, .. } => (
                bare(now, Outcome::Revoked, "corrupt lease record removed"),
                handle
                    .as_ref()
                    .map(|i| i.lease_id_sha256.clone())
                    .unwrap_or_default(),
            ),
            Slot::Live(r) | Slot::Lingering(r) => (
                reply(
                    now,
                    Outcome::Revoked,
                    Some(r.lease(t, None)),
                    "lease revoked",
                ),
                r.lease_id_sha256.clone(),
            ),
        };
        let mut writes = Vec::new();
        if snap.get(LEASE).is_some() {
            writes.push(TxnOp::delete(keys[LEASE].as_str(), None));
        }
        // Removing a record never lowers the counter: one whose counter went
        // missing or fell behind leaves it at the record's token at least.
        let fence = snap.get(FENCE).and_then(|f| counter(&f.value));
        if let Some(seen) = slot.seen_token()
            && fence.is_none_or(|c| c < seen)
        {
            writes.push(put(&keys[FENCE], seen.to_string().into_bytes(), 0));
        }
        let token = slot.seen_token().unwrap_or(0);
        Plan {
            cache: remember(&fp, token, answer.outcome, &id_sha),
            answer,
            writes,
        }
    })
    .await
}

pub(super) async fn commit(s: &EtcdStore, req: &CommitRequest) -> Result<Reply, StoreError> {
    let t = &req.target;
    let fp = fingerprint(&[&req.token.to_string(), &req.key, &req.value]);
    let keys = vec![
        s.keys.fence(t),
        s.keys.lease(t),
        s.keys.request(t, "commit", "", &req.request_id),
        s.keys.commit(t, &req.key),
    ];
    rounds(s, &keys, false, |snap| {
        let now = snap.now;
        let slot = Slot::read(snap.get(LEASE), snap.get(FENCE), now);
        let rule = Rule::Done(|_| "value committed (replayed request)");
        if let Some(r) = replay(snap.get(REQUEST), &fp, &slot, now, t, rule) {
            return Plan::answer(r);
        }
        let r = match slot {
            Slot::Corrupt { why, .. } => {
                return Plan::answer(bare(now, Outcome::CorruptState, why));
            }
            // Past its deadline the holder has stopped: nothing commits with it.
            Slot::Free | Slot::Lingering(_) => {
                return Plan::answer(bare(now, Outcome::Expired, "target has no live lease"));
            }
            Slot::Live(r) if r.token != req.token => {
                let why = "token is not the current lease's";
                return Plan::answer(bare(now, Outcome::StaleToken, why));
            }
            Slot::Live(r) => r,
        };
        if let Some(last) = snap.get(COMMIT) {
            match CommitRecord::decode(&last.value) {
                None => {
                    return Plan::answer(bare(
                        now,
                        Outcome::CorruptState,
                        "commit record is unparsable",
                    ));
                }
                Some(c) if c.token > req.token => {
                    let why = "a higher token was already committed for this key";
                    return Plan::answer(bare(now, Outcome::StaleToken, why));
                }
                Some(_) => {}
            }
        }
        let record = CommitRecord {
            token: req.token,
            committed_ms: now,
            value: req.value.clone(),
        };
        Plan {
            answer: reply(
                now,
                Outcome::Committed,
                Some(r.lease(t, None)),
                "value committed",
            ),
            writes: vec![put(&keys[COMMIT], record.encode(), 0)],
            cache: remember(&fp, req.token, Outcome::Committed, ""),
        }
    })
    .await
}

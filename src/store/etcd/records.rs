//! What the keys hold, and how a stored lease record is judged.
//!
//! Values are JSON. A lease record that cannot be read fails closed
//! (`corrupt_state`); when its handle's fields (token, lease id hash,
//! owner) still read, the exact handle can still end it. The lease id itself is
//! never stored: only its SHA-256.

use serde::{Deserialize, Serialize};

use super::keys::hex;
use crate::store::{Lease, LeaseHandle, MAX_TOKEN, Target, metadata_from_json};

/// The only lease record version this code writes and reads.
const VERSION: u64 = 1;

/// A lease record as stored under `<prefix>/lease/…`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Record {
    /// Record format version ([`VERSION`]).
    pub v: u64,
    pub token: u64,
    pub acquired_ms: u64,
    /// The holder's deadline: the client's clock before the request, plus the ttl.
    pub expires_ms: u64,
    pub max_expires_ms: Option<u64>,
    /// SHA-256 of the lease id, hex.
    pub lease_id_sha256: String,
    pub owner: String,
    /// The metadata as compact JSON text, when given.
    pub metadata: Option<String>,
}

impl Record {
    /// A version 1 record.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        token: u64,
        acquired_ms: u64,
        expires_ms: u64,
        max_expires_ms: Option<u64>,
        lease_id: &str,
        owner: &str,
        metadata: Option<String>,
    ) -> Self {
        Self {
            v: VERSION,
            token,
            acquired_ms,
            expires_ms,
            max_expires_ms,
            lease_id_sha256: id_hash(lease_id),
            owner: owner.to_owned(),
            metadata,
        }
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// True when `h` is exactly this record's holder.
    pub(super) fn held_by(&self, h: &LeaseHandle) -> bool {
        self.owner == h.owner
            && self.token == h.token
            && self.lease_id_sha256 == id_hash(&h.lease_id)
    }

    /// The lease as a reply shows it; `lease_id` only when the caller proved it.
    pub(super) fn lease(&self, target: &Target, lease_id: Option<&str>) -> Lease {
        Lease {
            target: target.name.clone(),
            lease_id: lease_id.map(str::to_owned),
            owner: self.owner.clone(),
            fencing_token: self.token,
            acquired_at_ms: self.acquired_ms,
            expires_at_ms: self.expires_ms,
            max_expires_at_ms: self.max_expires_ms,
            metadata: self.metadata.as_deref().and_then(metadata_from_json),
        }
    }
}

/// The stored form of a lease id.
pub(super) fn id_hash(lease_id: &str) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, lease_id.as_bytes()).as_ref())
}

/// The fields of a record's handle (its owner, token and lease id hash),
/// read even when the rest of the record is unreadable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct HandleFields {
    pub token: u64,
    pub lease_id_sha256: String,
    pub owner: String,
}

impl HandleFields {
    pub(super) fn held_by(&self, h: &LeaseHandle) -> bool {
        self.owner == h.owner
            && self.token == h.token
            && self.lease_id_sha256 == id_hash(&h.lease_id)
    }
}

/// A stored key as read: its bytes, its `mod_revision` (the guard of every
/// write that depends on it) and its etcd lease (0: none).
#[derive(Clone, Debug)]
pub(super) struct Stored {
    pub value: Vec<u8>,
    pub mod_revision: i64,
    pub lease: i64,
}

/// A target's lease as one operation sees it at `now` (the client's clock).
#[derive(Clone, Debug)]
pub(super) enum Slot {
    /// No record: the target is free.
    Free,
    /// A record whose holder's deadline has not passed.
    Live(Record),
    /// A record etcd still keeps although its holder's deadline passed (TTLs
    /// are whole seconds, expired leases are revoked on a ticker, and a
    /// leader change restarts every TTL). It still blocks the target; its
    /// holder has stopped, so it can no longer be renewed or committed with.
    Lingering(Record),
    /// Unreadable; `handle` when its handle's fields still read.
    Corrupt {
        handle: Option<HandleFields>,
        why: &'static str,
    },
}

impl Slot {
    /// Judges the lease key `lease` against the counter `fence`, at `now`.
    pub(super) fn read(lease: Option<&Stored>, fence: Option<&Stored>, now: u64) -> Slot {
        let Some(stored) = lease else {
            return Slot::Free;
        };
        let doc: Option<serde_json::Value> = serde_json::from_slice(&stored.value).ok();
        let handle = doc.as_ref().and_then(handle_of);
        let corrupt = |handle: Option<HandleFields>, why| Slot::Corrupt { handle, why };
        let version = doc
            .as_ref()
            .and_then(|d| d.get("v"))
            .and_then(|v| v.as_u64());
        if doc.is_none() || handle.is_none() {
            return corrupt(handle, "lease record is unparsable");
        }
        if version != Some(VERSION) {
            return corrupt(handle, "lease record has an unknown version");
        }
        let Ok(r) = serde_json::from_slice::<Record>(&stored.value) else {
            return corrupt(handle, "lease record is unparsable");
        };
        match fence.map(|f| counter(&f.value)) {
            Some(Some(c)) if c >= r.token => {}
            _ => return corrupt(None, "fence counter is missing or behind the lease"),
        }
        if stored.lease == 0 {
            return corrupt(handle, "lease record has no expiry");
        }
        if r.acquired_ms > r.expires_ms || r.max_expires_ms.is_some_and(|m| r.expires_ms > m) {
            return corrupt(handle, "lease record's expiry disagrees with itself");
        }
        if r.metadata
            .as_deref()
            .is_some_and(|m| metadata_from_json(m).is_none())
        {
            return corrupt(handle, "lease record has unreadable metadata");
        }
        if r.expires_ms <= now {
            Slot::Lingering(r)
        } else {
            Slot::Live(r)
        }
    }

    /// The token of whatever record is there, readable or not.
    pub(super) fn seen_token(&self) -> Option<u64> {
        match self {
            Slot::Free => None,
            Slot::Live(r) | Slot::Lingering(r) => Some(r.token),
            Slot::Corrupt { handle, .. } => handle.as_ref().map(|i| i.token),
        }
    }
}

fn handle_of(doc: &serde_json::Value) -> Option<HandleFields> {
    let token = doc
        .get("token")?
        .as_u64()
        .filter(|t| (1..=MAX_TOKEN).contains(t))?;
    let sha = doc.get("lease_id_sha256")?.as_str()?;
    let owner = doc.get("owner")?.as_str()?;
    (sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit())).then(|| HandleFields {
        token,
        lease_id_sha256: sha.to_owned(),
        owner: owner.to_owned(),
    })
}

/// A fencing counter's value: a canonical decimal up to [`MAX_TOKEN`].
pub(super) fn counter(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value).ok()?;
    let n: u64 = text.parse().ok()?;
    (n.to_string() == text && n <= MAX_TOKEN).then_some(n)
}

/// A request cache entry: what a replay must repeat, and what it returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Cached {
    /// Fingerprint of every input of the request.
    pub fp: String,
    /// The token the request acted on (0 when none).
    pub token: u64,
    /// The outcome it had.
    pub outcome: String,
    /// SHA-256 of the lease id it acted on ("" when none).
    pub lease_id_sha256: String,
}

impl Cached {
    pub(super) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub(super) fn decode(value: &[u8]) -> Option<Cached> {
        serde_json::from_slice(value).ok()
    }
}

/// The fingerprint of a request's inputs (length-prefixed, so no two input
/// lists share one).
pub(super) fn fingerprint(inputs: &[&str]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in inputs {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part.as_bytes());
    }
    hex(ctx.finish().as_ref())
}

/// A fenced commit as stored under `<prefix>/c/…`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CommitRecord {
    pub token: u64,
    pub committed_ms: u64,
    pub value: String,
}

impl CommitRecord {
    pub(super) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// `None` when unreadable (the caller answers `corrupt_state`).
    pub(super) fn decode(value: &[u8]) -> Option<CommitRecord> {
        serde_json::from_slice::<CommitRecord>(value)
            .ok()
            .filter(|c| (1..=MAX_TOKEN).contains(&c.token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(value: Vec<u8>, lease: i64) -> Stored {
        Stored {
            value,
            mod_revision: 5,
            lease,
        }
    }

    #[test]
    fn records_are_judged_like_the_scripts_judge_them() {
        let r = Record::new(3, 1000, 2000, Some(3000), "id-0123456789abcdef", "o", None);
        let fence = stored(b"3".to_vec(), 0);
        let rec = stored(r.encode(), 7);
        assert!(matches!(
            Slot::read(Some(&rec), Some(&fence), 1999),
            Slot::Live(_)
        ));
        assert!(matches!(
            Slot::read(Some(&rec), Some(&fence), 2000),
            Slot::Lingering(_)
        ));
        assert!(matches!(Slot::read(None, Some(&fence), 0), Slot::Free));
        let behind = stored(b"2".to_vec(), 0);
        assert!(matches!(
            Slot::read(Some(&rec), Some(&behind), 0),
            Slot::Corrupt { handle: None, .. }
        ));
        let no_expiry = stored(r.encode(), 0);
        let Slot::Corrupt {
            handle: Some(id), ..
        } = Slot::read(Some(&no_expiry), Some(&fence), 0)
        else {
            panic!("a record without an etcd lease is corrupt");
        };
        let h = LeaseHandle {
            owner: "o".into(),
            lease_id: "id-0123456789abcdef".into(),
            token: 3,
        };
        assert!(id.held_by(&h) && r.held_by(&h));
        let mut v2 = serde_json::to_value(&r).unwrap();
        v2["v"] = 2.into();
        let v2 = stored(serde_json::to_vec(&v2).unwrap(), 7);
        assert!(matches!(
            Slot::read(Some(&v2), Some(&fence), 0),
            Slot::Corrupt {
                handle: Some(_),
                why: "lease record has an unknown version"
            }
        ));
        let garbage = stored(b"\x01not a lease".to_vec(), 7);
        assert!(matches!(
            Slot::read(Some(&garbage), Some(&fence), 0),
            Slot::Corrupt { handle: None, .. }
        ));
    }

    #[test]
    fn counters_are_canonical_decimals() {
        assert_eq!(counter(b"42"), Some(42));
        for bad in [
            &b"042"[..],
            b"-1",
            b"",
            b"1.0",
            b"9223372036854775808",
            b"x",
        ] {
            assert_eq!(counter(bad), None, "{bad:?}");
        }
    }
}

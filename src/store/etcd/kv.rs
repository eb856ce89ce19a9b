//! The etcd calls the lease operations are made of, each sent once and
//! bounded by the operation's deadline: a consistent read of a few keys, a
//! transaction guarded by the `mod_revision` of every key it read, etcd
//! lease grants (one per acquisition or renewal, and shared time-bucket
//! leases for the request cache) and best-effort revokes of leases no key
//! uses any more.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{
    AlarmAction, AlarmType, Client, Compare, CompareOp, ConnectOptions, GetOptions, TxnOp,
    TxnOpResponse,
};
use tokio::time::Instant;

use super::Space;
use super::errors::{Effect, classify, late, lease_not_found, unsent};
use super::records::Stored;
use crate::store::StoreError;

/// How long one request cache bucket lease spans: every entry due to end
/// within the same span shares one etcd lease.
const BUCKET_MS: u64 = 60_000;

/// How many times one call is made at most while the connection it is
/// handed cannot be made. The client hands each call to a member at random
/// and opens the connection when it is needed, so with a member down
/// (refusing connections at once) a call handed to it was never sent, and
/// is made again, to be handed to a member again. With one member of three
/// down, all 16 tries meet it about once in 43 million calls; with every
/// member down, the caller hears so at once.
const SEND_TRIES: usize = 16;

/// How many keys one page of a range read holds. A lease record and its
/// key are at most about 11 KB (metadata of 4 KiB stored as a JSON string,
/// every quote escaped: 8 KiB; an owner of 256 bytes, escaped: 512; a key
/// of escaped names: 1.5 KB; the rest), so a page stays near 2 MiB, half
/// the 4 MiB the client accepts.
const PAGE: i64 = 200;

/// The client's wall clock, in Unix milliseconds (etcd has none to offer).
pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Some keys as read at one revision, and the client's clock sampled
/// before the read was sent.
#[derive(Clone, Debug)]
pub(super) struct Snapshot {
    pub keys: Vec<String>,
    pub stored: Vec<Option<Stored>>,
    pub now: u64,
}

impl Snapshot {
    /// The `i`th key as read.
    pub fn get(&self, i: usize) -> Option<&Stored> {
        self.stored.get(i).and_then(Option::as_ref)
    }
}

/// What a guarded transaction did.
pub(super) enum Guarded {
    /// Every guard held: the writes were applied.
    Written,
    /// A key changed since the snapshot: nothing was written; the keys as
    /// they are now.
    Changed(Snapshot),
    /// An etcd lease the writes name is gone (expired or revoked): nothing
    /// was written.
    LeaseGone,
}

/// The etcd client and the request cache's bucket leases.
pub(super) struct Kv {
    client: Client,
    /// The Watches' own client, made on first use from `watching`.
    watches: tokio::sync::OnceCell<Client>,
    watching: Later,
    /// Bucket index -> etcd lease id, for request cache entries.
    buckets: Mutex<BTreeMap<u64, i64>>,
}

/// How to make a client later (its options hold the password: no `Debug`).
pub(super) struct Later {
    pub uris: Vec<String>,
    pub opts: ConnectOptions,
    pub timeout: Duration,
}

/// A client on `uris`, connected by `deadline` (with a user, connecting
/// authenticates, a call: sent again like any call that was never sent).
pub(super) async fn connect(
    uris: &[String],
    opts: ConnectOptions,
    deadline: Deadline,
) -> Result<Client, StoreError> {
    match deadline
        .run_raw(|| Client::connect(uris, Some(opts.clone())))
        .await
    {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(classify(&e, Effect::Read)),
        Err(()) => Err(StoreError::BackendUnavailable(format!(
            "cannot reach etcd within {}",
            humantime::format_duration(deadline.timeout)
        ))),
    }
}

impl Kv {
    pub(super) fn new(client: Client, watching: Later) -> Self {
        Self {
            client,
            watches: tokio::sync::OnceCell::new(),
            watching,
            buckets: Mutex::new(BTreeMap::new()),
        }
    }

    /// A Watch client on the Watches' own connection (made now if it is
    /// the first).
    pub(super) async fn watch_client(&self) -> Result<etcd_client::WatchClient, StoreError> {
        let Later {
            uris,
            opts,
            timeout,
        } = &self.watching;
        let client = self
            .watches
            .get_or_try_init(|| connect(uris, opts.clone(), Deadline::after(*timeout)))
            .await?;
        Ok(client.watch_client())
    }

    /// `keys` at one revision, by one transaction of range reads.
    pub(super) async fn read(
        &self,
        keys: &[String],
        deadline: Deadline,
    ) -> Result<Snapshot, StoreError> {
        let now = now_ms();
        let txn = etcd_client::Txn::new().and_then(gets(keys));
        let resp = deadline.run(Effect::Read, || self.txn(&txn)).await?;
        Ok(Snapshot {
            keys: keys.to_vec(),
            stored: decode_gets(&resp.op_responses()),
            now,
        })
    }

    /// Applies `writes` only if no key of `snap` changed since it was read;
    /// otherwise reads them again in the same request.
    pub(super) async fn guarded(
        &self,
        snap: &Snapshot,
        writes: Vec<TxnOp>,
        deadline: Deadline,
    ) -> Result<Guarded, StoreError> {
        let guards: Vec<Compare> = snap
            .keys
            .iter()
            .zip(&snap.stored)
            .map(|(k, s)| {
                let rev = s.as_ref().map_or(0, |s| s.mod_revision);
                Compare::mod_revision(k.as_str(), CompareOp::Equal, rev)
            })
            .collect();
        if Instant::now() >= deadline.at {
            return Err(StoreError::BackendUnavailable(format!(
                "no time left within {} to send the write; nothing was sent",
                humantime::format_duration(deadline.timeout)
            )));
        }
        let now = now_ms();
        let txn = etcd_client::Txn::new()
            .when(guards)
            .and_then(writes)
            .or_else(gets(&snap.keys));
        let resp = match deadline.run_raw(|| self.txn(&txn)).await {
            Ok(Ok(resp)) => resp,
            Ok(Err(e)) if lease_not_found(&e) => return Ok(Guarded::LeaseGone),
            Ok(Err(e)) => return Err(classify(&e, Effect::Write)),
            Err(()) => return Err(late(Effect::Write, deadline.timeout)),
        };
        if resp.succeeded() {
            return Ok(Guarded::Written);
        }
        Ok(Guarded::Changed(Snapshot {
            keys: snap.keys.clone(),
            stored: decode_gets(&resp.op_responses()),
            now,
        }))
    }

    /// Every key under each of `prefixes` with its value, all at one
    /// revision, sorted by key; read in pages of [`PAGE`] keys, so that no
    /// answer outgrows what the client accepts (4 MiB) however many
    /// targets a namespace has.
    pub(super) async fn range(
        &self,
        prefixes: &[String],
        deadline: Deadline,
    ) -> Result<(Vec<Vec<(Vec<u8>, Stored)>>, u64), StoreError> {
        let now = now_ms();
        // 0: the newest revision, then the first page's for every page.
        let mut revision = 0;
        let mut ranges = Vec::with_capacity(prefixes.len());
        for prefix in prefixes {
            let end = prefix_end(prefix.as_bytes());
            let mut from = prefix.as_bytes().to_vec();
            let mut keys = Vec::new();
            loop {
                let opts = GetOptions::new()
                    .with_range(end.clone())
                    .with_limit(PAGE)
                    .with_revision(revision);
                let resp = deadline
                    .run(Effect::Read, || {
                        let (mut kv, from, opts) =
                            (self.client.kv_client(), from.clone(), opts.clone());
                        async move { kv.get(from, Some(opts)).await }
                    })
                    .await?;
                if revision == 0 {
                    revision = resp.header().map_or(0, |h| h.revision());
                }
                keys.extend(resp.kvs().iter().map(|kv| (kv.key().to_vec(), stored(kv))));
                match resp.kvs().last() {
                    Some(last) if resp.more() => {
                        from = last.key().to_vec();
                        from.push(0);
                    }
                    _ => break,
                }
            }
            ranges.push(keys);
        }
        Ok((ranges, now))
    }

    /// A new etcd lease that lives at least `ttl_ms` from now (whole
    /// seconds, rounded up; etcd may raise it to its minimum TTL).
    pub(super) async fn grant(&self, ttl_ms: u64, deadline: Deadline) -> Result<i64, StoreError> {
        let secs = ttl_ms.div_ceil(1000).max(1) as i64;
        let resp = deadline
            .run(Effect::Read, || {
                let mut lease = self.client.lease_client();
                async move { lease.grant(secs, None).await }
            })
            .await?;
        Ok(resp.id())
    }

    /// Revokes etcd lease `id` in the background. For leases no key uses
    /// any more (a record released, renewed onto a new lease, or a grant a
    /// changed target made useless): a failure only leaves it to expire.
    pub(super) fn revoke_later(&self, id: i64) {
        if id == 0 {
            return;
        }
        let mut lease = self.client.lease_client();
        tokio::spawn(async move {
            let revoke = lease.revoke(id);
            if tokio::time::timeout(Duration::from_secs(5), revoke)
                .await
                .is_err()
            {
                tracing::debug!("revoking an unused etcd lease timed out; it will expire");
            }
        });
    }

    /// The shared etcd lease for request cache entries that must live
    /// `window` from `now`: one per span of [`BUCKET_MS`], granted to last
    /// past its span's end.
    pub(super) async fn bucket(
        &self,
        window: Duration,
        now: u64,
        deadline: Deadline,
    ) -> Result<i64, StoreError> {
        let end = now + window.as_millis() as u64;
        let index = end.div_ceil(BUCKET_MS);
        {
            let mut buckets = self.lock_buckets();
            buckets.retain(|k, _| k * BUCKET_MS > now);
            if let Some(id) = buckets.get(&index) {
                return Ok(*id);
            }
        }
        let id = self.grant(index * BUCKET_MS - now + 1000, deadline).await?;
        Ok(*self.lock_buckets().entry(index).or_insert(id))
    }

    /// Forgets every bucket lease (one turned out to be gone).
    pub(super) fn forget_buckets(&self) {
        self.lock_buckets().clear();
    }

    /// A linearizable read of one key (it need not exist): proves a leader
    /// and a quorum answer.
    pub(super) async fn probe(&self, key: &str, deadline: Deadline) -> Result<(), StoreError> {
        let opts = GetOptions::new().with_count_only();
        deadline
            .run(Effect::Read, || {
                let (mut kv, opts) = (self.client.kv_client(), opts.clone());
                async move { kv.get(key, Some(opts)).await }
            })
            .await
            .map(|_| ())
    }

    /// The alarms raised on any member, and the answering member's
    /// database size and quota: what `check` shows of etcd's space.
    pub(super) async fn space(&self, deadline: Deadline) -> Result<Space, StoreError> {
        let m = || self.client.maintenance_client();
        let alarms = deadline
            .run(Effect::Read, || async move {
                m().alarm(AlarmAction::Get, AlarmType::None, None).await
            })
            .await?;
        let status = deadline
            .run(Effect::Read, || async move { m().status().await })
            .await?;
        Ok(Space {
            alarms: alarms
                .alarms()
                .iter()
                .map(|a| (a.alarm().as_str_name().to_owned(), a.member_id()))
                .collect(),
            db_size: u64::try_from(status.db_size()).unwrap_or(0),
            // etcd before 3.6 does not report it.
            quota: u64::try_from(status.db_size_quota())
                .ok()
                .filter(|q| *q > 0),
        })
    }

    /// `txn` sent on a client of its own (the call may be made again).
    fn txn(
        &self,
        txn: &etcd_client::Txn,
    ) -> impl std::future::Future<Output = Result<etcd_client::TxnResponse, etcd_client::Error>>
    {
        let (mut kv, txn) = (self.client.kv_client(), txn.clone());
        async move { kv.txn(txn).await }
    }

    fn lock_buckets(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, i64>> {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The end of the range of keys starting with `prefix` (exclusive).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: every key from the prefix on.
    vec![0]
}

fn gets(keys: &[String]) -> Vec<TxnOp> {
    keys.iter().map(|k| TxnOp::get(k.as_str(), None)).collect()
}

fn stored(kv: &etcd_client::KeyValue) -> Stored {
    Stored {
        value: kv.value().to_vec(),
        mod_revision: kv.mod_revision(),
        lease: kv.lease(),
    }
}

fn decode_gets(responses: &[TxnOpResponse]) -> Vec<Option<Stored>> {
    responses
        .iter()
        .map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().map(stored),
            _ => None,
        })
        .collect()
}

/// The end of one operation: every call of it shares one timeout.
#[derive(Clone, Copy, Debug)]
pub(super) struct Deadline {
    at: Instant,
    timeout: Duration,
}

impl Deadline {
    pub(super) fn after(timeout: Duration) -> Self {
        Self {
            at: Instant::now() + timeout,
            timeout,
        }
    }

    /// The answer to `call`, or the deadline's error for `effect`.
    async fn run<T, F, Fut>(&self, effect: Effect, call: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        match self.run_raw(call).await {
            Ok(r) => r.map_err(|e| classify(&e, effect)),
            Err(()) => Err(late(effect, self.timeout)),
        }
    }

    /// The answer to the call `call` makes, made again while the
    /// connection it was handed could not be made (it was never sent), at
    /// most [`SEND_TRIES`] times; `Err(())` when the deadline passed first.
    async fn run_raw<T, F, Fut>(&self, mut call: F) -> Result<Result<T, etcd_client::Error>, ()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let sent = async {
            let mut tries = 1;
            loop {
                match call().await {
                    Err(e) if tries < SEND_TRIES && unsent(&e) => tries += 1,
                    answer => return answer,
                }
            }
        };
        tokio::time::timeout_at(self.at, sent).await.map_err(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member that refuses connections was sent nothing: even a write
    /// is definite (`backend_unavailable`), and it is answered at once.
    #[tokio::test]
    async fn a_write_to_a_member_that_refuses_connections_is_definite() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let client = Client::connect([format!("http://127.0.0.1:{port}")], None)
            .await
            .unwrap();
        let never = Later {
            uris: Vec::new(),
            opts: ConnectOptions::new(),
            timeout: Duration::ZERO,
        };
        let kv = Kv::new(client, never);
        let snap = Snapshot {
            keys: vec!["k".into()],
            stored: vec![None],
            now: 0,
        };
        let started = std::time::Instant::now();
        let writes = vec![TxnOp::put("k", "v", None)];
        let r = kv
            .guarded(&snap, writes, Deadline::after(Duration::from_secs(5)))
            .await;
        assert!(
            matches!(&r, Err(StoreError::BackendUnavailable(_))),
            "{:?}",
            r.err()
        );
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
    }
}

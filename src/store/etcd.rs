//! The etcd backend: every lease decision is one etcd transaction guarded
//! by the `mod_revision` of each key it depends on, so a decision is
//! linearizable and a guard that failed wrote nothing (the answer stays
//! definite). Tokens come from a per-target counter key (dense, +1, raised
//! by a floor), never from etcd's revisions. Expiry is etcd's: each
//! acquisition puts its record on an etcd lease of its own (TTL: the lease's
//! life in whole seconds, rounded up), and a renewal puts the record on a
//! fresh one.
//!
//! etcd has no clock to offer, so the times this store reports are the
//! client's: `server_time_ms` is the client clock sampled before the
//! request's write is sent (where nothing is written, the sample the answer
//! was decided by: before the read for `get`, `read`, `list`, `acquire` and
//! `renew`, after it for `release`, `revoke` and `commit`), and `expires_at_ms` of a grant is such a sample plus the ttl — a deadline
//! that ends no later than etcd's lease, which starts after the sample and
//! lasts at least as long. Its holder stops at that deadline; etcd may keep
//! the record longer (TTLs round up to whole seconds, expired leases are
//! revoked on a 500 ms ticker, a leader change restarts every TTL), and
//! until it goes the target stays held: a delay for the next owner, never
//! two owners. Renewals and commits of a record whose deadline has passed
//! when their write is sent (judged by the client's clock just before it)
//! are refused (`expired`), which is also how `max_lifetime` holds. One
//! sent just before may be applied after the deadline (for a reply never
//! received, as long as etcd keeps the record unchanged, possibly seconds),
//! never after another acquisition: that changes the record and fails the
//! write's guard.
//!
//! Files: keys in [`keys`], stored values in `records.rs`, the etcd calls in
//! `kv.rs`, error meaning in `errors.rs`, the replay rule in `replay.rs`,
//! acquire and renew in `grant.rs`, release, revoke and commit in `end.rs`,
//! release notices (a Watch of the lease record) in `watch.rs`.

pub mod config;
mod end;
mod errors;
mod grant;
pub mod keys;
mod kv;
mod records;
mod replay;
mod watch;

use std::time::Instant;

use async_trait::async_trait;
use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use futures::stream::BoxStream;

pub use config::{EtcdConfig, is_etcd_url};
pub use keys::KeySpace;
use kv::{Deadline, Kv, now_ms};
use records::{CommitRecord, Slot};
use replay::{bare, reply};

use super::{
    AcquireRequest, CommitRequest, Committed, Health, LeaseStore, Listed, Outcome, ReadReply,
    ReleaseRequest, RenewRequest, Reply, RevokeRequest, StoreError, Target,
};

/// How long the Watches' connection may be silent, with a Watch open,
/// before it is pinged. A Watch waiting for a release hears nothing for
/// minutes, and a member closes a connection pinged more often than every
/// 5 s with nothing sent in between (etcd's default
/// `--grpc-keepalive-min-time`): gRPC's own clients never ping more often
/// than this.
const WATCH_KEEP_ALIVE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// What [`EtcdStore::space`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Space {
    /// Alarms raised: the alarm (`NOSPACE`, `CORRUPT`) and the member's id.
    pub alarms: Vec<(String, u64)>,
    /// The answering member's database file, in bytes.
    pub db_size: u64,
    /// Its quota (`--quota-backend-bytes`), when the member reports it.
    pub quota: Option<u64>,
}

/// [`super::LeaseStore`] on an etcd cluster (v3 API).
pub struct EtcdStore {
    kv: Kv,
    keys: KeySpace,
    timeout: std::time::Duration,
}

/// Whether `url` can be used, before anything connects (the reason never
/// quotes the URL).
pub fn check_url(url: &str) -> Result<(), String> {
    config::parse(url).map(|_| ())
}

fn invalid(why: impl std::fmt::Display) -> StoreError {
    StoreError::Invalid(format!("bad etcd settings: {why}"))
}

/// TLS settings for an `etcds://` URL (rustls with ring; verification always on).
fn tls_options(cfg: &EtcdConfig) -> Result<TlsOptions, StoreError> {
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path)
            .map_err(|e| invalid(format!("cannot read {what} {}: {e}", path.display())))
    };
    let mut tls = TlsOptions::new();
    tls = match &cfg.tls.ca_file {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(read(ca, "CA file")?)),
        None => tls.with_native_roots(),
    };
    if let (Some(cert), Some(key)) = (&cfg.tls.cert_file, &cfg.tls.key_file) {
        let identity = Identity::from_pem(read(cert, "certificate file")?, read(key, "key file")?);
        tls = tls.identity(identity);
    }
    if let Some(name) = &cfg.tls.server_name {
        tls = tls.domain_name(name.clone());
    }
    Ok(tls)
}

/// A member that closes a new TLS connection unanswered has most likely
/// refused our client certificate, or its absence (with TLS 1.3 the refusal
/// comes after the client's side of the handshake is done): say so.
fn tls_hint(e: StoreError, endpoints: &config::Endpoints, cfg: &EtcdConfig) -> StoreError {
    match e {
        StoreError::BackendUnavailable(why) if endpoints.tls && why.contains(errors::CLOSED) => {
            let hint = if cfg.tls.cert_file.is_some() {
                "the members may not trust the authority that signed our client certificate"
            } else {
                "the members may require a client certificate (see --tls-cert-file and --tls-key-file)"
            };
            StoreError::BackendUnavailable(format!("{why}: {hint}"))
        }
        other => other,
    }
}

impl EtcdStore {
    /// Connects and proves a leader answers (a linearizable read), within
    /// the connect timeout.
    pub async fn connect(cfg: &EtcdConfig) -> Result<Self, StoreError> {
        let keys = KeySpace::new(&cfg.key_prefix)?;
        let endpoints = config::parse(&cfg.url).map_err(invalid)?;
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(cfg.connect_timeout)
            // A member without a leader refuses at once ("no leader"), definitely.
            .with_require_leader(true);
        if endpoints.tls {
            opts = opts.with_tls(tls_options(cfg)?);
        } else if cfg.tls.ca_file.is_some()
            || cfg.tls.cert_file.is_some()
            || cfg.tls.server_name.is_some()
        {
            return Err(invalid(
                "TLS files or a TLS server name were given but the URL does not use TLS (etcds://)",
            ));
        }
        let username = cfg.username.clone().or(endpoints.username.clone());
        match (&username, &cfg.password) {
            (Some(user), Some(password)) => {
                // A request refused for an expired token is sent again once
                // with a new one: etcd refused it before running it.
                opts = opts
                    .with_user(user.clone(), password.expose())
                    .with_auto_token_refresh(true);
            }
            (None, Some(_)) => return Err(invalid("a password needs a user name (--username)")),
            (Some(_), None) => {
                return Err(invalid(
                    "etcd authentication needs a password (--password-file)",
                ));
            }
            (None, None) => {}
        }
        // Pinged only while something is open (a member closes a
        // connection pinged while nothing is, etcd's policy), and given up
        // when a ping is not answered within the connect timeout. Calls
        // have a connection of their own, pinged once it has heard nothing
        // from the member for `--connect-timeout` while a call is open, so
        // a member gone silent is found that fast. No more often than a
        // third of `--timeout`, though: a member closes a connection whose
        // fourth ping in a row came before it said anything, so a call it
        // answers within its deadline never meets that. The Watches have
        // another connection, pinged far less often (see
        // `WATCH_KEEP_ALIVE_EVERY`), made on first use.
        let ping_after = cfg.connect_timeout.max(cfg.timeout / 3);
        let calls = opts
            .clone()
            .with_keep_alive(ping_after, cfg.connect_timeout)
            .with_keep_alive_while_idle(false);
        let watches = opts
            .with_keep_alive(WATCH_KEEP_ALIVE_EVERY, cfg.connect_timeout)
            .with_keep_alive_while_idle(false);
        // Connecting and the first answer share the connect timeout.
        let deadline = Deadline::after(cfg.connect_timeout);
        let client = kv::connect(&endpoints.uris(), calls, deadline).await?;
        let store = Self {
            kv: Kv::new(
                client,
                kv::Later {
                    uris: endpoints.uris(),
                    opts: watches,
                    timeout: cfg.connect_timeout,
                },
            ),
            keys,
            timeout: cfg.timeout,
        };
        store
            .kv
            .probe(&store.keys.health(), deadline)
            .await
            .map_err(|e| tls_hint(e, &endpoints, cfg))?;
        Ok(store)
    }

    /// etcd's alarms and the answering member's space (for `check`): while
    /// an alarm is raised etcd refuses every write, and it raises
    /// `NOSPACE` when a member's database reaches its quota. Any
    /// authenticated user may ask.
    pub async fn space(&self) -> Result<Space, StoreError> {
        self.kv.space(Deadline::after(self.timeout)).await
    }

    /// The key layout this store writes.
    pub fn keys(&self) -> &KeySpace {
        &self.keys
    }

    /// Every target whose lease record ends from now on — released,
    /// revoked, or expired (etcd deletes the record itself) — as the
    /// operator's waiters want them. The watch resumes after a broken
    /// stream from where it stopped; the stream ends when the store can no
    /// longer watch (the client is gone).
    pub async fn release_notices(&self) -> Result<BoxStream<'static, Target>, StoreError> {
        let client = self.kv.watch_client().await?;
        watch::release_notices(client, self.keys.clone(), self.timeout).await
    }

    fn judged(&self, target: &Target, slot: Slot, now: u64) -> Reply {
        match slot {
            Slot::Corrupt { why, .. } => bare(now, Outcome::CorruptState, why),
            Slot::Free => bare(now, Outcome::NotFound, "target has no live lease"),
            Slot::Live(r) => reply(
                now,
                Outcome::Found,
                Some(r.lease(target, None)),
                "target is held",
            ),
            Slot::Lingering(r) => reply(
                now,
                Outcome::Found,
                Some(r.lease(target, None)),
                "the holder's deadline has passed; etcd still keeps the lease, so the target stays held",
            ),
        }
    }
}

/// `result`, or what the `lost-reply-*` fail points (`crate::store::failpoints`)
/// make of a lost reply to `op` (`args`: the request's named arguments).
fn lost(
    result: Result<Reply, StoreError>,
    op: &str,
    args: impl FnOnce() -> Vec<(&'static str, String)>,
) -> Result<Reply, StoreError> {
    match result {
        Err(e) => crate::store::failpoints::lost_reply(&e, op, &args()).unwrap_or(Err(e)),
        ok => ok,
    }
}

#[async_trait]
impl LeaseStore for EtcdStore {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        let mut reply = grant::acquire(self, req).await?;
        crate::store::failpoints::acquired(&mut reply);
        Ok(reply)
    }

    async fn renew(&self, req: &RenewRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        let h = &req.handle;
        lost(grant::renew(self, req).await, "renew", || {
            vec![
                ("lease_id", h.lease_id.clone()),
                ("owner", h.owner.clone()),
                ("token", h.token.to_string()),
                ("ttl", req.ttl.as_millis().to_string()),
            ]
        })
    }

    async fn release(&self, req: &ReleaseRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        lost(end::release(self, req).await, "release", Vec::new)
    }

    async fn get(&self, target: &Target) -> Result<Reply, StoreError> {
        target.validate()?;
        let keys = [self.keys.fence(target), self.keys.lease(target)];
        let snap = self.kv.read(&keys, Deadline::after(self.timeout)).await?;
        let slot = Slot::read(snap.get(1), snap.get(0), snap.now);
        Ok(self.judged(target, slot, snap.now))
    }

    async fn revoke(&self, req: &RevokeRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        lost(end::revoke(self, req).await, "revoke", Vec::new)
    }

    async fn commit(&self, req: &CommitRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        lost(end::commit(self, req).await, "commit", Vec::new)
    }

    async fn read(&self, target: &Target, key: &str) -> Result<ReadReply, StoreError> {
        target.validate()?;
        super::check_name("key", key)?;
        let keys = [self.keys.commit(target, key)];
        let snap = self.kv.read(&keys, Deadline::after(self.timeout)).await?;
        let now = snap.now;
        let (outcome, committed, message) = match snap.get(0) {
            None => (Outcome::NotFound, None, "nothing committed under this key"),
            Some(s) => match CommitRecord::decode(&s.value) {
                None => (Outcome::CorruptState, None, "commit record is unparsable"),
                Some(c) => (
                    Outcome::Found,
                    Some(Committed {
                        key: key.to_owned(),
                        value: c.value,
                        fencing_token: c.token,
                        committed_at_ms: c.committed_ms,
                    }),
                    "value committed",
                ),
            },
        };
        Ok(ReadReply {
            outcome,
            committed,
            server_time_ms: now,
            message: message.into(),
        })
    }

    async fn list(
        &self,
        namespace: Option<&str>,
        target_prefix: &str,
    ) -> Result<Vec<Listed>, StoreError> {
        if let Some(ns) = namespace {
            super::check_name("namespace", ns)?;
        }
        let prefixes = [
            self.keys.range_prefix("lease", namespace, target_prefix),
            self.keys.range_prefix("fence", namespace, target_prefix),
        ];
        let (ranges, now) = self
            .kv
            .range(&prefixes, Deadline::after(self.timeout))
            .await?;
        let mut fences = std::collections::HashMap::new();
        for (key, stored) in ranges.get(1).into_iter().flatten() {
            if let Some(t) = self.keys.target_of("fence", key) {
                fences.insert(t, stored.clone());
            }
        }
        let mut listed = Vec::new();
        for (key, stored) in ranges.first().into_iter().flatten() {
            let Some(target) = self.keys.target_of("lease", key) else {
                continue;
            };
            if namespace.is_some_and(|n| target.namespace != n)
                || !target.name.starts_with(target_prefix)
            {
                continue;
            }
            // No request can write a record under an invalid name: it is
            // not understood, so not read.
            let reply = match target.validate() {
                Err(StoreError::Invalid(why)) => bare(
                    now,
                    Outcome::CorruptState,
                    &format!("the record's key names no valid target ({why})"),
                ),
                _ => {
                    let slot = Slot::read(Some(stored), fences.get(&target), now);
                    self.judged(&target, slot, now)
                }
            };
            listed.push(Listed::from_get(target, reply));
        }
        listed.sort_by(|a, b| {
            (&a.target.namespace, &a.target.name).cmp(&(&b.target.namespace, &b.target.name))
        });
        Ok(listed)
    }

    async fn notices(&self, target: &Target) -> Result<super::Notices, StoreError> {
        target.validate()?;
        let key = self.keys.lease(target);
        watch::notices(self.kv.watch_client().await?, key, self.timeout).await
    }

    async fn health(&self) -> Result<Health, StoreError> {
        let started = Instant::now();
        let now = now_ms();
        self.kv
            .probe(&self.keys.health(), Deadline::after(self.timeout))
            .await?;
        Ok(Health {
            server_time_ms: now,
            latency: started.elapsed(),
        })
    }
}

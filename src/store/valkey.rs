//! The Valkey backend: one Lua function per operation, in one library, over
//! a client of our own that sends every request at most once.
//!
//! Two layers. Below, [`wire`]: a Valkey client knowing nothing of leases
//! (RESP, dial, TLS, pipelined links, pools, routing per topology), whose one
//! error type says whether a request may have run. On top, the lease
//! mapping: this file runs a call end to end (FCALL, the one recovery when
//! the library is missing, the reply, the durability wait on the connection
//! that wrote);
//! argument order lives in [`calls`], key names in [`keys`], reply shapes in
//! [`reply`], what a wire failure means for a lease in `errors.rs`, the
//! scripts in [`scripts`], release notices in [`notices`], `list` in
//! `listing.rs`. Nothing Valkey-specific leaks past this module.

mod calls;
pub mod config;
mod errors;
pub mod keys;
mod listing;
pub mod notices;
mod preload;
mod prepare;
mod reply;
pub mod scripts;
mod wire;

pub use wire::tls;

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use calls::ScriptCall;
pub use config::{Durability, Secret, TlsFiles, ValkeyConfig, redact_url};
use errors::{Effect, function_missing, server_error, unanswered};
pub use keys::KeySpace;
pub use preload::ScriptsReady;
use prepare::prepare;
use scripts::Script;
use wire::link::Link;
use wire::pool::{self, Checkout};
use wire::resp::{Cmd, Value};
use wire::{Client, Route, Use, cluster, dial, endpoint};

use super::{
    AcquireRequest, CommitRequest, Health, LeaseStore, Outcome, ReadReply, ReleaseRequest,
    RenewRequest, Reply, RevokeRequest, StoreError, Target,
};

/// [`super::LeaseStore`] on Valkey (standalone, Sentinel or Cluster).
pub struct ValkeyStore {
    client: Client,
    keys: KeySpace,
    durability: Durability,
    timeout: Duration,
    /// Where waiters subscribe to release notices.
    notices: notices::Source,
}

/// Whether `url` can be used, before anything connects: a known scheme, a
/// host, a port and database, and no password inside it (the reason never
/// quotes the URL).
pub fn check_url(url: &str) -> Result<(), String> {
    endpoint::parse(url).map(|_| ())
}

impl ValkeyStore {
    /// Connects, then loads the function library so a broken one fails here,
    /// not later. Bounded by the connect timeout, then the operation timeout.
    /// A primary that cannot be reached is skipped (the library loads there
    /// on first use, when a call finds it missing), so one dead Cluster node
    /// does not stop the others being used; a server that answers with a
    /// refusal still fails it.
    pub async fn connect(cfg: &ValkeyConfig) -> Result<Self, StoreError> {
        let store = Self::connect_only(cfg).await?;
        if let Err(e) = store.preload_scripts(false).await {
            store.close().await;
            return Err(e);
        }
        Ok(store)
    }

    /// Connects without loading the library (for `targetlease check`, which
    /// reports a library that cannot load as a finding, not as unreachable).
    pub async fn connect_only(cfg: &ValkeyConfig) -> Result<Self, StoreError> {
        let keys = KeySpace::new(&cfg.key_prefix)?;
        let (endpoint, dialer) = prepare(cfg)?;
        let sizes = pool::Sizes {
            shared: cfg.pool_size.max(1),
            durable: cfg.durable_pool_size,
            max_in_flight: cfg.max_in_flight,
        };
        let notices = notices::Source::new(cfg, &endpoint, dialer.clone());
        let client = Client::connect(&endpoint, dialer, sizes, cfg.connect_timeout)
            .await
            .map_err(|e| StoreError::BackendUnavailable(e.detail))?;
        Ok(Self {
            client,
            keys,
            durability: cfg.durability,
            timeout: cfg.timeout,
            notices,
        })
    }

    /// The text of `INFO <section>` from one server (any primary in a cluster).
    pub async fn info(&self, section: &str) -> Result<String, StoreError> {
        let reply = self
            .single(Route::Any, Cmd::new("INFO").arg(section))
            .await?;
        reply
            .text()
            .ok_or_else(|| StoreError::BackendUnavailable("unreadable INFO reply".into()))
    }

    /// Connections opened since connecting (shared and durable-write ones,
    /// every server): steady under steady load, for tests and benchmarks.
    pub fn connections_opened(&self) -> u64 {
        self.client.connections_opened()
    }

    /// The same count as a Prometheus counter (shared, not a copy), for
    /// [`crate::store::metrics::StoreMetrics::with_connections_opened`].
    pub fn connections_counter(&self) -> prometheus_client::metrics::counter::Counter {
        self.client.connections_counter()
    }

    /// True when connected through Valkey Cluster.
    pub fn is_clustered(&self) -> bool {
        self.client.is_clustered()
    }

    /// The key layout this store writes.
    pub fn keys(&self) -> &KeySpace {
        &self.keys
    }

    /// Loads the function library on every primary, in one round trip per
    /// primary, within the operation timeout; any primary that cannot be
    /// reached fails it (`targetlease check`).
    /// Says whether it loaded it or, for a user that may not, found it
    /// loaded.
    pub async fn load_scripts(&self) -> Result<ScriptsReady, StoreError> {
        self.preload_scripts(true).await
    }

    /// Closes every connection (locally: nothing is sent, so nothing can hang).
    pub async fn close(&self) {
        self.client.close().await;
    }

    /// One read-only command, answered or failed within the timeout.
    async fn single(&self, route: Route, cmd: Cmd) -> Result<Value, StoreError> {
        let deadline = Instant::now() + self.timeout;
        let sent = self
            .client
            .send(route, Use::Shared, &[cmd], deadline)
            .await
            .map_err(|e| unanswered(e, Effect::Read, self.timeout))?;
        match sent.replies.into_iter().next() {
            Some(Value::Error(e)) => Err(server_error(&e, Effect::Read)),
            Some(v) => Ok(v),
            None => Err(StoreError::BackendUnavailable("empty reply".into())),
        }
    }

    /// Runs an operation's function; when the server says the function is
    /// not there (a server that lost the library: `FUNCTION FLUSH`, a restart
    /// without persistence, a node that was down at connect), loads the
    /// library and calls once more. That is the only recovery, and the only
    /// re-send: "Function not found" means nothing ran. A second "not found"
    /// comes back with what the load said (a user that may not load it); a
    /// load that fails is a definite failure, since the operation never ran.
    async fn script(
        &self,
        call: &ScriptCall,
        how: Use,
        deadline: Instant,
    ) -> Result<(Value, Checkout), wire::Error> {
        let slot = call
            .keys
            .first()
            .map(|(_, k)| cluster::key_slot(k.as_bytes()))
            .unwrap_or(0);
        let route = Route::Slot(slot);
        let mut sent = self
            .client
            .send(route, how, &[fcall(call)], deadline)
            .await?;
        if matches!(sent.replies.first(), Some(Value::Error(e)) if function_missing(e)) {
            tracing::debug!(
                script = call.script.name,
                "lease function missing; loading the library"
            );
            let load = Cmd::new("FUNCTION")
                .arg("LOAD")
                .arg(&scripts::SCRIPTS.library.source);
            // On the node that answered (after an `ASK`, the importing node,
            // which the slot map does not name yet). The operation has not
            // run: a load that gets no answer leaves it not run, whatever
            // the load did.
            let loaded = match sent
                .link
                .link()
                .request(std::slice::from_ref(&load), deadline)
                .await
            {
                // Never written (the connection closed first): the slot's
                // owner, as any request that never left its queue.
                Err(e) if e.kind == wire::Kind::Closed => self
                    .client
                    .send(route, Use::Shared, &[load], deadline)
                    .await
                    .map(|sent| {
                        sent.link.give_back();
                        sent.replies
                    }),
                loaded => loaded,
            };
            if let Ok(replies) = &loaded {
                wire::forget_if_not_primary(sent.link.link(), replies);
            }
            sent.link.give_back();
            let loaded = loaded.map_err(|e| {
                wire::Error::new(
                    wire::Kind::Refused,
                    format!(
                        "the lease functions were missing, and loading them failed: {}",
                        e.detail
                    ),
                )
            })?;
            let said = match loaded.first() {
                // Our library's name is there, without this function.
                Some(Value::Error(e)) if scripts::already_loaded(e) => {
                    "a library of its name without this function is loaded: it was replaced".into()
                }
                Some(Value::Error(e)) => dial::first_words(e),
                _ => String::new(),
            };
            sent = self
                .client
                .send(route, how, &[fcall(call)], deadline)
                .await?;
            if let Some(Value::Error(e)) = sent.replies.first_mut()
                && function_missing(e)
                && !said.is_empty()
            {
                *e = format!("{e}; loading the library: {said}");
            }
        }
        let value = sent.replies.into_iter().next().unwrap_or(Value::Nil);
        Ok((value, sent.link))
    }

    /// One operation end to end, within one `timeout`: script, reply, and the
    /// durability wait on the connection that wrote. A call that may wait
    /// takes a connection for itself: `WAIT` blocks its connection on the
    /// server, and must neither hold up nor fail anyone else's calls.
    async fn call(&self, call: ScriptCall, target: &Target) -> Result<Reply, StoreError> {
        let deadline = Instant::now() + self.timeout;
        let how = if call.may_wait && self.durability != Durability::None {
            Use::Exclusive
        } else {
            Use::Shared
        };
        let (value, held) = match self.script(&call, how, deadline).await {
            Ok(sent) => sent,
            Err(e) => {
                let e = unanswered(e, call.effect, self.timeout);
                return crate::store::failpoints::lost_reply(&e, call.script.name, &call.args)
                    .unwrap_or(Err(e));
            }
        };
        let result = self
            .finish(&call, target, value, held.link(), deadline)
            .await;
        held.give_back();
        result
    }

    /// What a script's reply means, after the durability wait when one is due.
    async fn finish(
        &self,
        call: &ScriptCall,
        target: &Target,
        value: Value,
        link: &Link,
        deadline: Instant,
    ) -> Result<Reply, StoreError> {
        if let Value::Error(e) = &value {
            return Err(server_error(e, call.effect));
        }
        let reply = match reply::decode(target, &value) {
            Ok(r) => r,
            // The script may have written before replying: never a refusal.
            Err(why) if call.effect == Effect::Write => {
                return Err(StoreError::OutcomeUnknown(format!(
                    "the {} script ran but its reply is unreadable ({why}); \
                     retry with the same request id",
                    call.script.name
                )));
            }
            Err(why) => Reply {
                outcome: Outcome::CorruptState,
                lease: None,
                server_time_ms: 0,
                message: format!("unreadable reply from the lease script ({why})"),
            },
        };
        let mut reply = reply;
        crate::store::failpoints::acquired(&mut reply);
        tracing::debug!(op = call.script.name, outcome = %reply.outcome, "lease script ran");
        if call.may_wait
            && matches!(
                reply.outcome,
                Outcome::Acquired | Outcome::Renewed | Outcome::Committed
            )
        {
            self.wait_durable(link, deadline, reply.outcome).await?;
        }
        Ok(reply)
    }

    /// Blocks until the configured durability holds for the writes of `link`,
    /// the connection the script ran on.
    ///
    /// The script already ran, so a failure here is `OutcomeUnknown`: the write
    /// may still become durable (or be lost in a failover); the caller retries
    /// with the same request id and gets the same lease, never a second token.
    /// A wait on any other connection would count that connection's writes,
    /// not ours, so a broken connection ends it as unknown too.
    async fn wait_durable(
        &self,
        link: &Link,
        deadline: Instant,
        outcome: Outcome,
    ) -> Result<(), StoreError> {
        if crate::store::failpoints::on("skip-durability-wait") {
            return Ok(());
        }
        let not_durable = |what: String| {
            StoreError::OutcomeUnknown(format!(
                "{outcome} but durability {} not confirmed: {what}; \
                 not reported as safe, retry with the same request id",
                self.durability
            ))
        };
        // The server gives up at 3/4 of what is left, so its answer beats our deadline.
        let left = deadline.saturating_duration_since(Instant::now());
        let wait_ms = (left * 3 / 4).as_millis() as i64;
        let cmd = match self.durability {
            Durability::None => return Ok(()),
            _ if wait_ms < 1 => return Err(not_durable("no time left to wait".into())),
            Durability::Replicas(n) => Cmd::new("WAIT").arg(n.to_string()).arg(wait_ms.to_string()),
            Durability::Aof => Cmd::new("WAITAOF")
                .arg("1")
                .arg("0")
                .arg(wait_ms.to_string()),
        };
        let replies = link.request(&[cmd], deadline).await.map_err(|e| {
            not_durable(match e.kind {
                wire::Kind::Late => "no answer to the wait in time".into(),
                _ => format!("the connection that wrote is gone ({})", e.detail),
            })
        })?;
        let acked = match (self.durability, replies.first()) {
            (_, Some(Value::Error(e))) => Err(dial::first_words(e)),
            (Durability::Replicas(n), Some(Value::Int(acked))) => {
                (*acked >= i64::from(n)).then_some(()).ok_or_else(|| {
                    format!("{acked} of {n} replica(s) acknowledged within {wait_ms}ms")
                })
            }
            (Durability::Aof, Some(Value::Array(counts))) => {
                (counts.first().and_then(Value::int).unwrap_or(0) >= 1)
                    .then_some(())
                    .ok_or_else(|| format!("not fsynced to the local AOF within {wait_ms}ms"))
            }
            _ => Err("unexpected reply to the wait".into()),
        };
        acked.map_err(not_durable)
    }
}

/// `FCALL` of the operation's function, `FCALL_RO` for a read-only one.
fn fcall(call: &ScriptCall) -> Cmd {
    let s: &Script = call.script;
    Cmd::new(if s.read_only { "FCALL_RO" } else { "FCALL" })
        .arg(&s.function)
        .arg(call.keys.len().to_string())
        .args(call.keys.iter().map(|(_, k)| k))
        .args(call.args.iter().map(|(_, a)| a))
}

#[async_trait]
impl LeaseStore for ValkeyStore {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        self.call(calls::acquire(&self.keys, req), &req.target)
            .await
    }

    async fn renew(&self, req: &RenewRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        self.call(calls::renew(&self.keys, req), &req.target).await
    }

    async fn release(&self, req: &ReleaseRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        self.call(calls::release(&self.keys, req), &req.target)
            .await
    }

    async fn get(&self, target: &Target) -> Result<Reply, StoreError> {
        target.validate()?;
        self.call(calls::get(&self.keys, target), target).await
    }

    async fn revoke(&self, req: &RevokeRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        self.call(calls::revoke(&self.keys, req), &req.target).await
    }

    async fn commit(&self, req: &CommitRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        self.call(calls::commit(&self.keys, req), &req.target).await
    }

    async fn read(&self, target: &Target, key: &str) -> Result<ReadReply, StoreError> {
        target.validate()?;
        crate::store::check_name("key", key)?;
        let call = calls::read(&self.keys, target, key);
        let deadline = Instant::now() + self.timeout;
        let (value, held) = self
            .script(&call, Use::Shared, deadline)
            .await
            .map_err(|e| unanswered(e, call.effect, self.timeout))?;
        held.give_back();
        if let Value::Error(e) = &value {
            return Err(server_error(e, call.effect));
        }
        Ok(
            reply::decode_read(key, &value).unwrap_or_else(|why| ReadReply {
                outcome: Outcome::CorruptState,
                committed: None,
                server_time_ms: 0,
                message: format!("unreadable reply from the read script ({why})"),
            }),
        )
    }

    async fn list(
        &self,
        namespace: Option<&str>,
        target_prefix: &str,
    ) -> Result<Vec<crate::store::Listed>, StoreError> {
        listing::list(self, namespace, target_prefix).await
    }

    async fn close(&self) {
        ValkeyStore::close(self).await
    }

    async fn notices(&self, target: &Target) -> Result<crate::store::Notices, StoreError> {
        target.validate()?;
        self.notices.for_target(target).await
    }

    async fn health(&self) -> Result<Health, StoreError> {
        let started = std::time::Instant::now();
        let time = self.single(Route::Any, Cmd::new("TIME")).await?;
        let latency = started.elapsed();
        let parts = match time {
            Value::Array(p) => p,
            _ => {
                return Err(StoreError::BackendUnavailable(
                    "unreadable TIME reply".into(),
                ));
            }
        };
        let secs: u64 = parts.first().and_then(Value::int).unwrap_or(0) as u64;
        let micros: u64 = parts.get(1).and_then(Value::int).unwrap_or(0) as u64;
        Ok(Health {
            server_time_ms: secs * 1000 + micros / 1000,
            latency,
        })
    }
}

//! The Valkey backend: one Lua script per operation, called by hash.
//!
//! This file owns argument order and error mapping; key names live in
//! [`keys`], script sources in [`scripts`], reply shapes in [`reply`]. `fred`
//! never leaks past this module.

pub mod config;
mod errors;
pub mod events;
pub mod keys;
pub mod reply;
pub mod scripts;
pub mod tls;

use std::time::{Duration, Instant};

use async_trait::async_trait;
use fred::error::Error as FredError;
use fred::prelude::*;
use fred::socket2::TcpKeepalive;
use fred::types::config::{Options, ServerConfig, TcpConfig};
use fred::types::{ClusterHash, CustomCommand};

pub use config::{Durability, Secret, TlsFiles, ValkeyConfig, redact_url};
use errors::{Effect, classify, deadline_passed, describe};
pub use keys::KeySpace;
use scripts::{SCRIPTS, Script};

use super::{
    AcquireRequest, CommitRequest, Health, IDEMPOTENCY_WINDOW, LeaseStore, Outcome, ReleaseRequest,
    RenewRequest, Reply, RevokeRequest, StoreError, Target,
};

/// Redirections one command may follow (set on the connection config; per-call
/// options did not take effect). fred 10.1 does not follow ASK; its retry loop
/// ends cleanly only when redirections run out before write attempts, otherwise
/// its router task dies and every later call hangs until the deadline.
const MAX_REDIRECTIONS: u32 = 2;

/// [`super::LeaseStore`] on Valkey (standalone, Sentinel or Cluster).
pub struct ValkeyStore {
    pool: Pool,
    keys: KeySpace,
    options: Options,
    durability: Durability,
    timeout: Duration,
}

impl ValkeyStore {
    /// Connects, then loads every script so a broken one fails here, not later.
    pub async fn connect(cfg: &ValkeyConfig) -> Result<Self, StoreError> {
        let store = Self::connect_only(cfg).await?;
        if let Err(e) = store.load_scripts().await {
            store.close().await;
            return Err(e);
        }
        Ok(store)
    }

    /// Connects without loading the scripts (for `targetlease check`, which
    /// reports a script that cannot load as a finding, not as unreachable).
    pub async fn connect_only(cfg: &ValkeyConfig) -> Result<Self, StoreError> {
        let keys = KeySpace::new(&cfg.key_prefix)?;
        let pool = builder(cfg)?
            .build_pool(cfg.pool_size.max(1))
            .map_err(|e| StoreError::Invalid(format!("valkey client: {}", e.details())))?;
        match tokio::time::timeout(cfg.connect_timeout, pool.init()).await {
            Ok(Ok(_task)) => {}
            Ok(Err(e)) => {
                let _ = pool.quit().await;
                return Err(StoreError::BackendUnavailable(format!(
                    "cannot connect to {}: {}",
                    redact_url(&cfg.url),
                    describe(&e)
                )));
            }
            Err(_) => {
                let _ = pool.quit().await;
                return Err(StoreError::BackendUnavailable(format!(
                    "cannot connect to {} within {}",
                    redact_url(&cfg.url),
                    humantime::format_duration(cfg.connect_timeout)
                )));
            }
        }
        let store = Self {
            pool,
            keys,
            options: Options {
                timeout: Some(cfg.timeout),
                fail_fast: true,
                // fred 10.1 does not follow ASK (it re-sends to the old owner)
                // and its router task dies once the command runs out of write
                // attempts in that loop. Two redirections let MOVED through and
                // end an ASK loop with a clean "Too many redirections" first.
                ..Options::default()
            },
            durability: cfg.durability,
            timeout: cfg.timeout,
        };
        Ok(store)
    }

    /// The text of `INFO <section>` from one server (any primary in a cluster).
    pub async fn info(&self, section: &str) -> Result<String, StoreError> {
        let client = self.pool.next().with_options(&self.options);
        tokio::time::timeout(
            self.timeout,
            client.custom::<String, _>(
                CustomCommand::new_static("INFO", ClusterHash::Random, false),
                vec![section.to_owned()],
            ),
        )
        .await
        .map_err(|_| deadline_passed(Effect::Read, self.timeout))?
        .map_err(|e| classify(&e, Effect::Read))
    }

    /// True when connected through Valkey Cluster.
    pub fn is_clustered(&self) -> bool {
        self.pool.next().is_clustered()
    }

    /// The key layout this store writes.
    pub fn keys(&self) -> &KeySpace {
        &self.keys
    }

    /// Loads every script on every primary (used at startup and by readiness).
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        let client = self.pool.next().with_options(&self.options);
        for script in SCRIPTS.all() {
            let loaded: Result<String, FredError> = if self.pool.next().is_clustered() {
                client.script_load_cluster(script.source.as_str()).await
            } else {
                client.script_load(script.source.as_str()).await
            };
            match loaded {
                Ok(sha) if sha == script.sha => {}
                Ok(sha) => {
                    return Err(StoreError::BackendUnavailable(format!(
                        "script {} loaded with hash {sha}, expected {}",
                        script.name, script.sha
                    )));
                }
                Err(e) => {
                    return Err(StoreError::BackendUnavailable(format!(
                        "cannot load script {}: {}",
                        script.name,
                        describe(&e)
                    )));
                }
            }
        }
        Ok(())
    }

    /// Closes every connection.
    pub async fn close(&self) {
        let _ = self.pool.quit().await;
    }

    /// Runs a script by hash; on NOSCRIPT (flushed cache, restarted or failed-over
    /// server) it is sent once in full, which also reloads it. That is the only recovery.
    async fn run(
        &self,
        client: &Client,
        script: &Script,
        keys: Vec<String>,
        args: Vec<String>,
        effect: Effect,
    ) -> Result<Vec<String>, StoreError> {
        let client = client.with_options(&self.options);
        let first: Result<Vec<String>, FredError> = client
            .evalsha(script.sha.as_str(), keys.clone(), args.clone())
            .await;
        let result = match first {
            Err(e) if e.details().starts_with("NOSCRIPT") => {
                tracing::debug!(script = script.name, "script cache miss; sending source");
                client.eval(script.source.as_str(), keys, args).await
            }
            other => other,
        };
        result.map_err(|e| classify(&e, effect))
    }

    async fn call(
        &self,
        script: &Script,
        target: &Target,
        keys: Vec<String>,
        args: Vec<String>,
        effect: Effect,
    ) -> Result<Reply, StoreError> {
        // One client for the script and its durability wait: WAIT counts the
        // writes of the connection it runs on.
        let client = self.pool.next();
        if !client.is_connected() {
            return Err(StoreError::BackendUnavailable(
                "not connected to valkey".into(),
            ));
        }
        let slot = keys
            .first()
            .map(|k| fred::util::redis_keyslot(k.as_bytes()))
            .unwrap_or(0);
        // fred's own per-command timeout does not cover a command queued
        // behind a stalled server, so the deadline is enforced here too.
        let raw =
            match tokio::time::timeout(self.timeout, self.run(client, script, keys, args, effect))
                .await
            {
                Ok(result) => result?,
                Err(_) => return Err(deadline_passed(effect, self.timeout)),
            };
        let reply = reply::decode(target, &raw);
        tracing::debug!(op = script.name, outcome = %reply.outcome, "lease script ran");
        if effect == Effect::Write
            && matches!(
                reply.outcome,
                Outcome::Acquired | Outcome::Renewed | Outcome::Committed
            )
        {
            tokio::time::timeout(self.timeout, self.wait_durable(client, slot, reply.outcome))
                .await
                .map_err(|_| deadline_passed(Effect::Write, self.timeout))??;
        }
        Ok(reply)
    }

    /// Blocks until the configured durability holds for this connection's writes.
    ///
    /// The script already ran, so a failure here is `OutcomeUnknown`: the write
    /// may still become durable (or be lost in a failover); the caller retries
    /// with the same request id and gets the same lease, never a second token.
    async fn wait_durable(
        &self,
        client: &Client,
        slot: u16,
        outcome: Outcome,
    ) -> Result<(), StoreError> {
        if self.durability == Durability::None {
            return Ok(());
        }
        let wait_ms = (self.timeout / 2).as_millis().max(1) as i64;
        let options = Options {
            cluster_hash: Some(ClusterHash::Custom(slot)),
            ..self.options.clone()
        };
        let client = client.with_options(&options);
        let not_durable = |what: String| {
            StoreError::OutcomeUnknown(format!(
                "{outcome} but durability {} not satisfied: {what}; \
                 not reported as safe, retry with the same request id",
                self.durability
            ))
        };
        let acked = match self.durability {
            Durability::None => return Ok(()),
            Durability::Replicas(n) => {
                let acked: i64 = client
                    .wait(i64::from(n), wait_ms)
                    .await
                    .map_err(|e| not_durable(describe(&e)))?;
                (acked >= i64::from(n)).then_some(()).ok_or_else(|| {
                    format!("{acked} of {n} replica(s) acknowledged within {wait_ms}ms")
                })
            }
            Durability::Aof => {
                let counts: Vec<i64> = client
                    .custom(
                        CustomCommand::new_static("WAITAOF", ClusterHash::Custom(slot), true),
                        vec![1, 0, wait_ms],
                    )
                    .await
                    .map_err(|e| not_durable(describe(&e)))?;
                (counts.first().copied().unwrap_or(0) >= 1)
                    .then_some(())
                    .ok_or_else(|| format!("not fsynced to the local AOF within {wait_ms}ms"))
            }
        };
        acked.map_err(not_durable)
    }
}

/// The client builder every connection of a store uses (the pool and the
/// release-event subscriber): URL, credentials, TLS, timeouts, keepalive,
/// redirect limits and the reconnect policy.
fn builder(cfg: &ValkeyConfig) -> Result<Builder, StoreError> {
    let mut config = client_config(cfg)?;
    if let Some(user) = &cfg.username {
        config.username = Some(user.clone());
    }
    if let Some(password) = &cfg.password {
        config.password = Some(password.expose().to_owned());
    }
    config.fail_fast = true;
    let mut builder = Builder::from_config(config);
    builder
        .with_connection_config(|c| {
            c.connection_timeout = cfg.connect_timeout;
            c.internal_command_timeout = cfg.connect_timeout;
            c.max_redirections = MAX_REDIRECTIONS;
            c.max_command_attempts = MAX_REDIRECTIONS + 3;
            // A dead peer behind a silent network is noticed in about a minute.
            c.tcp = TcpConfig {
                nodelay: Some(true),
                keepalive: Some(
                    TcpKeepalive::new()
                        .with_time(Duration::from_secs(30))
                        .with_interval(Duration::from_secs(10)),
                ),
                ..TcpConfig::default()
            };
        })
        // Reconnect forever, 100ms doubling to 5s, plus fred's default 100ms jitter.
        .set_policy(ReconnectPolicy::new_exponential(0, 100, 5_000, 2));
    Ok(builder)
}

/// The fred config for `cfg`: URL, TLS (our rustls settings, never fred's defaults).
fn client_config(cfg: &ValkeyConfig) -> Result<Config, StoreError> {
    let bad_url = |why: String| {
        StoreError::Invalid(format!("bad valkey url {}: {why}", redact_url(&cfg.url)))
    };
    let (scheme, rest) = cfg
        .url
        .split_once("://")
        .ok_or_else(|| bad_url("no scheme".into()))?;
    let (plain, tls) = match scheme {
        "redis" | "redis-cluster" | "redis-sentinel" => (scheme.to_owned(), false),
        "rediss" | "rediss-cluster" | "rediss-sentinel" => {
            (scheme.replacen("rediss", "redis", 1), true)
        }
        other => {
            return Err(bad_url(format!(
                "unsupported scheme {other:?}; use redis, rediss, redis-cluster, rediss-cluster or redis-sentinel"
            )));
        }
    };
    let mut config = Config::from_url(&format!("{plain}://{rest}"))
        .map_err(|e| bad_url(e.details().to_string()))?;
    if tls {
        config.tls = Some(tls::client_config(&cfg.tls)?);
        if let Some(name) = &cfg.tls.server_name {
            let name: fred::bytes_utils::Str = name.as_str().into();
            match &mut config.server {
                ServerConfig::Centralized { server } => server.tls_server_name = Some(name),
                ServerConfig::Clustered { hosts, .. } | ServerConfig::Sentinel { hosts, .. } => {
                    for h in hosts {
                        h.tls_server_name = Some(name.clone());
                    }
                }
            }
        }
    } else if cfg.tls.ca_file.is_some()
        || cfg.tls.cert_file.is_some()
        || cfg.tls.server_name.is_some()
    {
        return Err(bad_url(
            "TLS files or a TLS server name were given but the URL does not use TLS (rediss://)"
                .into(),
        ));
    }
    Ok(config)
}

fn window_ms(extra: Duration) -> String {
    (IDEMPOTENCY_WINDOW + extra).as_millis().to_string()
}

fn ms(d: Duration) -> String {
    d.as_millis().to_string()
}

#[async_trait]
impl LeaseStore for ValkeyStore {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        let t = &req.target;
        let keys = vec![
            self.keys.lease(t),
            self.keys.fence(t),
            self.keys.request(t, "acquire", &req.owner, &req.request_id),
        ];
        let args = vec![
            req.owner.clone(),
            ms(req.ttl),
            req.max_lifetime.map(ms).unwrap_or_else(|| "0".into()),
            req.lease_id.clone().unwrap_or_else(super::new_request_id),
            req.metadata_json(),
            req.token_floor.unwrap_or(0).to_string(),
            window_ms(Duration::ZERO),
        ];
        self.call(&SCRIPTS.acquire, t, keys, args, Effect::Write)
            .await
    }

    async fn renew(&self, req: &RenewRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        let t = &req.target;
        let h = &req.holder;
        let keys = vec![
            self.keys.lease(t),
            self.keys.request(t, "renew", &h.owner, &req.request_id),
        ];
        let args = vec![
            h.owner.clone(),
            h.lease_id.clone(),
            h.token.to_string(),
            ms(req.ttl),
            window_ms(Duration::ZERO),
        ];
        self.call(&SCRIPTS.renew, t, keys, args, Effect::Write)
            .await
    }

    async fn release(&self, req: &ReleaseRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        let t = &req.target;
        let h = &req.holder;
        let keys = vec![
            self.keys.lease(t),
            self.keys.request(t, "release", &h.owner, &req.request_id),
        ];
        let args = vec![
            h.owner.clone(),
            h.lease_id.clone(),
            h.token.to_string(),
            window_ms(Duration::ZERO),
        ];
        self.call(&SCRIPTS.release, t, keys, args, Effect::Write)
            .await
    }

    async fn get(&self, target: &Target) -> Result<Reply, StoreError> {
        target.validate()?;
        let keys = vec![self.keys.lease(target)];
        self.call(&SCRIPTS.get, target, keys, vec![], Effect::Read)
            .await
    }

    async fn revoke(&self, req: &RevokeRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        let t = &req.target;
        let keys = vec![self.keys.lease(t)];
        let args = vec![req.reason.clone().unwrap_or_default()];
        self.call(&SCRIPTS.revoke, t, keys, args, Effect::Write)
            .await
    }

    async fn commit(&self, req: &CommitRequest) -> Result<Reply, StoreError> {
        req.validate()?;
        let t = &req.target;
        let keys = vec![
            self.keys.lease(t),
            self.keys.commit(t, &req.key),
            self.keys.request(t, "commit", "", &req.request_id),
        ];
        let args = vec![
            req.token.to_string(),
            req.key.clone(),
            req.value.clone(),
            window_ms(Duration::ZERO),
        ];
        self.call(&SCRIPTS.commit, t, keys, args, Effect::Write)
            .await
    }

    async fn health(&self) -> Result<Health, StoreError> {
        let started = Instant::now();
        let client = self.pool.next().with_options(&self.options);
        let time: Vec<String> = tokio::time::timeout(
            self.timeout,
            client.custom(
                CustomCommand::new_static("TIME", None, false),
                Vec::<String>::new(),
            ),
        )
        .await
        .map_err(|_| deadline_passed(Effect::Read, self.timeout))?
        .map_err(|e| classify(&e, Effect::Read))?;
        let latency = started.elapsed();
        let secs: u64 = time.first().and_then(|s| s.parse().ok()).unwrap_or(0);
        let micros: u64 = time.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        Ok(Health {
            server_time_ms: secs * 1000 + micros / 1000,
            latency,
        })
    }
}

//! The Valkey backend: one Lua script per operation, called by hash.
//!
//! This file owns argument order and error mapping; key names live in
//! [`keys`], script sources in [`scripts`], reply shapes in [`reply`]. `fred`
//! never leaks past this module.

pub mod config;
pub mod keys;
pub mod reply;
pub mod scripts;

use std::time::{Duration, Instant};

use async_trait::async_trait;
use fred::error::{Error as FredError, ErrorKind};
use fred::prelude::*;
use fred::types::CustomCommand;
use fred::types::config::Options;

pub use config::{Durability, Secret, TlsFiles, ValkeyConfig, redact_url};
pub use keys::KeySpace;
use scripts::{SCRIPTS, Script};

use super::{
    AcquireRequest, CommitRequest, Health, IDEMPOTENCY_WINDOW, LeaseStore, ReleaseRequest,
    RenewRequest, Reply, RevokeRequest, StoreError, Target,
};

/// Whether an operation can change state; decides what a lost reply means.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Effect {
    Read,
    Write,
}

/// [`super::LeaseStore`] on Valkey (standalone, Sentinel or Cluster).
pub struct ValkeyStore {
    pool: Pool,
    keys: KeySpace,
    options: Options,
}

impl ValkeyStore {
    /// Connects, then loads every script so a broken one fails here, not later.
    pub async fn connect(cfg: &ValkeyConfig) -> Result<Self, StoreError> {
        let keys = KeySpace::new(&cfg.key_prefix)?;
        let mut config = Config::from_url(&cfg.url).map_err(|e| {
            StoreError::Invalid(format!(
                "bad valkey url {}: {}",
                redact_url(&cfg.url),
                e.details()
            ))
        })?;
        if let Some(user) = &cfg.username {
            config.username = Some(user.clone());
        }
        if let Some(password) = &cfg.password {
            config.password = Some(password.expose().to_owned());
        }
        config.fail_fast = true;
        let pool = Builder::from_config(config)
            .with_connection_config(|c| {
                c.connection_timeout = cfg.connect_timeout;
                c.internal_command_timeout = cfg.connect_timeout;
            })
            .set_policy(ReconnectPolicy::new_exponential(0, 100, 5_000, 2))
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
                ..Options::default()
            },
        };
        store.load_scripts().await?;
        Ok(store)
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
        script: &Script,
        keys: Vec<String>,
        args: Vec<String>,
        effect: Effect,
    ) -> Result<Vec<String>, StoreError> {
        let client = self.pool.next();
        if !client.is_connected() {
            return Err(StoreError::BackendUnavailable(
                "not connected to valkey".into(),
            ));
        }
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
        let raw = self.run(script, keys, args, effect).await?;
        let reply = reply::decode(target, &raw);
        tracing::debug!(op = script.name, outcome = %reply.outcome, "lease script ran");
        Ok(reply)
    }
}

fn window_ms(extra: Duration) -> String {
    (IDEMPOTENCY_WINDOW + extra).as_millis().to_string()
}

fn ms(d: Duration) -> String {
    d.as_millis().to_string()
}

/// A short, secret-free description of a client error.
fn describe(e: &FredError) -> String {
    let details: String = e.details().chars().take(200).collect();
    format!("{:?}: {details}", e.kind())
}

/// Decides, once, what a client error means for the caller.
///
/// Server refusals that happen before a script runs (BUSY, LOADING, READONLY,
/// OOM, NOPERM, auth) are definite: nothing happened. A lost reply to a write
/// is `OutcomeUnknown`: the caller must retry with the same request id.
fn classify(e: &FredError, effect: Effect) -> StoreError {
    let code = e.details().split_whitespace().next().unwrap_or("");
    let refused = matches!(
        code,
        "BUSY"
            | "LOADING"
            | "READONLY"
            | "OOM"
            | "NOPERM"
            | "WRONGPASS"
            | "NOAUTH"
            | "MASTERDOWN"
            | "CLUSTERDOWN"
            | "TRYAGAIN"
            | "CROSSSLOT"
    );
    if refused {
        return StoreError::BackendUnavailable(format!(
            "server refused the operation: {}",
            describe(e)
        ));
    }
    let lost = matches!(
        e.kind(),
        ErrorKind::IO | ErrorKind::Timeout | ErrorKind::Canceled | ErrorKind::Unknown
    );
    match (effect, lost) {
        (Effect::Write, true) => StoreError::OutcomeUnknown(format!(
            "no reply from valkey ({}); retry with the same request id",
            describe(e)
        )),
        _ => StoreError::BackendUnavailable(describe(e)),
    }
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
            uuid::Uuid::new_v4().to_string(),
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
        let time: Vec<String> = client
            .custom(
                CustomCommand::new_static("TIME", None, false),
                Vec::<String>::new(),
            )
            .await
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

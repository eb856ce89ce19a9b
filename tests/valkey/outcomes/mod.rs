//! The store client's promises about what it tells its caller: a command is
//! sent at most once, every outcome is the true one, every wait is bounded;
//! tried against real servers, a fault proxy, and a scripted fake server
//! for replies a real server would not send.
//!
//! Each test names the promise it tries to break; a failing test is a
//! broken promise, never weakened to pass.

mod cluster_endpoints;
mod fake;
mod pipelining;
mod sentinel;

pub(crate) use crate::support::cluster;
pub(crate) use crate::support::fault_proxy;
pub(crate) use crate::support::resp;
pub(crate) use crate::support::valkey_server;

pub(crate) use std::sync::Arc;
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
pub(crate) use std::time::{Duration, Instant};

pub(crate) use fault_proxy::{Fault, FaultProxy};
pub(crate) use rand::Rng;
pub(crate) use resp::Resp;
pub(crate) use targetlease::store::valkey::scripts::SCRIPTS;
pub(crate) use targetlease::store::valkey::{Durability, ValkeyConfig, ValkeyStore};
pub(crate) use targetlease::store::{
    AcquireRequest, LeaseStore, Outcome, Reply, StoreError, Target,
};
pub(crate) use tokio::io::{AsyncReadExt, AsyncWriteExt};
pub(crate) use valkey_server::{ValkeyServer, free_port};

pub(crate) const TTL: Duration = Duration::from_secs(60);

pub(crate) const TIMEOUT: Duration = Duration::from_millis(1000);

pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);

/// Scheduling slack on a loaded 2-core machine.
pub(crate) const SLACK: Duration = Duration::from_millis(1500);

pub(crate) fn config(url: String) -> ValkeyConfig {
    ValkeyConfig {
        url,
        timeout: TIMEOUT,
        connect_timeout: CONNECT_TIMEOUT,
        ..ValkeyConfig::default()
    }
}

pub(crate) fn target(name: &str) -> Target {
    Target::new("outcomes", name)
}

/// A target's fencing counter as stored (`None` before its first grant).
pub(crate) fn fence_of(server: &ValkeyServer, key: &str) -> Option<String> {
    match server.conn().cmd(&["HGET", key, "fence"]) {
        Resp::Bulk(b) => b,
        other => panic!("HGET {key} fence: {other:?}"),
    }
}

//! The `targetlease lease …` contract, checked on the real binary against a
//! real `valkey-server` (one per test): flags, env fallbacks, the JSON
//! envelope, outcome names and exit codes, and that bad input writes nothing.

mod broken_connections;
mod grants;
mod input;
mod list;
mod read;

pub use std::collections::BTreeSet;
pub use std::fmt::Display;
pub use std::process::Command;
pub use std::time::{Duration, Instant};

pub use serde_json::Value;

pub use crate::support::cli::{Lease, Res, lease, run, targetlease};
pub use crate::support::deadline;
pub use crate::support::fault_proxy;
pub use crate::support::resp::Resp;
pub use crate::support::valkey_server::{ValkeyServer, free_port};

pub fn lease_keys(l: &Value) -> BTreeSet<String> {
    l.as_object()
        .expect("lease object")
        .keys()
        .cloned()
        .collect()
}

pub fn set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|s| s.to_string()).collect()
}

pub const HOLDER_FIELDS: [&str; 6] = [
    "target",
    "lease_id",
    "owner",
    "fencing_token",
    "acquired_at_ms",
    "expires_at_ms",
];
pub const PUBLIC_FIELDS: [&str; 5] = [
    "target",
    "owner",
    "fencing_token",
    "acquired_at_ms",
    "expires_at_ms",
];

/// `lease acquire`, which must grant: its whole JSON line.
pub fn acquire(url: &str, target: &str, owner: &str, ttl: &str) -> Value {
    lease(url, "acquire")
        .target(target)
        .owner(owner)
        .ttl(ttl)
        .ok("acquired", 0)
        .json
}

pub fn dbsize(s: &ValkeyServer) -> i64 {
    s.conn().cmd(&["DBSIZE"]).int()
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `lease commit` of `value` under key `k` of target `db`, fenced by `token`.
pub fn commit(url: &str, token: impl Display, value: &str) -> Lease {
    lease(url, "commit")
        .target("db")
        .token(token)
        .flag("key", "k")
        .flag("value", value)
}

/// Runs `command` with `-o text`: its exit code and what it printed.
pub fn as_text(command: Lease) -> (Option<i32>, String) {
    let out = command.with(&["-o", "text"]).output();
    (out.status.code(), String::from_utf8(out.stdout).unwrap())
}

pub fn handle_args(j: &Value) -> (String, String, String) {
    let l = &j["lease"];
    (
        l["owner"].as_str().unwrap().to_string(),
        l["lease_id"].as_str().unwrap().to_string(),
        l["fencing_token"].as_u64().unwrap().to_string(),
    )
}

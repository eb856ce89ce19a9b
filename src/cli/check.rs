//! `targetlease check`: is this Valkey deployment safe for leases? (For
//! etcd: `check/etcd.rs`.)
//!
//! Connects with the shared flags and reports each finding as ok, warn or
//! fail. Exit codes: 0 nothing failed, 1 a check failed, 2 bad arguments,
//! 3 the server cannot be reached (or stopped answering). Only `INFO`, the
//! lease scripts and a probe target (a read, and a release that finds nothing
//! and so writes nothing) are used, so the least-privilege ACL user can run
//! it. It ends within `--connect-timeout` + `--timeout` against a silent
//! server: the first unanswered call ends the run.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use super::connection::{ConnectionArgs, StoreConfig};
use super::logging::{self, LogArgs};
use super::output::{self, Format, OutputArgs};
use crate::store::valkey::{Durability, ValkeyStore};
use crate::store::{LeaseHandle, LeaseStore, ReleaseRequest, StoreError, Target};

mod etcd;

/// Arguments of `targetlease check`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// How to reach the store (Valkey or etcd).
    #[command(flatten)]
    pub conn: ConnectionArgs,
    /// How the report is printed (json: one object; text: a line per check).
    #[command(flatten)]
    pub out: OutputArgs,
    /// The same as `-o text`; refused together with `-o`.
    #[arg(long, hide = true, conflicts_with = "output")]
    pub human: bool,
    /// Diagnostics on stderr.
    #[command(flatten)]
    pub log: LogArgs,
}

/// How one finding came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Nothing to do.
    Ok,
    /// Works, with a risk the operator should know about.
    Warn,
    /// Unsafe or not working.
    Fail,
}

/// One finding.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// Stable name, e.g. `maxmemory-policy`.
    pub name: &'static str,
    /// The verdict.
    pub status: Verdict,
    /// One sentence saying why.
    pub detail: String,
}

/// Everything `check` prints.
#[derive(Debug, Serialize)]
pub struct CheckReport {
    /// True when no check failed.
    pub ok: bool,
    /// The findings, in a fixed order.
    pub checks: Vec<Check>,
}

const EXIT_FAILED: u8 = 1;
const EXIT_UNREACHABLE: u8 = 3;
/// Latency above which reachability warns.
const SLOW: Duration = Duration::from_millis(100);

fn check(name: &'static str, status: Verdict, detail: impl Into<String>) -> Check {
    Check {
        name,
        status,
        detail: detail.into(),
    }
}

/// Runs `targetlease check`.
pub async fn main(args: CheckArgs) -> ExitCode {
    logging::init(&args.log);
    let config = match args.conn.to_store_config() {
        Ok(StoreConfig::Valkey(c)) => c,
        Ok(StoreConfig::Etcd(c)) => {
            let report = etcd::checks(&c).await;
            return report.map_or_else(|msg| output::usage_error(&msg), |r| print(&args, r));
        }
        Err(msg) => return output::usage_error(&msg),
    };
    let (checks, code) = match ValkeyStore::connect_only(&config).await {
        Err(StoreError::Invalid(msg)) => return output::usage_error(&msg),
        Err(e) => (
            vec![check("reachability", Verdict::Fail, e.to_string())],
            EXIT_UNREACHABLE,
        ),
        Ok(store) => {
            let (checks, answering) = run_checks(&store, config.durability, config.timeout).await;
            store.close().await;
            let failed = checks.iter().any(|c| c.status == Verdict::Fail);
            let code = if !answering {
                EXIT_UNREACHABLE
            } else if failed {
                EXIT_FAILED
            } else {
                0
            };
            (checks, code)
        }
    };
    print(&args, (checks, code))
}

/// Prints the report of `checks` as asked; exits with `code`.
fn print(args: &CheckArgs, (checks, code): (Vec<Check>, u8)) -> ExitCode {
    let report = CheckReport {
        ok: checks.iter().all(|c| c.status != Verdict::Fail),
        checks,
    };
    let format = if args.human {
        Format::Text
    } else {
        args.out.or(Format::Json)
    };
    match format {
        Format::Text => output::print_out(&human(&report)),
        Format::Yaml => output::print_out(&output::to_yaml(&report)),
        Format::Json => output::print_out(&format!(
            "{}\n",
            serde_json::to_string(&report).expect("report serializes")
        )),
    }
    ExitCode::from(code)
}

/// The report as text, one line per check.
pub fn human(report: &CheckReport) -> String {
    let mut out = String::new();
    for c in &report.checks {
        let tag = match c.status {
            Verdict::Ok => "ok  ",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        };
        out.push_str(&format!("{tag}  {:<17} {}\n", c.name, c.detail));
    }
    out.push_str(if report.ok {
        "safe: no check failed\n"
    } else {
        "UNSAFE: at least one check failed\n"
    });
    out
}

/// Every check, in order, and whether the server kept answering. A call that
/// got no answer within `timeout` ends the run there (failing that check):
/// the rest would only wait as long again, each.
pub async fn run_checks(
    store: &ValkeyStore,
    durability: Durability,
    timeout: Duration,
) -> (Vec<Check>, bool) {
    let mut checks = Vec::new();
    // Runs one call; `None` (after recording a failed check) when it went unanswered.
    macro_rules! ask {
        ($name:expr, $call:expr) => {{
            let started = std::time::Instant::now();
            let result = $call.await;
            if result.is_err() && started.elapsed() >= timeout {
                let why = result.err().map(|e| e.to_string()).unwrap_or_default();
                checks.push(check(
                    $name,
                    Verdict::Fail,
                    format!("the server stopped answering: {why}"),
                ));
                return (checks, false);
            }
            result
        }};
    }
    match store.health().await {
        Ok(h) => {
            let ms = h.latency.as_secs_f64() * 1000.0;
            let status = if h.latency > SLOW {
                Verdict::Warn
            } else {
                Verdict::Ok
            };
            checks.push(check(
                "reachability",
                status,
                format!("server answered in {ms:.1}ms"),
            ));
        }
        Err(e) => {
            checks.push(check("reachability", Verdict::Fail, e.to_string()));
            return (checks, false);
        }
    }
    let server = ask!("server-version", store.info("server")).map(|t| fields(&t));
    checks.push(match &server {
        Ok(f) => version(f),
        Err(e) => check(
            "server-version",
            Verdict::Warn,
            format!("cannot read INFO server: {e}"),
        ),
    });
    checks.push(match ask!("scripts", store.load_scripts()) {
        Ok(ready) => check("scripts", Verdict::Ok, ready.describe()),
        Err(e) => check("scripts", Verdict::Fail, e.to_string()),
    });
    // The read path (get) and the write path (a release that finds nothing,
    // so writes nothing) of a probe target.
    let probe = Target::new("targetlease-check", "probe");
    let handle = LeaseHandle {
        owner: "targetlease-check".into(),
        lease_id: "targetlease-check-probe".into(),
        token: 1,
    };
    let read = ask!("permissions", store.get(&probe));
    let write = ask!(
        "permissions",
        store.release(&ReleaseRequest::new(probe, handle))
    );
    checks.push(match read.and(write) {
        Ok(_) => check(
            "permissions",
            Verdict::Ok,
            "the user can run the lease scripts on keys under the prefix",
        ),
        // Refused for want of permission: the deployment cannot work.
        Err(e) if e.to_string().contains("NOPERM") => {
            check("permissions", Verdict::Fail, e.to_string())
        }
        // Refused for another reason (a full server, too few replicas, …):
        // the other checks say more; permissions themselves are unproven.
        Err(e) => check(
            "permissions",
            Verdict::Warn,
            format!("could not run the probe scripts: {e}"),
        ),
    });
    checks.push(match ask!("maxmemory-policy", store.info("memory")) {
        Ok(t) => eviction(&fields(&t)),
        Err(e) => check(
            "maxmemory-policy",
            Verdict::Warn,
            format!("cannot read the eviction policy: {e}"),
        ),
    });
    checks.push(match ask!("persistence", store.info("persistence")) {
        Ok(t) => persistence(&fields(&t), durability),
        Err(e) => check(
            "persistence",
            Verdict::Warn,
            format!("cannot read INFO persistence: {e}"),
        ),
    });
    checks.push(match ask!("replication", store.info("replication")) {
        Ok(t) => replication(&fields(&t), durability),
        Err(e) => check(
            "replication",
            Verdict::Warn,
            format!("cannot read INFO replication: {e}"),
        ),
    });
    checks.push(match ask!("cluster", store.info("cluster")) {
        Ok(t) => cluster(&fields(&t), store.is_clustered()),
        Err(e) => check(
            "cluster",
            Verdict::Warn,
            format!("cannot read INFO cluster: {e}"),
        ),
    });
    (checks, true)
}

type Fields = Vec<(String, String)>;

/// `key:value` lines of an INFO reply.
fn fields(text: &str) -> Fields {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

fn field<'a>(f: &'a Fields, key: &str) -> Option<&'a str> {
    f.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

fn version(f: &Fields) -> Check {
    let (product, v) = match (field(f, "valkey_version"), field(f, "redis_version")) {
        (Some(v), _) => ("Valkey", v),
        (None, Some(v)) => ("Redis", v),
        (None, None) => {
            return check(
                "server-version",
                Verdict::Warn,
                "INFO server names no version",
            );
        }
    };
    let mode = field(f, "server_mode").unwrap_or("standalone");
    if let Some(why) = crate::store::valkey::scripts::lacks_field_expiry_in(
        field(f, "valkey_version"),
        field(f, "redis_version"),
    ) {
        return check("server-version", Verdict::Fail, format!("it {why}"));
    }
    let parts: Vec<u32> = v.split('.').filter_map(|p| p.parse().ok()).collect();
    let at_least_7_2 = parts.as_slice() >= [7, 2].as_slice();
    if product == "Valkey" && at_least_7_2 {
        check(
            "server-version",
            Verdict::Ok,
            format!("{product} {v} ({mode})"),
        )
    } else if !at_least_7_2 {
        check(
            "server-version",
            Verdict::Warn,
            format!(
                "{product} {v} ({mode}) is older than 7.2: no WAITAOF, so --durability aof cannot work"
            ),
        )
    } else {
        check(
            "server-version",
            Verdict::Warn,
            format!("{product} {v} ({mode}): targetlease is tested against Valkey"),
        )
    }
}

fn eviction(f: &Fields) -> Check {
    let Some(policy) = field(f, "maxmemory_policy") else {
        return check(
            "maxmemory-policy",
            Verdict::Warn,
            "cannot read maxmemory_policy from INFO memory",
        );
    };
    if policy.starts_with("allkeys-") {
        check(
            "maxmemory-policy",
            Verdict::Fail,
            format!(
                "maxmemory-policy is {policy}: under memory pressure the server may evict a fence \
                 counter and issue a token again; set it to noeviction"
            ),
        )
    } else if policy.starts_with("volatile-") {
        check(
            "maxmemory-policy",
            Verdict::Ok,
            format!(
                "maxmemory-policy is {policy}: a target's key carries no expiry, so it is never \
                 evicted (writes are refused instead, as with noeviction)"
            ),
        )
    } else {
        check(
            "maxmemory-policy",
            Verdict::Ok,
            format!("maxmemory-policy is {policy}"),
        )
    }
}

fn persistence(f: &Fields, durability: Durability) -> Check {
    let aof = field(f, "aof_enabled") == Some("1");
    match (aof, durability) {
        (true, _) => check("persistence", Verdict::Ok, "append-only file enabled"),
        (false, Durability::Aof) => check(
            "persistence",
            Verdict::Fail,
            "--durability aof needs appendonly yes on the server",
        ),
        (false, _) => check(
            "persistence",
            Verdict::Warn,
            "no append-only file: a restart without a replica loses fence counters \
             (keep the operator's token floor, or enable appendonly)",
        ),
    }
}

fn replication(f: &Fields, durability: Durability) -> Check {
    let role = field(f, "role").unwrap_or("unknown");
    if role != "master" {
        return check(
            "replication",
            Verdict::Fail,
            format!("connected to a {role}, not a primary: writes will be refused"),
        );
    }
    let replicas: u32 = field(f, "connected_slaves")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    match durability {
        Durability::Replicas(n) if replicas < n => check(
            "replication",
            Verdict::Fail,
            format!(
                "--durability replicas:{n} but the primary has {replicas} connected replica(s)"
            ),
        ),
        _ if replicas == 0 => check(
            "replication",
            Verdict::Warn,
            "primary without replicas: a lost primary loses every lease",
        ),
        _ => check(
            "replication",
            Verdict::Ok,
            format!("primary with {replicas} connected replica(s)"),
        ),
    }
}

fn cluster(f: &Fields, clustered_url: bool) -> Check {
    let enabled = field(f, "cluster_enabled") == Some("1");
    match (enabled, clustered_url) {
        (true, true) => check("cluster", Verdict::Ok, "Valkey Cluster"),
        (false, false) => check("cluster", Verdict::Ok, "standalone (cluster mode disabled)"),
        (true, false) => check(
            "cluster",
            Verdict::Fail,
            "the server runs in cluster mode: use a redis-cluster:// or rediss-cluster:// URL",
        ),
        (false, true) => check(
            "cluster",
            Verdict::Fail,
            "a cluster URL was given but the server is not in cluster mode",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(text: &str) -> Fields {
        fields(text)
    }

    #[test]
    fn eviction_policy_verdicts() {
        let v = |p: &str| eviction(&f(&format!("# Memory\r\nmaxmemory_policy:{p}\r\n"))).status;
        assert_eq!(v("allkeys-lru"), Verdict::Fail);
        assert_eq!(v("allkeys-random"), Verdict::Fail);
        assert_eq!(v("volatile-ttl"), Verdict::Ok);
        assert_eq!(v("noeviction"), Verdict::Ok);
        assert_eq!(eviction(&f("")).status, Verdict::Warn);
    }

    #[test]
    fn durability_settings_raise_the_bar() {
        let p = f("aof_enabled:0");
        assert_eq!(persistence(&p, Durability::None).status, Verdict::Warn);
        assert_eq!(persistence(&p, Durability::Aof).status, Verdict::Fail);
        let r = f("role:master\nconnected_slaves:1");
        assert_eq!(replication(&r, Durability::Replicas(1)).status, Verdict::Ok);
        assert_eq!(
            replication(&r, Durability::Replicas(2)).status,
            Verdict::Fail
        );
        assert_eq!(
            replication(&f("role:slave"), Durability::None).status,
            Verdict::Fail
        );
    }

    #[test]
    fn versions() {
        assert_eq!(version(&f("valkey_version:9.1.0")).status, Verdict::Ok);
        let old = version(&f("redis_version:7.2.4\r\nvalkey_version:8.1.1"));
        assert_eq!(old.status, Verdict::Fail);
        assert_eq!(version(&f("redis_version:7.0.15")).status, Verdict::Fail);
        assert_eq!(version(&f("redis_version:8.2.0")).status, Verdict::Warn);
    }
}

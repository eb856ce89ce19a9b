//! The same-run baselines of the store part: `redis-benchmark` running PING,
//! a minimal 3-command acquire script (by EVALSHA), and each of OUR
//! operations (acquire, renew, release, commit: functions of the lease
//! library, by FCALL) with the keys and arguments our client sends, so the
//! script's cost and the client's cost can be told apart.
//!
//! redis-benchmark replaces every `__rand_int__` with an independent random
//! number below `-r`, so a key and the request id of one call do not share a
//! random value; on a standalone server that changes nothing. What each call
//! does (also printed in docs/benchmarks.md, see [`DESCRIBE`]):
//!
//! - acquire: a target never used before (keyspace 10^8), fresh request id;
//!   every call grants a lease (token 1) and writes the request cache.
//! - renew: one of [`RENEW_LEASES`] live leases set up beforehand (same owner,
//!   lease id and token on each), fresh request id: every call renews.
//! - commit: a live lease of the same set with its token, a fresh request id,
//!   under one commit key per target: every call commits.
//! - release: one of 4 × n leases set up for the cell, picked at random, so
//!   about 88% of the n calls release a live lease and the rest find it gone
//!   (`expired`); the measured share is reported.

use std::ffi::OsStr;
use std::io::Write as _;
use std::process::{Command, Stdio};

use targetlease::store::valkey::KeySpace;
use targetlease::store::valkey::keys::{commit_field, request_field};
use targetlease::store::valkey::scripts::{SCRIPTS, Script};
use targetlease::store::{IDEMPOTENCY_WINDOW, Target};

use crate::stats::Figure;
use crate::support::valkey_server::ValkeyServer;

/// The minimal acquire script redis-benchmark runs: EXISTS, INCR, SET PX.
pub const MINIMAL_ACQUIRE: &str = "if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end \
local t = redis.call('INCR', KEYS[2]) \
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) \
return t";

/// What one redis-benchmark call of each of our scripts does, for the doc.
pub const DESCRIBE: &str = "acquire: a target never used before and a fresh request id, so every \
call grants a lease. renew: one of 10,000 live leases set up beforehand (same owner, lease id and \
token), fresh request id, so every call renews. commit: the token of one of those live leases, a \
fresh request id, one commit key per target, so every call commits. release: one of 4 × n leases \
set up for the cell, picked at random (redis-benchmark has no sequential keys), so most calls \
release a live lease and the rest find it gone; the share that released is in the last column.";

/// Live leases the renew and commit baselines work on.
pub const RENEW_LEASES: usize = 10_000;
const NS: &str = "bench";
const OWNER: &str = "bench-owner";
const LEASE_ID: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";
/// Lease TTL of the baselines and of our client: longer than the whole store part.
pub const TTL_MS: u64 = 600_000;
const R: &str = "__rand_int__";

fn window() -> String {
    IDEMPOTENCY_WINDOW.as_millis().to_string()
}

fn ks() -> KeySpace {
    KeySpace::new("targetlease").expect("default key prefix")
}

/// A fresh request id: three random numbers, so ids do not repeat even where
/// the keyspace (`-r`) is small.
fn rid() -> String {
    format!("{R}{R}{R}")
}

/// A request cache field with a fresh request id on every call. The client
/// hashes the request id into the field (`request_field`), which would hash
/// redis-benchmark's placeholder itself and give every call the same field,
/// so that repeated calls on one lease replay the first one instead of doing
/// the work; the scripts take any field under `q:`, so the placeholder goes
/// into the field unhashed, where redis-benchmark replaces it.
fn fresh_request(op: &str, scope: &str) -> String {
    let shaped = request_field(op, scope, "");
    let (head, _) = shaped.rsplit_once(':').expect("q:<op>:<scope>:<hash>");
    format!("{head}:{}", rid())
}

/// `FCALL <function> <number of keys> <keys…> <args…>`: one call of our `script`.
fn fcall(script: &Script, keys: &[String], args: &[&str]) -> Vec<String> {
    let mut cmd = vec![
        "FCALL".into(),
        script.function.clone(),
        keys.len().to_string(),
    ];
    cmd.extend_from_slice(keys);
    cmd.extend(args.iter().map(|a| a.to_string()));
    cmd
}

/// The acquire our client sends for `t` (the baselines' owner and lease id),
/// under request id `rid`.
fn acquire_call(ks: &KeySpace, t: &Target, rid: &str) -> Vec<String> {
    let ttl = TTL_MS.to_string();
    let request = request_field("acquire", OWNER, rid);
    fcall(
        &SCRIPTS.acquire,
        &[ks.target(t)],
        &[OWNER, &ttl, "0", LEASE_ID, "", "0", &window(), &request],
    )
}

/// Runs redis-benchmark against the server; parses its CSV line.
pub fn redis_benchmark<S: AsRef<OsStr>>(
    server: &ValkeyServer,
    c: usize,
    n: usize,
    keyspace: usize,
    command: &[S],
) -> Figure {
    let out = Command::new(crate::support::tools::tool("redis-benchmark"))
        .args(["-h", "127.0.0.1", "-p", &server.port.to_string()])
        .args(["-c", &c.to_string(), "-n", &n.to_string()])
        .args(["-P", "1", "-r", &keyspace.to_string(), "--csv"])
        .args(command)
        .output()
        .expect("run redis-benchmark (apt redis-tools)");
    assert!(
        out.status.success(),
        "redis-benchmark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let line = text
        .lines()
        .rfind(|l| !l.starts_with("\"test\"") && !l.trim().is_empty())
        .unwrap_or_else(|| panic!("no CSV line from redis-benchmark: {text}"));
    let cols: Vec<f64> = line
        .split("\",\"")
        .skip(1)
        .map(|s| s.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect();
    Figure {
        ops: n,
        ops_per_sec: cols[0],
        p50_us: cols[3] * 1e3,
        p99_us: cols[5] * 1e3,
        server_us: None,
        server_cmds: None,
    }
}

pub fn cli(server: &ValkeyServer, args: &[&str]) -> String {
    let out = Command::new(crate::support::tools::tool("redis-cli"))
        .args(["-h", "127.0.0.1", "-p", &server.port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli (apt redis-tools)");
    assert!(out.status.success(), "redis-cli {args:?} failed");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Server time per top-level call since the last `CONFIG RESETSTAT`: EVALSHA
/// or FCALL when a script ran (commands inside a script are counted inside
/// it), else the most called command.
pub fn server_time(server: &ValkeyServer) -> (Option<f64>, Option<f64>) {
    let stats = cli(server, &["INFO", "commandstats"]);
    let mut rows: Vec<(String, f64, f64)> = stats
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |k: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(k))
                    .and_then(|v| v.parse::<f64>().ok())
            };
            Some((name.to_string(), field("calls=")?, field("usec_per_call=")?))
        })
        .filter(|(name, _, _)| name != "config" && name != "info")
        .collect();
    let top = |n: &str| n == "evalsha" || n == "fcall";
    if let Some(script) = rows.iter().find(|(n, _, _)| top(n)) {
        let inner: f64 = rows.iter().filter(|(n, _, _)| !top(n)).map(|r| r.1).sum();
        return (Some(script.2), Some(inner / script.1.max(1.0)));
    }
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    (rows.first().map(|r| r.2), Some(1.0))
}

/// redis-benchmark with fresh server statistics, server time attached.
pub fn measured<S: AsRef<OsStr>>(
    server: &ValkeyServer,
    c: usize,
    n: usize,
    keyspace: usize,
    command: &[S],
) -> Figure {
    cli(server, &["CONFIG", "RESETSTAT"]);
    let mut fig = redis_benchmark(server, c, n, keyspace, command);
    (fig.server_us, fig.server_cmds) = server_time(server);
    fig
}

/// Sends `commands` through `redis-cli --pipe` (setup in bulk).
fn pipe(server: &ValkeyServer, commands: impl Iterator<Item = Vec<String>>) {
    let mut resp = Vec::new();
    for cmd in commands {
        let _ = write!(resp, "*{}\r\n", cmd.len());
        for a in cmd {
            let _ = write!(resp, "${}\r\n{a}\r\n", a.len());
        }
    }
    let mut child = Command::new(crate::support::tools::tool("redis-cli"))
        .args(["-h", "127.0.0.1", "-p", &server.port.to_string(), "--pipe"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("run redis-cli --pipe");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&resp)
        .expect("feed redis-cli --pipe");
    assert!(child.wait().expect("redis-cli --pipe").success());
}

/// Acquires `count` leases on targets `<stem>000000000000`.., each with the
/// baselines' owner and lease id and token 1 (fresh targets), through our own
/// acquire script.
fn hold(server: &ValkeyServer, stem: &str, count: usize) {
    let ks = ks();
    pipe(
        server,
        (0..count).map(|i| {
            let t = Target::new(NS, format!("{stem}{i:012}"));
            acquire_call(&ks, &t, &format!("setup-{i}"))
        }),
    );
}

/// How many of `count` leases on `<stem>…` are still there.
fn still_held(server: &ValkeyServer, stem: &str, count: usize) -> usize {
    let ks = ks();
    let key = ks.target(&Target::new(NS, format!("{stem}#")));
    let (head, tail) = key.split_once('#').expect("placeholder");
    let count_script = "local n = 0 for i = 0, tonumber(ARGV[3]) - 1 do \
        if redis.call('HEXISTS', ARGV[1] .. string.format('%012d', i) .. ARGV[2], 'lease') == 1 \
        then n = n + 1 end end return n";
    cli(
        server,
        &["EVAL", count_script, "0", head, tail, &count.to_string()],
    )
    .parse()
    .unwrap_or(0)
}

/// Sets up the live leases of the renew and commit baselines (once per server).
pub fn prepare(server: &ValkeyServer) {
    cli(server, &["FUNCTION", "LOAD", &SCRIPTS.library.source]);
    hold(server, "rb-", RENEW_LEASES);
}

/// redis-benchmark running our script `op` at concurrency `c` for `n` calls.
/// Returns the figure and the share of calls that did the operation's work.
pub fn ours_by_redis_benchmark(
    server: &ValkeyServer,
    op: &str,
    c: usize,
    n: usize,
) -> (Figure, f64) {
    let ks = ks();
    let (w, ttl) = (window(), TTL_MS.to_string());
    let live = Target::new(NS, format!("rb-{R}"));
    match op {
        "acquire" => {
            let t = Target::new(NS, format!("ra{c}-{R}"));
            let cmd = acquire_call(&ks, &t, &rid());
            (measured(server, c, n, 100_000_000, &cmd), 1.0)
        }
        "renew" => {
            let request = fresh_request("renew", OWNER);
            let cmd = fcall(
                &SCRIPTS.renew,
                &[ks.target(&live)],
                &[OWNER, LEASE_ID, "1", &ttl, &w, &request],
            );
            (measured(server, c, n, RENEW_LEASES, &cmd), 1.0)
        }
        "commit" => {
            let value = format!("v{R}");
            let (commit, request) = (commit_field("offset"), fresh_request("commit", ""));
            let cmd = fcall(
                &SCRIPTS.commit,
                &[ks.target(&live)],
                &["1", "offset", &value, &w, &commit, &request],
            );
            (measured(server, c, n, RENEW_LEASES, &cmd), 1.0)
        }
        "release" => {
            let stem = format!("rl{c}-");
            let leases = 4 * n;
            hold(server, &stem, leases);
            let t = Target::new(NS, format!("{stem}{R}"));
            let request = fresh_request("release", OWNER);
            let cmd = fcall(
                &SCRIPTS.release,
                &[ks.target(&t)],
                &[OWNER, LEASE_ID, "1", &w, &request],
            );
            let fig = measured(server, c, n, leases, &cmd);
            let released = leases - still_held(server, &stem, leases);
            (fig, released as f64 / n as f64)
        }
        other => panic!("no baseline for {other}"),
    }
}

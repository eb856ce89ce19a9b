//! CLI waiter wake-up after a release: a real `targetlease run --wait`
//! blocked on a held target, the holder (the bench, through the library)
//! releases, and the bench times how long until the waiter holds the lease
//! and until its CMD starts. Each backend with its release notices, and
//! Valkey's polling fallback (an ACL user without the channel) in the same
//! run.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use rand::Rng;
use targetlease::store::etcd::{EtcdConfig, EtcdStore};
use targetlease::store::valkey::{ValkeyConfig, ValkeyStore};
use targetlease::store::{AcquireRequest, LeaseStore, ReleaseRequest, Target};

use crate::support::etcd_cluster::EtcdCluster;
use crate::support::valkey_server::ValkeyServer;

/// The waiter's lease: its grant time is its expiry minus this.
const WAITER_TTL_MS: u64 = 10_000;

pub struct Params {
    pub trials: usize,
}

/// One way of being woken, measured over the trials.
pub struct Mode {
    pub backend: &'static str,
    pub wake: &'static str,
    /// Whether this is a subscription (the target applies) or the fallback.
    pub subscribed: bool,
    /// The release's decision → the waiter's grant, by the store's clock
    /// (Valkey: the server's `TIME`; etcd: the client clock both sides read).
    pub acquired: Vec<Duration>,
    /// The release's reply → CMD's first output line, by the bench's clock.
    pub started: Vec<Duration>,
    /// Trials whose log did not name the expected mode, or that failed.
    pub failures: usize,
}

pub struct Results {
    pub trials: usize,
    pub modes: Vec<Mode>,
}

pub fn run(p: &Params) -> Results {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut modes = Vec::new();

    let server = ValkeyServer::start();
    let url = server.url();
    server.conn().cmd(&[
        "ACL",
        "SETUSER",
        "poller",
        "on",
        ">poller-pw",
        "~*",
        "resetchannels",
        "+@all",
    ]);
    let dir = tempfile::tempdir().expect("temp dir");
    let pw = dir.path().join("password");
    std::fs::write(&pw, "poller-pw\n").expect("password file");
    let store: Arc<dyn LeaseStore> = Arc::new(
        rt.block_on(ValkeyStore::connect(&ValkeyConfig {
            url: url.clone(),
            ..ValkeyConfig::default()
        }))
        .expect("connect to valkey"),
    );
    let valkey = |backend, wake, subscribed, flags: &[&str]| {
        let m = Mode {
            backend,
            wake,
            subscribed,
            acquired: Vec::new(),
            started: Vec::new(),
            failures: 0,
        };
        measure(&rt, &*store, &url, flags, p.trials, m)
    };
    modes.push(valkey("Valkey", "release notice (pub/sub)", true, &[]));
    let as_poller = [
        "--username",
        "poller",
        "--password-file",
        pw.to_str().expect("utf-8 path"),
    ];
    modes.push(valkey(
        "Valkey",
        "polling fallback (a user without the channel)",
        false,
        &as_poller,
    ));
    drop(server);

    let cluster = EtcdCluster::start();
    let url = cluster.url();
    let store: Arc<dyn LeaseStore> = Arc::new(
        rt.block_on(EtcdStore::connect(&EtcdConfig {
            url: url.clone(),
            ..EtcdConfig::default()
        }))
        .expect("connect to etcd"),
    );
    let m = Mode {
        backend: "etcd (3 members)",
        wake: "Watch on the lease record",
        subscribed: true,
        acquired: Vec::new(),
        started: Vec::new(),
        failures: 0,
    };
    modes.push(measure(&rt, &*store, &url, &[], p.trials, m));
    Results {
        trials: p.trials,
        modes,
    }
}

fn measure(
    rt: &tokio::runtime::Runtime,
    store: &dyn LeaseStore,
    url: &str,
    flags: &[&str],
    trials: usize,
    mut m: Mode,
) -> Mode {
    let expect = if m.subscribed {
        "waiting for a release notification"
    } else {
        "no release notifications; polling"
    };
    for i in 0..trials {
        // A pause of 1.5–2.5 s: a polling waiter is at its longest interval.
        let pause = Duration::from_millis(rand::rng().random_range(1500..2500));
        match trial(rt, store, url, flags, pause, &format!("w{i}")) {
            Ok((acquired, started, log)) if log.contains(expect) => {
                m.acquired.push(acquired);
                m.started.push(started);
            }
            Ok((_, _, log)) => {
                eprintln!("bench: waiter not in the expected mode:\n{log}");
                m.failures += 1;
            }
            Err(e) => {
                eprintln!("bench: waiter trial failed: {e}");
                m.failures += 1;
            }
        }
    }
    eprintln!(
        "bench: waiters {} / {}: {} trials, {} failures",
        m.backend,
        m.wake,
        m.acquired.len(),
        m.failures
    );
    m
}

/// One trial: hold, start the waiter, release after `pause`, time it.
fn trial(
    rt: &tokio::runtime::Runtime,
    store: &dyn LeaseStore,
    url: &str,
    flags: &[&str],
    pause: Duration,
    name: &str,
) -> Result<(Duration, Duration, String), String> {
    let target = Target::new("bench-waiters", name);
    let held = rt
        .block_on(store.acquire(&AcquireRequest::new(
            target.clone(),
            "bench-holder",
            Duration::from_secs(60),
        )))
        .map_err(|e| e.to_string())?;
    let handle = held
        .lease
        .and_then(|l| l.handle())
        .ok_or("the holder got no lease")?;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_targetlease"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TARGETLEASE_") {
            cmd.env_remove(k);
        }
    }
    cmd.args(["run", "--store-url", url, "--namespace", &target.namespace])
        .args(["--target", name, "--owner", "bench-waiter", "--ttl", "10s"])
        .args(["--wait", "30s"])
        .args(flags)
        .args(["--", "sh", "-c", "echo \"$TARGETLEASE_EXPIRES_AT\""])
        .env("RUST_LOG", "targetlease=info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("spawn run: {e}"))?;
    std::thread::sleep(pause);
    let released = rt
        .block_on(store.release(&ReleaseRequest::new(target, handle)))
        .map_err(|e| e.to_string())?;
    let replied = Instant::now();
    let mut line = String::new();
    let stdout = child.stdout.take().ok_or("no stdout")?;
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let started = replied.elapsed();
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(format!("run exited {:?}:\n{log}", out.status));
    }
    let expires =
        humantime::parse_rfc3339(line.trim()).map_err(|e| format!("CMD printed {line:?}: {e}"))?;
    let expires_ms = expires
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_millis() as u64;
    let granted_ms = expires_ms.saturating_sub(WAITER_TTL_MS);
    let acquired = Duration::from_millis(granted_ms.saturating_sub(released.server_time_ms));
    Ok((acquired, started, log))
}

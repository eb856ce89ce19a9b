//! The Valkey deployments the matrix runs against, and the Valkey faults:
//! a standalone server (any persistence settings, optionally under
//! libfaketime or the power-loss shim, optionally behind the
//! fault-injecting TCP proxy of `tests/support/fault_proxy.rs`), or a
//! primary + replica watched by a real Sentinel.
//! Every method blocks; callers run them on a blocking thread.

pub mod node;
pub mod powerloss;

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use node::Node;

use crate::support::fault_proxy::FaultProxy;
use crate::support::resp::Resp;

/// Which deployment.
#[derive(Clone, Debug)]
pub enum Setup {
    /// One server with these extra arguments.
    Standalone(Vec<String>),
    /// One server whose clock the harness can move (libfaketime).
    Faketime,
    /// Primary + one replica + one Sentinel (quorum 1, 3 s down-after).
    Sentinel,
    /// One server behind the fault-injecting TCP proxy; clients use the proxy.
    Proxied,
    /// One server with these extra arguments (its AOF settings) under the
    /// power-loss shim (`powerloss.rs`), so the harness can cut its power,
    /// on a disk that keeps what was fsynced or (a control) one that does not.
    PowerLoss(Vec<String>, powerloss::Disk),
}

/// A running deployment.
pub struct Valkey {
    nodes: Mutex<Vec<Node>>,
    sentinel: Option<Node>,
    clock: Option<(tempfile::TempDir, Mutex<u64>)>,
    /// In front of the only node, for [`Setup::Proxied`].
    pub proxy: Option<FaultProxy>,
    /// Where the power-loss shim logs, and the disk, for [`Setup::PowerLoss`].
    power: Option<(tempfile::TempDir, powerloss::Disk)>,
}

/// libfaketime's multi-threaded library (linked into the tools directory by
/// `scripts/setup.sh`), or a panic that says how to get it.
fn faketime_lib() -> PathBuf {
    crate::support::tools::tool("libfaketimeMT.so.1")
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn info_field(n: &Node, section: &str, field: &str) -> String {
    let text = match n.try_cmd(&["INFO", section]) {
        Some(Resp::Bulk(Some(t))) => t,
        _ => return String::new(),
    };
    field_of(&text, field)
}

/// One `field:value` of an `INFO` reply ("" when absent).
fn field_of(info: &str, field: &str) -> String {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

impl Valkey {
    pub fn start(setup: &Setup) -> Self {
        match setup {
            Setup::Standalone(args) => Self {
                nodes: Mutex::new(vec![Node::server(args, &[])]),
                sentinel: None,
                clock: None,
                proxy: None,
                power: None,
            },
            Setup::Proxied => {
                let node = Node::server(&[], &[]);
                let proxy = FaultProxy::start(&node.addr());
                Self {
                    nodes: Mutex::new(vec![node]),
                    sentinel: None,
                    clock: None,
                    proxy: Some(proxy),
                    power: None,
                }
            }
            Setup::Faketime => {
                let dir = tempfile::tempdir().expect("tempdir");
                let file = dir.path().join("faketime");
                std::fs::write(&file, "+0\n").expect("faketime file");
                let env = [
                    ("LD_PRELOAD", faketime_lib().display().to_string()),
                    ("FAKETIME_TIMESTAMP_FILE", file.display().to_string()),
                    ("FAKETIME_NO_CACHE", "1".into()),
                    ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
                ]
                .map(|(k, v)| (k.to_string(), v));
                let node = Node::server(&[], &env);
                Self {
                    nodes: Mutex::new(vec![node]),
                    sentinel: None,
                    clock: Some((dir, Mutex::new(0))),
                    proxy: None,
                    power: None,
                }
            }
            Setup::PowerLoss(args, disk) => {
                let dir = tempfile::tempdir().expect("tempdir");
                let log = dir.path().join("durable.log");
                let node = Node::server(args, &powerloss::env_on(&log, *disk));
                Self {
                    nodes: Mutex::new(vec![node]),
                    sentinel: None,
                    clock: None,
                    proxy: None,
                    power: Some((dir, *disk)),
                }
            }
            Setup::Sentinel => {
                let primary = Node::server(&[], &[]);
                let replica = Node::server(&replica_of(primary.port), &[]);
                let sentinel = Node::sentinel(primary.port);
                let v = Self {
                    nodes: Mutex::new(vec![primary, replica]),
                    sentinel: Some(sentinel),
                    clock: None,
                    proxy: None,
                    power: None,
                };
                v.wait_replicated();
                v
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Node>> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The URL clients use.
    pub fn url(&self) -> String {
        if let Some(p) = &self.proxy {
            return p.url();
        }
        match &self.sentinel {
            Some(s) => format!(
                "redis-sentinel://127.0.0.1:{}?sentinelServiceName=mymaster",
                s.port
            ),
            None => format!("redis://127.0.0.1:{}", self.lock()[0].port),
        }
    }

    /// The URL observers use: like [`Self::url`], but never through the proxy.
    pub fn direct_url(&self) -> String {
        match &self.sentinel {
            Some(_) => self.url(),
            None => format!("redis://127.0.0.1:{}", self.lock()[0].port),
        }
    }

    /// What the servers counted of the faults, from `INFO errorstats` and
    /// `INFO commandstats` of every node that answers (summed; restarted
    /// nodes count from their restart), plus the proxy's cuts.
    pub fn effects(&self) -> Vec<(String, u64)> {
        let mut out: std::collections::BTreeMap<String, u64> = Default::default();
        for n in self.lock().iter() {
            for section in ["errorstats", "commandstats"] {
                let Some(Resp::Bulk(Some(text))) = n.try_cmd(&["INFO", section]) else {
                    continue;
                };
                for line in text.lines() {
                    let Some((key, fields)) = line.split_once(':') else {
                        continue;
                    };
                    let count = |name: &str| {
                        fields
                            .split(',')
                            .find_map(|f| f.strip_prefix(name))
                            .and_then(|v| v.parse::<u64>().ok())
                    };
                    if let Some(e) = key.strip_prefix("errorstat_") {
                        *out.entry(format!("{e} errors")).or_default() +=
                            count("count=").unwrap_or(0);
                    } else if key == "cmdstat_function|load" {
                        *out.entry("FUNCTION LOADs".into()).or_default() +=
                            count("calls=").unwrap_or(0);
                    } else if key == "cmdstat_fcall" || key == "cmdstat_fcall_ro" {
                        // A lease call refused before it ran: where nothing
                        // else fails, one that found the library missing.
                        *out.entry("failed FCALLs".into()).or_default() +=
                            count("failed_calls=").unwrap_or(0);
                    } else if key == "cmdstat_waitaof" {
                        *out.entry("WAITAOF calls".into()).or_default() +=
                            count("calls=").unwrap_or(0);
                    }
                }
            }
        }
        if let Some(p) = &self.proxy {
            out.insert("proxy cuts".into(), p.cuts() as u64);
        }
        out.into_iter().collect()
    }

    /// Valkey's clock minus the local clock, in ms (`TIME` on the primary).
    pub fn clock_offset_ms(&self) -> Option<i64> {
        let Resp::Array(Some(parts)) = self.on_primary(&["TIME"])? else {
            return None;
        };
        let num = |i: usize| match parts.get(i) {
            Some(Resp::Bulk(Some(v))) => v.parse::<i64>().ok(),
            _ => None,
        };
        let server = num(0)? * 1000 + num(1)? / 1000;
        Some(server - crate::history::now_ms() as i64)
    }

    /// The process id of every server node (a restart changes it).
    pub fn pids(&self) -> Vec<u32> {
        self.lock().iter().filter_map(|n| n.pid()).collect()
    }

    /// The port Sentinel names as primary (the only node when standalone).
    fn primary_port(&self) -> Option<u16> {
        let Some(s) = &self.sentinel else {
            return Some(self.lock()[0].port);
        };
        match s.try_cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"])? {
            Resp::Array(Some(v)) if v.len() == 2 => match &v[1] {
                Resp::Bulk(Some(p)) => p.parse().ok(),
                _ => None,
            },
            _ => None,
        }
    }

    /// One command on the current primary; None when it does not answer.
    pub fn on_primary(&self, args: &[&str]) -> Option<Resp> {
        let port = self.primary_port()?;
        let nodes = self.lock();
        nodes.iter().find(|n| n.port == port)?.try_cmd(args)
    }

    /// Waits until Sentinel knows a replica whose link to the primary is up.
    fn wait_replicated(&self) {
        wait_until("the replica to sync", Duration::from_secs(30), || {
            let Some(port) = self.primary_port() else {
                return false;
            };
            let nodes = self.lock();
            let synced = nodes
                .iter()
                .filter(|n| n.port != port)
                .all(|n| info_field(n, "replication", "master_link_status") == "up");
            let known = self.sentinel.as_ref().is_some_and(|s| {
                matches!(s.try_cmd(&["SENTINEL", "REPLICAS", "mymaster"]),
                    Some(Resp::Array(Some(v))) if !v.is_empty())
            });
            synced && known
        });
    }

    /// Sentinel's configuration epoch: one more for every promotion it made.
    pub fn epoch(&self) -> u64 {
        let Some(Resp::Array(Some(fields))) = self
            .sentinel
            .as_ref()
            .and_then(|s| s.try_cmd(&["SENTINEL", "MASTER", "mymaster"]))
        else {
            return 0;
        };
        fields
            .chunks(2)
            .find(|kv| kv[0] == Resp::Bulk(Some("config-epoch".into())))
            .and_then(|kv| match &kv[1] {
                Resp::Bulk(Some(v)) => v.parse().ok(),
                _ => None,
            })
            .unwrap_or(0)
    }

    /// Cut the replication link for `lag`, SIGKILL the primary, wait for
    /// Sentinel to promote the replica, bring the old primary back as a
    /// replica of the new one.
    ///
    /// On loopback a replica is never behind by more than a few
    /// microseconds, so a plain SIGKILL loses nothing and cannot tell a safe
    /// durability mode from an unsafe one. The lag is what a slow or
    /// partitioned replica gives in production: the replica is stopped
    /// (SIGSTOP) and the primary drops its link, so every write of the last
    /// `lag` exists only on the primary when it dies; the replica resumes
    /// before Sentinel judges the primary down, so it is the one promoted.
    /// `on_lag` runs as the lag begins.
    pub fn failover(&self, lag: Duration, on_lag: impl FnOnce()) {
        let old = self.primary_port().expect("sentinel names a primary");
        let idx = self.lock().iter().position(|n| n.port == old).unwrap();
        self.lock()
            .iter()
            .filter(|n| n.port != old)
            .for_each(|n| n.freeze(true));
        // Without the cut, the stopped replica's socket would still take
        // every write and apply it on SIGCONT: no lag at all.
        let cut = self.lock()[idx].try_cmd(&["CLIENT", "KILL", "TYPE", "replica"]);
        assert!(
            matches!(cut, Some(Resp::Int(n)) if n >= 1),
            "the primary dropped no replica link ({cut:?}): the failover would have no lag"
        );
        on_lag();
        std::thread::sleep(lag);
        self.lock()[idx].kill();
        self.lock().iter().for_each(|n| n.freeze(false));
        wait_until(
            "Sentinel to promote the replica",
            Duration::from_secs(30),
            || self.primary_port().is_some_and(|p| p != old),
        );
        let new = self.primary_port().unwrap();
        {
            let mut nodes = self.lock();
            nodes[idx].set_args(&replica_of(new));
            nodes[idx].restart();
        }
        self.wait_replicated();
    }

    /// SIGKILL the (only) server and start it again from its own files.
    pub fn restart(&self) {
        self.lock()[0].restart();
    }

    /// The power goes: SIGKILL the (only) server, cut each of its
    /// append-only files back to what it had fsynced, and start it again
    /// from what is left.
    pub fn power_cut(&self) -> powerloss::Cut {
        let (dir, disk) = self.power.as_ref().expect("a power-loss deployment");
        let mut nodes = self.lock();
        let node = &mut nodes[0];
        node.kill_all();
        let cut = powerloss::cut(node.dir(), &dir.path().join("durable.log"), *disk);
        node.start();
        cut
    }

    /// SIGKILL the (only) server at a moment its AOF buffer holds writes it
    /// executed but has not written to the file, and start it again from
    /// its files. Under `appendfsync everysec` Valkey postpones writing that
    /// buffer while its background fsync runs (up to 2 s; a slow disk makes
    /// one run most of the time) and replies anyway: what is in the buffer
    /// then was acknowledged, unless the client waits for `WAITAOF`. No
    /// power cut: everything written to the file survives (page cache).
    /// `before_kill` runs right before the SIGKILL. Returns the buffer's
    /// length when the kill came (0: no such moment within 5 s; the server
    /// is killed anyway).
    pub fn kill_unwritten(&self, before_kill: impl FnOnce()) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut nodes = self.lock();
        let node = &mut nodes[0];
        // A fsync in progress and bytes waiting: the write was postponed
        // (the bytes of the INFO's own event-loop turn would be written
        // before any reply of that turn).
        let postponed = |node: &Node| {
            let Some(Resp::Bulk(Some(info))) = node.try_cmd(&["INFO", "persistence"]) else {
                return 0;
            };
            let num = |f: &str| field_of(&info, f).parse::<u64>().unwrap_or(0);
            if num("aof_pending_bio_fsync") > 0 {
                num("aof_buffer_length")
            } else {
                0
            }
        };
        let mut buffered = 0;
        while Instant::now() < deadline {
            if postponed(node) > 0 {
                // Let the buffer fill for most of the slow fsync, then kill
                // if the write is still postponed.
                std::thread::sleep(powerloss::SLOW_FSYNC / 2);
                buffered = postponed(node);
                if buffered > 0 {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        before_kill();
        node.kill_all();
        node.start();
        buffered
    }

    /// Moves the server's clock forward by `by` (libfaketime).
    pub fn jump_clock(&self, by: Duration) {
        let (dir, offset) = self.clock.as_ref().expect("a faketime deployment");
        let mut offset = offset.lock().unwrap_or_else(|p| p.into_inner());
        *offset += by.as_secs();
        // Replaced whole (rename), never truncated in place: libfaketime
        // re-reads the file on every clock call, and a read between the
        // truncation and the write saw no offset at all.
        let tmp = dir.path().join("faketime.tmp");
        std::fs::write(&tmp, format!("+{}\n", *offset)).expect("write the faketime file");
        std::fs::rename(&tmp, dir.path().join("faketime")).expect("replace the faketime file");
    }
}

fn replica_of(port: u16) -> Vec<String> {
    vec!["--replicaof".into(), "127.0.0.1".into(), port.to_string()]
}

//! Starts a real 3-member etcd cluster on loopback ports for one test.
//!
//! The binary is the tools directory's `etcd` (`super::tools`), built by
//! `scripts/build-controlplane.sh` (the same one the Kubernetes fixtures
//! run). Members use `--heartbeat-interval=50 --election-timeout=500`: on a
//! few loaded cores that keeps spurious elections away, and it makes etcd's
//! minimum lease TTL 1 s (⌈1.5 × election timeout⌉). A member that dies or
//! does not come up explains itself (`super::process`); a missing binary
//! fails the test, never skips it.
//!
//! [`EtcdCluster::start_tls`] serves clients over TLS only (peers stay on
//! plain loopback), optionally with `--client-cert-auth`; health is then
//! asked on a plain metrics listener, which needs no client certificate.
//!
//! [`EtcdCluster::start_placed`] runs each member where a [`Placement`]
//! says: on its own addresses, inside a network namespace (the fault
//! matrix's partitioned cluster, `tests/faults/etcd/netns.rs`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::process::{describe, explain, log_to, wait_ready};
use super::valkey_server::free_port;

/// How many members the cluster has.
pub const MEMBERS: usize = 3;

/// Where one member runs and listens.
#[derive(Clone, Debug)]
pub struct Placement {
    /// `host:port` it serves clients on.
    pub client: String,
    /// `host:port` it talks raft on.
    pub peer: String,
    /// The network namespace it runs in (`ip netns exec`), if any.
    pub netns: Option<String>,
}

/// One member's addresses.
#[derive(Clone, Debug)]
struct Ports {
    at: Placement,
    /// Plain HTTP `/health` (and `/metrics`) on loopback, when clients are
    /// served TLS.
    metrics: Option<u16>,
}

impl Ports {
    /// Where health is asked: the metrics listener, else the client port.
    fn health(&self) -> String {
        self.metrics
            .map_or_else(|| self.at.client.clone(), |m| format!("127.0.0.1:{m}"))
    }
}

/// TLS on the client port: the members' certificate and key, and with
/// `client_ca` only clients with a certificate it issued get in
/// (`--client-cert-auth --trusted-ca-file`).
#[derive(Clone, Debug)]
pub struct ClientTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// A running cluster, every member killed on drop.
pub struct EtcdCluster {
    children: Vec<Option<Child>>,
    ports: Vec<Ports>,
    tls: Option<ClientTls>,
    dir: tempfile::TempDir,
}

/// Whether the member serving clients on `addr` (`host:port`) says it is
/// healthy (it has a leader and serves linearizable reads): `GET /health`.
pub fn healthy(addr: &str) -> bool {
    let Ok(addr) = addr.parse() else {
        return false;
    };
    let Ok(mut conn) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return false;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    let request = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if conn.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut reply = String::new();
    let _ = conn.read_to_string(&mut reply);
    reply.starts_with("HTTP/1.1 200") && reply.contains("\"health\":\"true\"")
}

impl EtcdCluster {
    /// A fresh, empty cluster, every member healthy. Ports found free can be
    /// taken by anything before a member binds them (tests run in
    /// parallel): a cluster whose member could not bind is started again
    /// on new ports; a member that ends for another reason is reported at once,
    /// one that does not come up within 60 s then, each with why.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// [`EtcdCluster::start`], serving clients over TLS only.
    pub fn start_tls(tls: ClientTls) -> Self {
        Self::start_with(Some(tls))
    }

    /// A fresh, empty cluster of plain (no TLS) members placed as `at`
    /// says, every member healthy; any failure is reported at once.
    pub fn start_placed(at: Vec<Placement>) -> Self {
        assert_eq!(at.len(), MEMBERS, "one placement per member");
        let mut cluster = Self {
            children: Vec::new(),
            ports: at
                .into_iter()
                .map(|at| Ports { at, metrics: None })
                .collect(),
            tls: None,
            dir: tempfile::tempdir().expect("tempdir"),
        };
        if let Err(e) = cluster.try_start() {
            panic!("the etcd cluster did not start:\n{e}");
        }
        cluster
    }

    fn start_with(tls: Option<ClientTls>) -> Self {
        let mut failures = Vec::new();
        for _ in 0..5 {
            let mut cluster = Self {
                children: Vec::new(),
                ports: (0..MEMBERS)
                    .map(|_| Ports {
                        at: Placement {
                            client: format!("127.0.0.1:{}", free_port()),
                            peer: format!("127.0.0.1:{}", free_port()),
                            netns: None,
                        },
                        metrics: tls.is_some().then(free_port),
                    })
                    .collect(),
                tls: tls.clone(),
                dir: tempfile::tempdir().expect("tempdir"),
            };
            match cluster.try_start() {
                Ok(()) => return cluster,
                Err(e) if e.contains("address already in use") => failures.push(e),
                Err(e) => {
                    failures.push(e);
                    break;
                }
            }
        }
        panic!(
            "the etcd cluster did not start:\n{}",
            failures.join("\n----- and on other ports -----\n")
        );
    }

    fn try_start(&mut self) -> Result<(), String> {
        let initial: Vec<String> = self
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("m{i}=http://{}", p.at.peer))
            .collect();
        let token = format!("contract-{}", std::process::id());
        for i in 0..MEMBERS {
            let mut cmd = self.command(i, &initial.join(","), &token);
            log_to(&mut cmd, &self.log_path(i));
            let child = cmd.spawn().map_err(|e| format!("cannot start etcd: {e}"))?;
            self.children.push(Some(child));
        }
        // Every member is watched at once, every time: one whose bind
        // failed (its port taken by another test) ends at once, and is
        // reported then, not after the wait for another member; a member
        // counted as up is still watched (a port of its could be answered by
        // another test's member after it ended).
        let within = Duration::from_secs(60);
        let deadline = Instant::now() + within;
        let mut up = [false; MEMBERS];
        loop {
            for (i, up) in up.iter_mut().enumerate() {
                *up = *up || healthy(&self.ports[i].health());
                let child = self.children[i].as_mut().expect("just started");
                let how = match child.try_wait() {
                    Ok(None) => continue,
                    Ok(Some(status)) => {
                        format!("(pid {}) {} during startup", child.id(), describe(status))
                    }
                    Err(e) => format!("(pid {}) cannot be waited for: {e}", child.id()),
                };
                let e = explain(&self.member(i), &how, &self.log_path(i));
                self.kill_all();
                return Err(e);
            }
            if up.iter().all(|&u| u) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let mut e = String::new();
                for i in (0..MEMBERS).filter(|&i| !up[i]) {
                    let pid = self.pid(i).unwrap_or(0);
                    let how =
                        format!("(pid {pid}) is running but did not come up within {within:?}");
                    e += &explain(&self.member(i), &how, &self.log_path(i));
                }
                self.kill_all();
                return Err(e);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn member(&self, i: usize) -> String {
        format!("etcd member m{i} (health on {})", self.ports[i].health())
    }

    /// The command that starts member `i` (again: its data directory
    /// then holds the cluster, and the initial flags are ignored).
    fn command(&self, i: usize, initial: &str, token: &str) -> Command {
        let p = &self.ports[i];
        let data = self.dir.path().join(format!("m{i}"));
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://{}", p.at.client);
        let peer = format!("http://{}", p.at.peer);
        // In a namespace: `ip netns exec NS etcd …` (ip execs etcd, so the
        // child's pid is the member's).
        let mut cmd = match &p.at.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns])
                    .arg(super::tools::tool("etcd"));
                c
            }
            None => Command::new(super::tools::tool("etcd")),
        };
        cmd.arg(format!("--name=m{i}"))
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster={initial}"))
            .arg("--initial-cluster-state=new")
            .arg(format!("--initial-cluster-token={token}"))
            .args(["--heartbeat-interval=50", "--election-timeout=500"])
            .arg("--log-level=warn");
        if let Some(tls) = &self.tls {
            cmd.arg(format!("--cert-file={}", tls.cert.display()))
                .arg(format!("--key-file={}", tls.key.display()));
            if let Some(ca) = &tls.client_ca {
                cmd.arg("--client-cert-auth")
                    .arg(format!("--trusted-ca-file={}", ca.display()));
            }
        }
        if let Some(metrics) = p.metrics {
            cmd.arg(format!("--listen-metrics-urls=http://127.0.0.1:{metrics}"));
        }
        cmd
    }

    /// The process id of member `i`, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.children[i].as_ref().map(Child::id)
    }

    /// SIGKILLs member `i` (the others go on without it).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again from its data directory (after [`Self::kill`])
    /// and waits until it reports healthy (a leader, linearizable reads).
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        self.respawn(i)?;
        self.await_healthy(i)
    }

    /// Starts member `i` again from its data directory (after
    /// [`Self::kill`]), without waiting for it ([`Self::await_healthy`]).
    pub fn respawn(&mut self, i: usize) -> Result<(), String> {
        self.kill(i);
        let initial: Vec<String> = self
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("m{i}=http://{}", p.at.peer))
            .collect();
        let mut cmd = self.command(i, &initial.join(","), "restarted");
        let log = self.log_path(i);
        log_to(&mut cmd, &log);
        let child = cmd.spawn().map_err(|e| format!("cannot start etcd: {e}"))?;
        self.children[i] = Some(child);
        Ok(())
    }

    /// Waits until member `i`, started again by [`Self::respawn`], reports
    /// healthy (a leader, linearizable reads).
    pub fn await_healthy(&mut self, i: usize) -> Result<(), String> {
        let log = self.log_path(i);
        let health = self.ports[i].health();
        let child = self.children[i]
            .as_mut()
            .ok_or_else(|| format!("etcd member m{i} is not running"))?;
        wait_ready(
            &format!("etcd member m{i} (restarted; health on {health})"),
            child,
            &log,
            Duration::from_secs(30),
            || healthy(&health),
        )
    }

    /// Member `i`'s stdout and stderr.
    pub fn log_path(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("m{i}.log"))
    }

    /// `host:port` of every member's client endpoint.
    pub fn endpoints(&self) -> Vec<String> {
        self.ports.iter().map(|p| p.at.client.clone()).collect()
    }

    /// The store URL naming every member: `etcd://h:p,h:p,h:p`, or
    /// `etcds://…` when clients are served TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "etcds" } else { "etcd" };
        format!("{scheme}://{}", self.endpoints().join(","))
    }

    fn kill_all(&mut self) {
        for child in self.children.iter_mut() {
            if let Some(mut c) = child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.kill_all();
    }
}

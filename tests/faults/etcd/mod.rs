//! The etcd deployment the matrix runs against — a real 3-member loopback
//! cluster (`tests/support/etcd_cluster.rs`: election timeout 500 ms, so a
//! 1 s minimum lease TTL), optionally with the clients behind one HTTP/2
//! fault proxy per member (`proxy.rs`) — and its faults: the leader
//! SIGKILLed and restarted, the leader SIGSTOPped past the election timeout
//! and resumed as a stale leader, the proxies cutting a forwarded request's
//! connection or blackholing everything; or the cluster on a real network
//! (`netns.rs`: a namespace per member, peer and client traffic on separate
//! bridges) and the leader partitioned from its peers while clients still
//! reach it. Every method blocks; callers run them on a blocking thread.

pub mod netns;
pub mod proxy;
pub mod run;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::etcd_cluster::{EtcdCluster, MEMBERS};
use proxy::H2Proxy;

/// Which deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    /// Clients straight to every member.
    Direct,
    /// Clients through a fault proxy in front of every member.
    Proxied,
    /// Every member in a network namespace of its own, clients straight to
    /// every member; the members' peer links can be cut (`netns.rs`).
    Partitioned,
}

/// A running cluster (and its proxies, or its network). Fields drop in
/// order: the members are killed before their namespaces go.
pub struct Etcd {
    cluster: Mutex<EtcdCluster>,
    pub proxies: Vec<H2Proxy>,
    net: Option<netns::Net>,
}

/// The partition row's effect: cut leaders that still answered a client as
/// the leader right after the cut (so the leader was cut, and clients still
/// reached it). Every cut must show it (`report.rs`).
pub const CUT_LEADERS_ANSWERING: &str = "cut leaders answering clients as leader";

/// How long a new leader may take to show after the old one stops.
const ELECTION: Duration = Duration::from_secs(5);

/// The `/metrics` page of the member serving clients on `endpoint`, if it
/// answers within `wait` (not a stopped, dead or unreachable member).
fn metrics(endpoint: &str, wait: Duration) -> Option<String> {
    let addr = endpoint.parse().ok()?;
    let mut conn = TcpStream::connect_timeout(&addr, wait).ok()?;
    let _ = conn.set_read_timeout(Some(wait));
    let request = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    conn.write_all(request.as_bytes()).ok()?;
    let mut reply = String::new();
    let _ = conn.read_to_string(&mut reply);
    Some(reply)
}

/// Whether the member serving clients on `endpoint` says it leads
/// (`etcd_server_is_leader 1` in its `/metrics`) within `wait`; false when
/// it does not answer in that time.
fn leads_within(endpoint: &str, wait: Duration) -> bool {
    metrics(endpoint, wait)
        .is_some_and(|m| m.lines().any(|l| l.trim() == "etcd_server_is_leader 1"))
}

/// The Raft entries the member on `endpoint` knows committed
/// (`etcd_server_proposals_committed_total`), if it answers.
fn committed_on(endpoint: &str) -> Option<u64> {
    let page = metrics(endpoint, Duration::from_millis(300))?;
    page.lines().find_map(|l| {
        let value = l.strip_prefix("etcd_server_proposals_committed_total ")?;
        value.trim().parse::<f64>().ok().map(|v| v as u64)
    })
}

/// [`leads_within`] 300 ms.
fn leads(endpoint: &str) -> bool {
    leads_within(endpoint, Duration::from_millis(300))
}

/// What one partition of a leader showed.
pub struct Cut {
    /// The member seen leading while the old leader was cut off, if any.
    pub new: Option<usize>,
    /// Right after its raft link went down, the cut member still answered
    /// a client as the leader: the cut hit the leader (not a follower that
    /// took over meanwhile), and clients still reach it.
    pub answered_as_leader: bool,
}

impl Etcd {
    pub fn start(setup: Setup) -> Self {
        let net = (setup == Setup::Partitioned).then(|| {
            netns::Net::create().unwrap_or_else(|e| {
                panic!(
                    "the partitioned etcd cluster needs network namespaces (root, iproute2): {e}"
                )
            })
        });
        let cluster = match &net {
            Some(net) => {
                EtcdCluster::start_placed((0..MEMBERS).map(|i| net.placement(i)).collect())
            }
            None => EtcdCluster::start(),
        };
        let proxies = match setup {
            Setup::Direct | Setup::Partitioned => Vec::new(),
            Setup::Proxied => cluster
                .endpoints()
                .iter()
                .map(|e| H2Proxy::start(e.parse().expect("a member's address")))
                .collect(),
        };
        Self {
            cluster: Mutex::new(cluster),
            proxies,
            net,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, EtcdCluster> {
        self.cluster.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The URL clients use (through the proxies, if any).
    pub fn url(&self) -> String {
        if self.proxies.is_empty() {
            return self.direct_url();
        }
        let members: Vec<String> = self
            .proxies
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port))
            .collect();
        format!("etcd://{}", members.join(","))
    }

    /// The URL observers use: every member, never through a proxy.
    pub fn direct_url(&self) -> String {
        self.lock().url()
    }

    /// The URL of every member but `i`, never through a proxy: clients and
    /// an observer that never call the member held behind.
    pub fn url_without(&self, i: usize) -> String {
        let mut members = self.lock().endpoints();
        members.remove(i);
        format!("etcd://{}", members.join(","))
    }

    /// What the proxies counted.
    pub fn effects(&self) -> Vec<(String, u64)> {
        if self.proxies.is_empty() {
            return Vec::new();
        }
        let cuts = self.proxies.iter().map(H2Proxy::cuts).sum();
        let lost = self.proxies.iter().map(H2Proxy::lost).sum();
        vec![
            ("proxy cuts".into(), cuts),
            (crate::scenarios::etcd::LOST_WRITES.into(), lost),
        ]
    }

    /// The member that says it leads, if exactly one does (other than `not`).
    fn leader_other_than(&self, not: Option<usize>) -> Option<usize> {
        let endpoints = self.lock().endpoints();
        let leaders: Vec<usize> = (0..MEMBERS)
            .filter(|i| Some(*i) != not && leads(&endpoints[*i]))
            .collect();
        (leaders.len() == 1).then(|| leaders[0])
    }

    /// The current leader, waiting up to [`ELECTION`] for one.
    pub fn leader(&self) -> Option<usize> {
        self.await_leader(None)
    }

    fn await_leader(&self, not: Option<usize>) -> Option<usize> {
        let deadline = Instant::now() + ELECTION;
        loop {
            if let Some(l) = self.leader_other_than(not) {
                return Some(l);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILLs leader `i`, waits for the others to elect a new one, starts
    /// it again from its data directory (and waits until it is healthy).
    /// The new leader, if one was seen.
    pub fn kill_and_restart(&self, i: usize, down: Duration) -> Option<usize> {
        self.lock().kill(i);
        self.restart_after_kill(i, down)
    }

    /// After leader `i`'s kill: waits for the others to elect a new one,
    /// starts `i` again from its data directory `down` after the kill (and
    /// waits until it is healthy). The new leader, if one was seen.
    fn restart_after_kill(&self, i: usize, down: Duration) -> Option<usize> {
        let started = Instant::now();
        let new = self.await_leader(Some(i));
        if let Some(left) = down.checked_sub(started.elapsed()) {
            std::thread::sleep(left);
        }
        self.lock()
            .restart(i)
            .unwrap_or_else(|e| panic!("restart etcd member m{i}: {e}"));
        new
    }

    /// SIGKILLs follower `i`: what the cluster commits from now on (with
    /// the two others, a quorum) is not on it. A stopped member would not
    /// do: the leader's entries wait in its socket, and it reads them once
    /// resumed.
    pub fn hold_behind(&self, i: usize) {
        self.lock().kill(i);
    }

    /// The most Raft entries any member other than `not` knows committed:
    /// it grows while `not` is down only if they commit without it.
    pub fn committed_without(&self, not: usize) -> Option<u64> {
        let endpoints = self.lock().endpoints();
        (0..MEMBERS)
            .filter(|&i| i != not)
            .filter_map(|i| committed_on(&endpoints[i]))
            .max()
    }

    /// Starts `behind` (killed by [`Etcd::hold_behind`]) again from its data
    /// directory and waits until it is healthy: a hold that ended without a
    /// leader's kill.
    pub fn release_behind(&self, behind: usize) {
        self.lock()
            .restart(behind)
            .unwrap_or_else(|e| panic!("restart etcd member m{behind}: {e}"));
    }

    /// SIGKILLs leader `i` and starts `behind` (killed by
    /// [`Etcd::hold_behind`]) again from its data directory at once, waits
    /// for a new leader, starts `i` again `down` after the kill. The one
    /// other member has every entry `behind` lacks; `behind` needs its vote,
    /// which Raft refuses to a log older than its own. The new leader, if
    /// one was seen.
    pub fn kill_with_one_behind(&self, i: usize, behind: usize, down: Duration) -> Option<usize> {
        {
            let mut cluster = self.lock();
            cluster.kill(i);
            cluster
                .respawn(behind)
                .unwrap_or_else(|e| panic!("start etcd member m{behind} again: {e}"));
        }
        let new = self.restart_after_kill(i, down);
        self.lock()
            .await_healthy(behind)
            .unwrap_or_else(|e| panic!("restart etcd member m{behind}: {e}"));
        new
    }

    /// SIGSTOPs leader `i` for `pause` (past the election timeout), watching
    /// the others elect a new one meanwhile, then SIGCONT: it wakes up as a
    /// stale leader. The new leader, if one was seen while it was stopped.
    pub fn pause(&self, i: usize, pause: Duration) -> Option<usize> {
        let pid = self.lock().pid(i).expect("a running member") as i32;
        let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
        let started = Instant::now();
        let new = self.await_leader(Some(i));
        if let Some(left) = pause.checked_sub(started.elapsed()) {
            std::thread::sleep(left);
        }
        let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
        new
    }
}

impl Etcd {
    /// Cuts leader `i` off from the other members for `cut` (clients still
    /// reach it), watching the others elect a new one meanwhile, then joins
    /// it again: it comes back as a stale leader and steps down. A leader
    /// keeps its role for at least one election timeout (500 ms) after its
    /// peers go quiet, so asked at once it still answers as the leader.
    pub fn partition(&self, i: usize, cut: Duration) -> Cut {
        let net = self.net.as_ref().expect("a partitioned setup");
        net.cut_peers(i)
            .unwrap_or_else(|e| panic!("cut etcd member m{i} off: {e}"));
        let started = Instant::now();
        let endpoint = self.lock().endpoints()[i].clone();
        let answered_as_leader = leads_within(&endpoint, Duration::from_secs(1));
        let new = self.await_leader(Some(i));
        if let Some(left) = cut.checked_sub(started.elapsed()) {
            std::thread::sleep(left);
        }
        net.join_peers(i)
            .unwrap_or_else(|e| panic!("join etcd member m{i} again: {e}"));
        Cut {
            new,
            answered_as_leader,
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // A run that panicked mid-pause leaves a member stopped: resume it
        // before the cluster kills it, so its log says how it ended.
        let cluster = self.lock();
        for i in 0..MEMBERS {
            if let Some(pid) = cluster.pid(i) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
            }
        }
    }
}

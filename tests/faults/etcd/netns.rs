//! A real network for a 3-member etcd cluster, so that its peers can be
//! partitioned: each member in a network namespace of its own, with two
//! links — one on a bridge that carries only peer traffic (raft), one on a
//! bridge that carries only client traffic, which the root namespace (where
//! the workload runs) joins. Cutting a member's peer link (its veth's root
//! end set down) partitions it from the other members while every client
//! still reaches it: a leader cut off that way goes on answering clients
//! until it notices it lost its quorum, which loopback proxies in front of
//! the client ports cannot show.
//!
//! Needs `ip` (iproute2) and the right to create namespaces, links and
//! bridges (root): a run without them fails and says so. The bridges forward
//! between their own ports only; on a host whose firewall filters bridged
//! traffic (`br_netfilter` with a FORWARD policy of DROP, as Docker sets)
//! the members would not reach each other and the cluster would not start.
//!
//! Every name carries one id per network, so runs side by side
//! (`faults.sh fill P`) do not meet: an id is held by a lock file
//! (`/run/targetlease-faults/<id>.lock`, released when the process ends,
//! however it ends), and whoever takes an id first removes whatever a run
//! that was killed before its cleanup left under it. An id whose subnets
//! the host already routes is skipped. Everything is removed on drop
//! (deleting a namespace removes its veths, and with them their root ends).

use std::fs::File;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::support::etcd_cluster::{MEMBERS, Placement};

/// The clients' and the peers' subnets: 10.66.X.0/24 and 10.67.X.0/24 for
/// network id X (0–255), away from the host's own networks.
const CLIENT_NET: u8 = 66;
const PEER_NET: u8 = 67;

/// The port every member serves clients on (each in its own namespace).
pub const CLIENT_PORT: u16 = 2379;
/// The port members talk raft on.
pub const PEER_PORT: u16 = 2380;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Where the id locks live.
const LOCKS: &str = "/run/targetlease-faults";

/// The namespaces, bridges and links of one cluster.
pub struct Net {
    id: u8,
    /// The id's lock, held while the network exists.
    _lock: File,
    /// Namespaces created so far (removed on drop).
    namespaces: Vec<String>,
    /// Bridges created so far (removed on drop).
    bridges: Vec<String>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip` (iproute2): {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "`ip {}` failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// `ip -n NS …`: the same inside a namespace.
fn ip_in(ns: &str, args: &[&str]) -> Result<(), String> {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    ip(&all)
}

impl Net {
    /// A new network for [`MEMBERS`] members, on the first id no other
    /// process holds and the host does not route.
    pub fn create() -> Result<Self, String> {
        std::fs::create_dir_all(LOCKS).map_err(|e| format!("cannot create {LOCKS}: {e}"))?;
        let routes = Command::new("ip")
            .args(["-4", "route", "show"])
            .output()
            .map_err(|e| format!("cannot run `ip` (iproute2): {e}"))?;
        let routes = String::from_utf8_lossy(&routes.stdout).into_owned();
        let start = std::process::id() * 31 + NEXT.fetch_add(1, Ordering::SeqCst);
        for k in 0..256 {
            let id = ((start + k) % 256) as u8;
            let routed = [CLIENT_NET, PEER_NET]
                .iter()
                .any(|net| routes.contains(&format!("10.{net}.{id}.")));
            if routed {
                continue;
            }
            let path = format!("{LOCKS}/{id}.lock");
            let lock = File::create(&path).map_err(|e| format!("cannot create {path}: {e}"))?;
            if lock.try_lock().is_err() {
                continue; // another process's
            }
            let mut net = Net {
                id,
                _lock: lock,
                namespaces: Vec::new(),
                bridges: Vec::new(),
            };
            net.sweep();
            net.build()?;
            return Ok(net);
        }
        Err("no free network id for the etcd members (every one is held or routed)".into())
    }

    /// Removes what a run killed before its cleanup left under this id
    /// (the lock says no live process uses it).
    fn sweep(&self) {
        for i in 0..MEMBERS {
            let _ = ip(&["netns", "del", &self.namespace(i)]);
        }
        for kind in ['c', 'p'] {
            let _ = ip(&["link", "del", &self.bridge(kind)]);
            for i in 0..MEMBERS {
                let _ = ip(&["link", "del", &self.veth(i, kind)]);
            }
        }
    }

    fn bridge(&self, kind: char) -> String {
        format!("tlf{:02x}{kind}", self.id)
    }

    fn namespace(&self, i: usize) -> String {
        format!("tlf{:02x}m{i}", self.id)
    }

    /// The root end of member `i`'s link of `kind` (`p` peer, `c` client).
    fn veth(&self, i: usize, kind: char) -> String {
        format!("tlf{:02x}{kind}{i}", self.id)
    }

    fn addr(&self, net: u8, host: u8) -> String {
        format!("10.{net}.{}.{host}", self.id)
    }

    fn build(&mut self) -> Result<(), String> {
        for (kind, net) in [('c', CLIENT_NET), ('p', PEER_NET)] {
            let br = self.bridge(kind);
            ip(&["link", "add", &br, "type", "bridge"])?;
            self.bridges.push(br.clone());
            ip(&["link", "set", &br, "up"])?;
            // The root namespace joins the client bridge only: the
            // workload reaches every member's client port, never a peer port.
            if kind == 'c' {
                ip(&[
                    "addr",
                    "add",
                    &format!("{}/24", self.addr(net, 254)),
                    "dev",
                    &br,
                ])?;
            }
        }
        for i in 0..MEMBERS {
            let ns = self.namespace(i);
            ip(&["netns", "add", &ns])?;
            self.namespaces.push(ns.clone());
            ip_in(&ns, &["link", "set", "lo", "up"])?;
            for (kind, net, inner) in [('c', CLIENT_NET, "eth0"), ('p', PEER_NET, "eth1")] {
                let outer = self.veth(i, kind);
                ip(&[
                    "link", "add", &outer, "type", "veth", "peer", "name", inner, "netns", &ns,
                ])?;
                ip(&["link", "set", &outer, "master", &self.bridge(kind), "up"])?;
                let host = u8::try_from(i + 1).expect("a few members");
                ip_in(
                    &ns,
                    &[
                        "addr",
                        "add",
                        &format!("{}/24", self.addr(net, host)),
                        "dev",
                        inner,
                    ],
                )?;
                ip_in(&ns, &["link", "set", inner, "up"])?;
            }
        }
        Ok(())
    }

    /// Where member `i` runs and listens.
    pub fn placement(&self, i: usize) -> Placement {
        let host = u8::try_from(i + 1).expect("a few members");
        Placement {
            client: format!("{}:{CLIENT_PORT}", self.addr(CLIENT_NET, host)),
            peer: format!("{}:{PEER_PORT}", self.addr(PEER_NET, host)),
            netns: Some(self.namespace(i)),
        }
    }

    /// Cuts member `i` off from the other members (its peer link down);
    /// clients still reach it.
    pub fn cut_peers(&self, i: usize) -> Result<(), String> {
        ip(&["link", "set", &self.veth(i, 'p'), "down"])
    }

    /// Joins member `i` to the other members again.
    pub fn join_peers(&self, i: usize) -> Result<(), String> {
        ip(&["link", "set", &self.veth(i, 'p'), "up"])
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.namespaces.drain(..) {
            let _ = ip(&["netns", "del", &ns]);
        }
        for br in self.bridges.drain(..) {
            let _ = ip(&["link", "del", &br]);
        }
    }
}

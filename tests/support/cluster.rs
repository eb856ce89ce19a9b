//! A real 3-primary Valkey Cluster on loopback ports, built by hand:
//! `CLUSTER ADDSLOTSRANGE` on each node, `CLUSTER MEET`, then wait for
//! `cluster_state:ok` everywhere. Killed on drop (each node is a
//! [`ValkeyServer`]).

use std::time::{Duration, Instant};

use super::resp::{Conn, Resp};
use super::valkey_server::{ValkeyServer, free_port};

/// Slot ranges of the three primaries.
pub const RANGES: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// Three primaries covering every slot.
pub struct Cluster {
    pub nodes: Vec<ValkeyServer>,
}

impl Cluster {
    pub fn start() -> Self {
        let nodes: Vec<ValkeyServer> = (0..3)
            .map(|_| {
                ValkeyServer::start_on_free_ports(|| {
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-port",
                        &free_port().to_string(),
                        "--cluster-node-timeout",
                        "5000",
                        "--enable-debug-command",
                        "yes",
                    ]
                    .map(String::from)
                    .to_vec()
                })
            })
            .collect();
        for (node, (from, to)) in nodes.iter().zip(RANGES) {
            let reply = node.conn().cmd(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &from.to_string(),
                &to.to_string(),
            ]);
            assert_eq!(reply, Resp::Simple("OK".into()), "ADDSLOTSRANGE");
        }
        nodes[0].meet(&nodes[1..]);
        let cluster = Self { nodes };
        cluster.wait_ok();
        cluster
    }

    /// Waits until every node reports `cluster_state:ok` and knows all three primaries.
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = self.nodes.iter().all(|n| {
                let info = n.conn().cmd(&["CLUSTER", "INFO"]).text();
                info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
            });
            if ready {
                return;
            }
            assert!(Instant::now() < deadline, "cluster did not become ok");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `redis-cluster://first?node=second&node=third`.
    pub fn url(&self) -> String {
        format!(
            "redis-cluster://{}?node={}&node={}",
            self.nodes[0].addr(),
            self.nodes[1].addr(),
            self.nodes[2].addr()
        )
    }

    /// The slot of a key, as the server computes it.
    pub fn keyslot(&self, key: &str) -> u16 {
        self.nodes[0].conn().cmd(&["CLUSTER", "KEYSLOT", key]).int() as u16
    }

    /// Index of the node that owns `slot` right now (by its own account).
    pub fn owner_of_slot(&self, slot: u16) -> usize {
        for (i, n) in self.nodes.iter().enumerate() {
            let myid = n.conn().cmd(&["CLUSTER", "MYID"]).text();
            let nodes = n.conn().cmd(&["CLUSTER", "NODES"]).text();
            let me = nodes
                .lines()
                .find(|l| l.starts_with(&myid))
                .expect("own line in CLUSTER NODES");
            if serves(me, slot) {
                return i;
            }
        }
        panic!("no node serves slot {slot}");
    }

    /// True when every node's `CLUSTER NODES` says node `i` serves `slot`
    /// (a change made on one node reaches the others by gossip).
    pub fn all_say_owner(&self, slot: u16, i: usize) -> bool {
        let id = self.id(i);
        self.nodes.iter().all(|n| {
            let nodes = n.conn().cmd(&["CLUSTER", "NODES"]).text();
            nodes
                .lines()
                .find(|l| l.starts_with(&id))
                .is_some_and(|l| serves(l, slot))
        })
    }

    /// A raw connection to the node owning `key`'s slot.
    pub fn conn_for(&self, key: &str) -> Conn {
        self.nodes[self.owner_of_slot(self.keyslot(key))].conn()
    }

    /// The node id of node `i`.
    pub fn id(&self, i: usize) -> String {
        self.nodes[i].conn().cmd(&["CLUSTER", "MYID"]).text()
    }
}

/// Whether a `CLUSTER NODES` line lists `slot` among its ranges.
fn serves(line: &str, slot: u16) -> bool {
    line.split_whitespace().skip(8).any(|r| {
        if r.starts_with('[') {
            return false;
        }
        match r.split_once('-') {
            Some((a, b)) => {
                a.parse::<u16>().is_ok_and(|a| a <= slot)
                    && b.parse::<u16>().is_ok_and(|b| slot <= b)
            }
            None => r.parse::<u16>() == Ok(slot),
        }
    })
}

trait Meet {
    fn meet(&self, others: &[ValkeyServer]);
}

impl Meet for ValkeyServer {
    fn meet(&self, others: &[ValkeyServer]) {
        let mut c = self.conn();
        for o in others {
            let reply = c.cmd(&[
                "CLUSTER",
                "MEET",
                "127.0.0.1",
                &o.port.to_string(),
                &cluster_port(o),
            ]);
            assert_eq!(reply, Resp::Simple("OK".into()), "CLUSTER MEET");
        }
    }
}

/// The bus port a node was started with.
fn cluster_port(node: &ValkeyServer) -> String {
    match node.conn().cmd(&["CONFIG", "GET", "cluster-port"]) {
        Resp::Array(Some(items)) => items[1].text(),
        other => panic!("CONFIG GET cluster-port: {other:?}"),
    }
}

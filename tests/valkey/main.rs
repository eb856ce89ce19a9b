//! The Valkey backend on real servers: protocol, ACL, TLS, Sentinel, Cluster,
//! durability, faults between client and server, and `targetlease check`.

#[allow(dead_code)] // each binary uses a part of the shared support
#[path = "../support/mod.rs"]
mod support;

mod acl;
mod attack;
mod check;
mod cluster;
mod cluster_faults;
mod durability;
mod failures;
mod faults;
mod protocol;
mod read_and_free;
mod redaction;
mod sentinel;
mod tls;

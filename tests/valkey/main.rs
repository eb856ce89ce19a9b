//! The Valkey backend on real servers: protocol, ACL, TLS, Sentinel, Cluster,
//! durability, broken connections between client and server, and
//! `targetlease check`.

use targetlease_test_support as support;

mod acl;
mod broken_connections;
mod check;
mod cluster;
mod cluster_broken_connections;
mod durability;
mod failures;
mod load;
mod outcomes;
mod oversized;
mod protocol;
mod read_and_free;
mod records;
mod redaction;
mod sentinel;
mod sentinel_trust;
mod tls;

use support::resp::Resp;
use support::valkey_server::ValkeyServer;
use targetlease::store::{Reply, StoreError};

/// The error is a definite refusal: `backend_unavailable` naming `code`.
fn assert_refused(result: Result<Reply, StoreError>, code: &str) {
    match result {
        Err(StoreError::BackendUnavailable(msg)) => {
            assert!(msg.contains(code), "expected {code} in {msg:?}")
        }
        other => panic!("expected backend_unavailable ({code}), got {other:?}"),
    }
}

/// Makes `server` refuse every write that needs memory (`noeviction`, a
/// 1-byte limit) and checks that it does.
fn fill_memory(server: &ValkeyServer) {
    let mut c = server.conn();
    c.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    c.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    assert!(
        matches!(c.cmd(&["SET", "x", "y"]), Resp::Error(e) if e.starts_with("OOM")),
        "the server is out of memory"
    );
}

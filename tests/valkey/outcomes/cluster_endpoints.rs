//! Cluster: endpoints the spec allows; MOVED outside a cluster; a stalled TLS handshake.

use super::*;

fn set_unknown_endpoint(c: &cluster::Cluster) {
    for n in &c.nodes {
        let r = n.conn().cmd(&[
            "CONFIG",
            "SET",
            "cluster-preferred-endpoint-type",
            "unknown-endpoint",
        ]);
        assert_eq!(r, Resp::Simple("OK".into()));
    }
}

/// Cluster spec (CLUSTER SLOTS): "A NULL value for the endpoint indicates the
/// node has an unknown endpoint and the client should connect to the same
/// endpoint it used to send the CLUSTER SLOTS command". With
/// `cluster-preferred-endpoint-type unknown-endpoint` (nodes behind a load
/// balancer) every endpoint is NULL; the client must still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_with_unknown_endpoints_is_usable() {
    let c = cluster::Cluster::start();
    set_unknown_endpoint(&c);
    let store = ValkeyStore::connect(&config(c.url())).await;
    let store = match store {
        Ok(s) => s,
        Err(e) => panic!("a healthy cluster announcing unknown endpoints is unusable: {e:?}"),
    };
    let r = store
        .acquire(&AcquireRequest::new(target("unknown-endpoint"), "a", TTL))
        .await;
    assert!(
        matches!(&r, Ok(reply) if reply.outcome == Outcome::Acquired),
        "{r:?}"
    );
}

/// docs/protocol.md: `MOVED`/`ASK` prove the command did not run (followed, or
/// `backend_unavailable` at the limit); `outcome_unknown` is "only ever given
/// for a mutation that may have happened". Cluster spec: "-MOVED 3999 :6380"
/// (empty endpoint: same host, that port) is a valid redirection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_moved_to_an_empty_endpoint_is_followed_not_unknown() {
    let c = cluster::Cluster::start();
    let store = ValkeyStore::connect(&config(c.url())).await.unwrap();
    let t = target("moved-empty-endpoint");
    let lease_key = store.keys().target(&t);
    let slot = c.keyslot(&lease_key);
    let from = c.owner_of_slot(slot);
    let to = (from + 1) % 3;
    set_unknown_endpoint(&c);
    // Move the (empty) slot, the official way: importing, migrating, then NODE everywhere.
    let (from_id, to_id) = (c.id(from), c.id(to));
    let s = slot.to_string();
    c.nodes[to]
        .conn()
        .cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id]);
    c.nodes[from]
        .conn()
        .cmd(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id]);
    for i in [to, from, (from + 2) % 3] {
        let r = c.nodes[i]
            .conn()
            .cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
        assert_eq!(r, Resp::Simple("OK".into()), "SETSLOT NODE on {i}");
    }
    // The old owner now answers the client's FCALL with a redirection.
    let mut probe = c.nodes[from].conn();
    let moved = probe.cmd(&["GET", &lease_key]);
    eprintln!("the old owner answers: {moved:?}");
    let r = store
        .acquire(&AcquireRequest::new(t.clone(), "a", TTL))
        .await;
    assert!(
        !matches!(r, Err(StoreError::OutcomeUnknown(_))),
        "a redirection proves the script did not run; got {r:?}"
    );
    assert!(
        matches!(&r, Ok(reply) if reply.outcome == Outcome::Acquired),
        "an empty-endpoint MOVED should be followed to the same host: {r:?}"
    );
}

/// Same clause, with a real cluster: a plain `redis://` URL at one node of a
/// cluster (a common misconfiguration). Every write to a target on another
/// node is answered `MOVED` and reported `outcome_unknown` ("it may have
/// written"), although no copy ran anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_url_at_a_cluster_node_reports_moved_as_unknown() {
    let c = cluster::Cluster::start();
    let store = ValkeyStore::connect(&config(c.nodes[0].url()))
        .await
        .unwrap();
    // A target whose slot lives on another node.
    let t = (0..)
        .map(|i| target(&format!("elsewhere-{i}")))
        .find(|t| c.owner_of_slot(c.keyslot(&store.keys().target(t))) != 0)
        .unwrap();
    let before: u64 = c.nodes.iter().map(|n| n.calls("fcall")).sum();
    let r = store
        .acquire(&AcquireRequest::new(t.clone(), "a", TTL))
        .await;
    let after: u64 = c.nodes.iter().map(|n| n.calls("fcall")).sum();
    assert_eq!(before, after, "no function ran on any node");
    assert!(
        matches!(r, Err(StoreError::BackendUnavailable(_))),
        "nothing ran, so this is a definite refusal: {r:?}"
    );
}

/// Deadlines: a TLS server that accepts and never completes the handshake is
/// bounded by the connect timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_tls_handshake_is_bounded_by_the_connect_timeout() {
    let silent = FaultProxy::silent();
    let started = Instant::now();
    let r = ValkeyStore::connect(&config(format!("rediss://127.0.0.1:{}", silent.port()))).await;
    assert!(
        matches!(r, Err(StoreError::BackendUnavailable(_))),
        "{:?}",
        r.err()
    );
    assert!(
        started.elapsed() < CONNECT_TIMEOUT + SLACK,
        "{:?}",
        started.elapsed()
    );
}

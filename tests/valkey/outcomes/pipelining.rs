//! Pipelining and cancelled callers: a reply is only ever its own caller's; durability waits on a shared connection; connections closed by the server or past a missed deadline's grace.

use super::*;

/// Contract: "a late reply can never be taken for the answer to a later
/// request" (link.rs) and at most one execution per call. A caller whose
/// written request is dropped (its future cancelled) must not shift its
/// reply onto the next caller of the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_caller_never_hands_its_reply_to_the_next_caller() {
    let server = ValkeyServer::start();
    let proxy = FaultProxy::start(&server.addr());
    let store = ValkeyStore::connect(&config(proxy.url())).await.unwrap();
    let t = target("cancelled");
    proxy.set(Fault::Delay(Duration::from_millis(300)));
    // Written at once, its reply held for 300ms; the caller gives up at 100ms.
    let dropped = tokio::time::timeout(
        Duration::from_millis(100),
        store.acquire(&AcquireRequest::new(t.clone(), "alice", TTL)),
    )
    .await;
    assert!(dropped.is_err(), "the first call was meant to be cancelled");
    // Same connection, next in line: its answer must be its own (a `get`).
    let got = store.get(&t).await.expect("get answers");
    assert_eq!(
        got.outcome,
        Outcome::Found,
        "the get received someone else's reply: {got:?}"
    );
    assert_eq!(got.lease.as_ref().unwrap().owner, "alice");
    assert!(
        got.lease.unwrap().lease_id.is_none(),
        "get never shows a lease id"
    );
    assert_eq!(server.calls("fcall"), 1, "the acquire ran exactly once");
}

/// Contract: every call sent at most once; replies matched in order. 200
/// pipelined callers on one connection, about half of them cancelled at a
/// random moment (before or after their request is written): every answered
/// caller gets its own lease, no target gets two tokens, and the server ran
/// exactly as many scripts as left the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_pipelined_callers_never_shift_replies_or_run_twice() {
    let server = ValkeyServer::start();
    let proxy = FaultProxy::start(&server.addr());
    let store = Arc::new(
        ValkeyStore::connect(&ValkeyConfig {
            timeout: Duration::from_secs(5),
            ..config(proxy.url())
        })
        .await
        .unwrap(),
    );
    proxy.set(Fault::Delay(Duration::from_millis(15)));
    let before = server.calls("fcall");
    let n = 200;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let t = target(&format!("storm-{i}"));
                let owner = format!("owner-{i}");
                let (give_up, start_in) = {
                    let mut rng = rand::rng();
                    let give_up = if i % 2 == 0 {
                        Duration::from_millis(rng.random_range(0..40))
                    } else {
                        Duration::from_secs(30)
                    };
                    (give_up, Duration::from_millis(rng.random_range(0..20)))
                };
                tokio::time::sleep(start_in).await;
                let r = tokio::time::timeout(
                    give_up,
                    store.acquire(&AcquireRequest::new(t.clone(), &owner, TTL)),
                )
                .await;
                (t, owner, r)
            })
        })
        .collect();
    let mut answered = 0;
    for task in tasks {
        let (t, owner, r) = task.await.unwrap();
        if let Ok(r) = r {
            let reply = r.unwrap_or_else(|e| panic!("{}: {e:?}", t.name));
            assert_eq!(reply.outcome, Outcome::Acquired, "{}: {reply:?}", t.name);
            let lease = reply.lease.unwrap();
            assert_eq!(lease.owner, owner, "{} got another caller's lease", t.name);
            assert_eq!(lease.target, t.name);
            assert_eq!(lease.fencing_token, 1);
            answered += 1;
        }
    }
    assert!(answered >= n / 2, "only {answered} answered");
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..n {
        let key = store.keys().target(&target(&format!("storm-{i}")));
        let v = fence_of(&server, &key);
        assert!(
            v.is_none() || v.as_deref() == Some("1"),
            "storm-{i}: fence {v:?}: ran twice"
        );
    }
    let ran = server.calls("fcall") - before;
    assert_eq!(
        ran as usize,
        proxy.forwarded("FCALL"),
        "server runs vs sends"
    );
    // And the connection is still usable with correct answers.
    let after = store.get(&target("storm-1")).await.unwrap();
    assert_eq!(after.outcome, Outcome::Found);
    assert_eq!(after.lease.unwrap().owner, "owner-1");
}

fn info(server: &ValkeyServer, field: &str) -> String {
    let text = server.conn().cmd(&["INFO", "replication"]).text();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or("")
        .trim()
        .to_owned()
}

/// docs/valkey.md: connections are "shared by pipelined calls"; a call
/// "that gets no reply in time closes its connection". `WAIT` blocks the
/// whole connection server-side, so two durability waits that cannot be met
/// (a replica that stopped acknowledging) queue back to back, the second
/// overruns its caller's deadline, and the connection is closed under every
/// call behind it: a plain `get` on a healthy server fails although it
/// started well within its own deadline and never needed a replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmet_durability_waits_do_not_fail_unrelated_reads() {
    let primary = ValkeyServer::start();
    let replica =
        ValkeyServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(info(&replica, "master_link_status") == "up"
        && info(&primary, "connected_slaves") == "1")
    {
        assert!(Instant::now() < deadline, "replica never synced");
        std::thread::sleep(Duration::from_millis(50));
    }
    let store = Arc::new(
        ValkeyStore::connect(&ValkeyConfig {
            durability: Durability::Replicas(1),
            ..config(primary.url())
        })
        .await
        .unwrap(),
    );
    // A target to read, made before the replica stops acknowledging.
    let readable = target("readable");
    store
        .acquire(&AcquireRequest::new(readable.clone(), "r", TTL))
        .await
        .unwrap();
    replica.freeze(true);
    // Four writers at the same instant: their scripts share one write, so
    // their WAITs reach the server back to back.
    let go = Arc::new(tokio::sync::Barrier::new(4));
    let writers: Vec<_> = (0..4)
        .map(|i| {
            let (s, go) = (store.clone(), go.clone());
            tokio::spawn(async move {
                go.wait().await;
                s.acquire(&AcquireRequest::new(target(&format!("w{i}")), "w", TTL))
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let read = store.get(&readable).await;
    for w in writers {
        let w = w.await.unwrap();
        assert!(
            matches!(w, Err(StoreError::OutcomeUnknown(_))),
            "not durable: {w:?}"
        );
    }
    replica.freeze(false);
    assert!(
        matches!(&read, Ok(reply) if reply.outcome == Outcome::Found),
        "a read on a healthy primary failed behind other callers' WAITs: {read:?}"
    );
}

/// An idle connection closed by the server (`timeout`) is noticed before
/// writing: nothing is reported `outcome_unknown` for a request that could not
/// have run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_closed_by_the_server_are_never_unknown() {
    let server = ValkeyServer::start_with(&["--timeout", "1"]);
    let store = ValkeyStore::connect(&config(server.url())).await.unwrap();
    for i in 0..4 {
        tokio::time::sleep(Duration::from_millis(2300)).await;
        let r = store
            .acquire(&AcquireRequest::new(target(&format!("idle-{i}")), "a", TTL))
            .await;
        assert!(
            matches!(&r, Ok(reply) if reply.outcome == Outcome::Acquired),
            "round {i}: {r:?}"
        );
    }
}

fn connected_clients(server: &ValkeyServer) -> u64 {
    let text = server.conn().cmd(&["INFO", "clients"]).text();
    text.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

/// docs/valkey.md: a call that gets no reply in time ends at its deadline;
/// its connection is kept while the server may still answer, and closed for
/// real once nothing came back for a grace period past the deadline (the
/// call's budget, at least 1s). The link keeps a duplicate of the socket
/// (`dial::Probe`, `try_clone` = dup), so dropping the stream alone sends no
/// FIN: the server would keep the connection (and keep running whatever was
/// queued on it) until that pool slot happens to be used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_after_a_missed_deadline_is_really_closed() {
    let server = ValkeyServer::start();
    let store = ValkeyStore::connect(&ValkeyConfig {
        timeout: Duration::from_millis(500),
        ..config(server.url())
    })
    .await
    .unwrap();
    let t = target("closed-for-real");
    store.get(&t).await.unwrap();
    server.freeze(true);
    let started = Instant::now();
    let r = store.get(&t).await;
    assert!(matches!(r, Err(StoreError::BackendUnavailable(_))), "{r:?}");
    assert!(
        started.elapsed() < Duration::from_millis(500) + SLACK,
        "the call ends at its deadline, not the grace: {:?}",
        started.elapsed()
    );
    // Past the deadline and the grace (1s), still silent: closed.
    tokio::time::sleep(Duration::from_millis(2500).saturating_sub(started.elapsed())).await;
    server.freeze(false);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Only the connection asking remains.
    assert_eq!(
        connected_clients(&server),
        1,
        "the client said it closed its connection, the server still has it"
    );
    let again = store.get(&t).await.expect("a new connection serves");
    assert_eq!(again.outcome, Outcome::NotFound);
}

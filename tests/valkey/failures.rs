//! Failure behaviour against real servers: every server-side refusal maps to
//! a definite error (never a success, never a panic), and a lost reply to a
//! mutation is `outcome_unknown`, resolved by retrying with the same request id.

use crate::support::resp;
use crate::support::valkey_server;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::{assert_refused, fill_memory};
use resp::Resp;
use targetlease::store::valkey::{Secret, ValkeyConfig, ValkeyStore};
use targetlease::store::{AcquireRequest, LeaseStore, Outcome, Reply, StoreError, Target};
use valkey_server::{ValkeyServer, free_port};

const TTL: Duration = Duration::from_secs(60);

fn config(url: String) -> ValkeyConfig {
    ValkeyConfig {
        url,
        timeout: Duration::from_millis(1500),
        connect_timeout: Duration::from_secs(2),
        ..ValkeyConfig::default()
    }
}

async fn connect(server: &ValkeyServer) -> ValkeyStore {
    ValkeyStore::connect(&config(server.url()))
        .await
        .expect("connect to the test server")
}

fn target(name: &str) -> Target {
    Target::new("failures", name)
}

/// Sends a command without waiting for its reply (the reply will never be read).
fn send_only(addr: &str, args: &[&str]) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("raw connect");
    let mut buf = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        buf.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    s.write_all(&buf).unwrap();
    s
}

async fn retry_until_connected(
    store: &ValkeyStore,
    req: &AcquireRequest,
) -> Result<Reply, StoreError> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match store.acquire(req).await {
            Err(StoreError::BackendUnavailable(msg)) if Instant::now() < deadline => {
                eprintln!("waiting for reconnect: {msg}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

#[tokio::test]
async fn nothing_listening_is_backend_unavailable_within_the_deadline() {
    let cfg = config(format!("redis://127.0.0.1:{}", free_port()));
    let started = Instant::now();
    match ValkeyStore::connect(&cfg).await {
        Err(StoreError::BackendUnavailable(_)) => {}
        other => panic!("expected backend_unavailable, got {:?}", other.err()),
    }
    assert!(
        started.elapsed() < cfg.connect_timeout + Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn server_gone_after_connect_is_a_definite_error_within_the_deadline() {
    let mut server = ValkeyServer::start();
    let store = connect(&server).await;
    server.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let got = store.get(&target("gone")).await;
    assert!(
        matches!(got, Err(StoreError::BackendUnavailable(_))),
        "{got:?}"
    );
    // A mutation may have been written to the dead socket: unknown is allowed, success is not.
    let acq = store
        .acquire(&AcquireRequest::new(target("gone"), "a", TTL))
        .await;
    assert!(
        matches!(
            acq,
            Err(StoreError::BackendUnavailable(_) | StoreError::OutcomeUnknown(_))
        ),
        "{acq:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(1500) * 2 + Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn reply_lost_after_commit_is_unknown_and_the_retry_returns_the_committed_lease() {
    let server = ValkeyServer::start_with(&["--enable-debug-command", "yes"]);
    let store = connect(&server).await;
    let t = target("late-reply");
    let req = AcquireRequest::new(t.clone(), "alice", TTL);
    // The server stalls; our acquire is queued behind the stall, runs after the
    // client's deadline, and its reply arrives when nobody waits for it.
    let _stall = send_only(&server.addr(), &["DEBUG", "SLEEP", "2.5"]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let got = store.acquire(&req).await;
    assert!(
        started.elapsed() < Duration::from_millis(1500) + Duration::from_secs(1),
        "the deadline holds even behind a stalled server: {:?}",
        started.elapsed()
    );
    match got {
        Err(StoreError::OutcomeUnknown(_)) => {}
        other => panic!("expected outcome_unknown, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let key = store.keys().target(&t);
    assert_eq!(
        server.conn().cmd(&["HGET", &key, "fence"]).text(),
        "1",
        "it did commit"
    );
    let replay = retry_until_connected(&store, &req).await.expect("retry");
    assert_eq!(replay.outcome, Outcome::Acquired);
    let lease = replay.lease.unwrap();
    assert_eq!(lease.fencing_token, 1);
    assert_eq!(
        server.conn().cmd(&["HGET", &key, "fence"]).text(),
        "1",
        "one token"
    );
    // Nobody else gets it: the committed lease is live.
    let other = store
        .acquire(&AcquireRequest::new(t, "bob", TTL))
        .await
        .unwrap();
    assert_eq!(other.outcome, Outcome::Held);
}

#[tokio::test]
async fn server_killed_mid_operation_is_unknown_and_the_retry_allocates_one_token() {
    let mut server = ValkeyServer::start_with(&[
        "--enable-debug-command",
        "yes",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ]);
    let store = connect(&server).await;
    let t = target("killed");
    // A first, committed and released lease: the counter (1) must survive the crash.
    let first = store
        .acquire(&AcquireRequest::new(t.clone(), "alice", TTL))
        .await
        .unwrap();
    let holder = first.lease.unwrap().handle().unwrap();
    store
        .release(&targetlease::store::ReleaseRequest::new(t.clone(), holder))
        .await
        .unwrap();

    let req = AcquireRequest::new(t.clone(), "bob", TTL);
    let _stall = send_only(&server.addr(), &["DEBUG", "SLEEP", "5"]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pending = {
        let req = req.clone();
        let store = &store;
        async move { store.acquire(&req).await }
    };
    let killer = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.kill();
    };
    let (result, ()) = tokio::join!(pending, killer);
    assert!(
        matches!(result, Err(StoreError::OutcomeUnknown(_))),
        "a mutation whose reply was lost must be outcome_unknown, got {result:?}"
    );
    server.restart();
    let replay = retry_until_connected(&store, &req).await.expect("retry");
    assert_eq!(replay.outcome, Outcome::Acquired, "{replay:?}");
    assert_eq!(replay.lease.as_ref().unwrap().fencing_token, 2);
    let again = retry_until_connected(&store, &req).await.expect("replay");
    assert_eq!(again.lease, replay.lease, "a replay returns the same lease");
    assert_eq!(
        server
            .conn()
            .cmd(&["HGET", &store.keys().target(&t), "fence"])
            .text(),
        "2",
        "exactly one token was allocated for the retried request"
    );
}

#[tokio::test]
async fn a_lost_library_is_loaded_again_exactly_once() {
    let mut server = ValkeyServer::start();
    let store = connect(&server).await;
    server.conn().cmd(&["FUNCTION", "FLUSH"]);
    server.conn().cmd(&["CONFIG", "RESETSTAT"]);
    let r = store
        .acquire(&AcquireRequest::new(target("flush"), "a", TTL))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Acquired);
    store
        .acquire(&AcquireRequest::new(target("flush"), "b", TTL))
        .await
        .unwrap();
    assert_eq!(server.calls("function|load"), 1, "one load after the flush");
    assert_eq!(
        server.calls("fcall"),
        3,
        "the call that missed, then two that ran"
    );
    assert_eq!(server.command_stat("fcall", "failed_calls"), 1);

    // A restart without persistence loses the library: one load brings back
    // every operation (get, read-only, finds it loaded by acquire's miss).
    server.restart();
    let req = AcquireRequest::new(target("restart"), "a", TTL);
    let r = retry_until_connected(&store, &req).await.unwrap();
    assert_eq!(r.outcome, Outcome::Acquired);
    store.get(&target("restart")).await.unwrap();
    store.get(&target("restart")).await.unwrap();
    assert_eq!(server.calls("function|load"), 1);
    assert_eq!(server.calls("fcall_ro"), 2);
    assert_eq!(server.command_stat("fcall_ro", "failed_calls"), 0);
}

/// A library of the lease library's name with other code (replaced by a
/// user that may load functions) is refused at connect and by `check`'s
/// strict load, before any of its functions runs.
#[tokio::test]
async fn a_replaced_library_is_refused_and_none_of_it_runs() {
    use targetlease::store::valkey::scripts::SCRIPTS;
    let server = ValkeyServer::start();
    let lib = &SCRIPTS.library;
    let mut planted = format!("#!lua name={}\n", lib.name);
    for s in SCRIPTS.all() {
        planted.push_str(&format!(
            "server.register_function('{}', function() return 'acquired' end)\n",
            s.function
        ));
    }
    assert_eq!(
        server.conn().cmd(&["FUNCTION", "LOAD", &planted]).text(),
        lib.name
    );
    for strict in [false, true] {
        let got = match ValkeyStore::connect_only(&config(server.url())).await {
            Ok(store) if strict => store.load_scripts().await.map(|_| ()),
            Ok(store) => ValkeyStore::connect(&config(server.url()))
                .await
                .map(|_| drop(store)),
            Err(e) => Err(e),
        };
        match got {
            Err(StoreError::BackendUnavailable(why)) => assert!(
                why.contains("other code") && why.contains(&lib.name),
                "{why}"
            ),
            other => panic!("strict {strict}: refused, got {other:?}"),
        }
    }
    assert_eq!(server.calls("fcall"), 0, "none of it ran");

    // Another library holding one of the lease functions' names: loading
    // ours fails, and that is not mistaken for "already loaded".
    server.conn().cmd(&["FUNCTION", "FLUSH"]);
    let squatter = format!(
        "#!lua name=squatter\nserver.register_function('{}', function() return 'acquired' end)",
        SCRIPTS.acquire.function
    );
    assert_eq!(
        server.conn().cmd(&["FUNCTION", "LOAD", &squatter]).text(),
        "squatter"
    );
    match ValkeyStore::connect(&config(server.url())).await {
        Err(StoreError::BackendUnavailable(why)) => {
            assert!(why.contains("already exists"), "{why}")
        }
        other => panic!("refused, got {:?}", other.err()),
    }
    assert_eq!(server.calls("fcall"), 0, "none of it ran");
}

/// The library is kept with the data: a server restarted from its AOF still
/// has it, and nothing is loaded again.
#[tokio::test]
async fn a_server_restarted_with_persistence_keeps_the_library() {
    let mut server = ValkeyServer::start_with(&["--appendonly", "yes"]);
    let store = connect(&server).await;
    server.restart();
    let req = AcquireRequest::new(target("kept"), "a", TTL);
    let r = retry_until_connected(&store, &req).await.unwrap();
    assert_eq!(r.outcome, Outcome::Acquired);
    assert_eq!(server.calls("function|load"), 0, "nothing loaded again");
    assert_eq!(server.command_stat("fcall", "failed_calls"), 0);
}

#[tokio::test]
async fn busy_server_is_a_definite_refusal() {
    let server = ValkeyServer::start_with(&["--busy-reply-threshold", "100"]);
    let store = connect(&server).await;
    let _busy = send_only(&server.addr(), &["EVAL", "while true do end", "0"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = target("busy");
    assert_refused(
        store
            .acquire(&AcquireRequest::new(t.clone(), "a", TTL))
            .await,
        "BUSY",
    );
    assert_refused(store.get(&t).await, "BUSY");
    assert_eq!(server.conn().cmd(&["SCRIPT", "KILL"]).text(), "OK");
    // The kill lands at the script's next interrupt check.
    let deadline = Instant::now() + Duration::from_secs(5);
    while matches!(server.conn().cmd(&["PING"]), Resp::Error(e) if e.starts_with("BUSY")) {
        assert!(Instant::now() < deadline, "the script did not die");
        std::thread::sleep(Duration::from_millis(10));
    }
    let r = store
        .acquire(&AcquireRequest::new(t, "a", TTL))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Acquired);
}

#[tokio::test]
async fn loading_server_is_a_definite_refusal() {
    let server = ValkeyServer::start_with(&["--enable-debug-command", "yes"]);
    let store = connect(&server).await;
    let mut c = server.conn();
    c.cmd(&["DEBUG", "POPULATE", "4000", "k", "10"]);
    // Slow the load down (1ms per key) and keep answering other clients meanwhile.
    c.cmd(&["CONFIG", "SET", "key-load-delay", "1000"]);
    c.cmd(&[
        "CONFIG",
        "SET",
        "loading-process-events-interval-bytes",
        "1024",
    ]);
    let _reload = send_only(&server.addr(), &["DEBUG", "RELOAD"]);
    // DEBUG RELOAD saves first; wait until the server really is loading.
    let deadline = Instant::now() + Duration::from_secs(3);
    while !matches!(c.cmd(&["PING"]), Resp::Error(e) if e.starts_with("LOADING")) {
        assert!(
            Instant::now() < deadline,
            "the server never started loading"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let t = target("loading");
    assert_refused(
        store
            .acquire(&AcquireRequest::new(t.clone(), "a", TTL))
            .await,
        "LOADING",
    );
    assert_refused(store.get(&t).await, "LOADING");
}

#[tokio::test]
async fn replica_is_a_definite_refusal() {
    let primary = ValkeyServer::start();
    let replica =
        ValkeyServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    // A replica cannot load the library: before the primary has it, the
    // connect says so.
    let why = match ValkeyStore::connect(&config(replica.url())).await {
        Err(StoreError::BackendUnavailable(why)) => why,
        other => panic!("backend_unavailable, got {:?}", other.err()),
    };
    assert!(
        why.contains("READONLY") && why.contains("not loaded"),
        "{why}"
    );
    // Loaded on the primary, it reaches the replica, which then serves
    // reads and refuses writes definitely.
    connect(&primary).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while replica.conn().cmd(&["FUNCTION", "LIST"]) == Resp::Array(Some(vec![])) {
        assert!(
            Instant::now() < deadline,
            "the library never reached the replica"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let store = connect(&replica).await;
    let t = target("ro");
    assert_refused(
        store
            .acquire(&AcquireRequest::new(t.clone(), "a", TTL))
            .await,
        "READONLY",
    );
    assert_eq!(store.get(&t).await.unwrap().outcome, Outcome::NotFound);
}

#[tokio::test]
async fn out_of_memory_is_a_definite_refusal() {
    let server = ValkeyServer::start();
    let store = connect(&server).await;
    fill_memory(&server);
    assert_refused(
        store
            .acquire(&AcquireRequest::new(target("oom"), "a", TTL))
            .await,
        "OOM",
    );
}

#[tokio::test]
async fn missing_permission_is_a_definite_refusal() {
    let server = ValkeyServer::start();
    server.conn().cmd(&[
        "ACL",
        "SETUSER",
        "narrow",
        "on",
        ">narrow-pw",
        "~elsewhere:*",
        "+@all",
    ]);
    let mut cfg = config(server.url());
    cfg.username = Some("narrow".into());
    cfg.password = Some(Secret::new("narrow-pw"));
    let store = ValkeyStore::connect(&cfg).await.expect("connect as narrow");
    assert_refused(
        store
            .acquire(&AcquireRequest::new(target("noperm"), "a", TTL))
            .await,
        "NOPERM",
    );
}

#[tokio::test]
async fn wrong_password_fails_closed_without_showing_it() {
    let server = ValkeyServer::start_with(&["--requirepass", "the-right-one"]);
    let mut cfg = config(server.url());
    cfg.password = Some(Secret::new("not-the-right-one-8812"));
    match ValkeyStore::connect(&cfg).await {
        Err(e @ StoreError::BackendUnavailable(_)) => {
            let msg = e.to_string();
            assert!(msg.contains("WRONGPASS"), "{msg}");
            assert!(!msg.contains("not-the-right-one-8812"), "{msg}");
            assert!(!msg.contains("the-right-one"), "{msg}");
        }
        other => panic!("expected backend_unavailable, got {:?}", other.err()),
    }
    cfg.password = None;
    match ValkeyStore::connect(&cfg).await {
        Err(StoreError::BackendUnavailable(msg)) => assert!(msg.contains("NOAUTH"), "{msg}"),
        other => panic!("expected backend_unavailable, got {:?}", other.err()),
    }
}

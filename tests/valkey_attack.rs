//! Attacks on the store client of issue 11 (at-most-once sends, honest
//! outcomes, bounded deadlines), against real servers, a fault proxy, and a
//! scripted fake server for replies a real server would not send.
//!
//! Each test names the contract clause it attacks. Tests that fail on the
//! current code are reported (with a diagnosis) in the attack report; they are
//! not weakened to pass.

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/fault_proxy.rs"]
mod fault_proxy;
#[path = "support/resp.rs"]
mod resp;
#[path = "support/valkey_server.rs"]
mod valkey_server;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fault_proxy::{Fault, FaultProxy};
use rand::Rng;
use resp::{Conn, Resp};
use targetlease::store::valkey::scripts::SCRIPTS;
use targetlease::store::valkey::{Durability, ValkeyConfig, ValkeyStore};
use targetlease::store::{AcquireRequest, LeaseStore, Outcome, Reply, StoreError, Target};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use valkey_server::{ValkeyServer, free_port, server_binary};

const TTL: Duration = Duration::from_secs(60);
const TIMEOUT: Duration = Duration::from_millis(1000);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);
/// Scheduling slack on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(1500);

fn config(url: String) -> ValkeyConfig {
    ValkeyConfig {
        url,
        timeout: TIMEOUT,
        connect_timeout: CONNECT_TIMEOUT,
        ..ValkeyConfig::default()
    }
}

fn target(name: &str) -> Target {
    Target::new("attack", name)
}

/// `calls=` of one command in INFO commandstats (0 when never called).
fn calls(server: &ValkeyServer, command: &str) -> u64 {
    let info = server.conn().cmd(&["INFO", "commandstats"]).text();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:")))
        .and_then(|rest| rest.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .map(|n| n.parse().unwrap())
        .unwrap_or(0)
}

fn get_key(server: &ValkeyServer, key: &str) -> Option<String> {
    match server.conn().cmd(&["GET", key]) {
        Resp::Bulk(b) => b,
        other => panic!("GET {key}: {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Pipelining and cancelled callers: a reply is only ever its own caller's.
// ---------------------------------------------------------------------------

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
    assert_eq!(calls(&server, "evalsha"), 1, "the acquire ran exactly once");
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
    let before = calls(&server, "evalsha");
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
        let fence = store.keys().fence(&target(&format!("storm-{i}")));
        let v = get_key(&server, &fence);
        assert!(
            v.is_none() || v.as_deref() == Some("1"),
            "storm-{i}: fence {v:?}: ran twice"
        );
    }
    let ran = calls(&server, "evalsha") - before;
    assert_eq!(
        ran as usize,
        proxy.forwarded("EVALSHA"),
        "server runs vs sends"
    );
    // And the connection is still usable with correct answers.
    let after = store.get(&target("storm-1")).await.unwrap();
    assert_eq!(after.outcome, Outcome::Found);
    assert_eq!(after.lease.unwrap().owner, "owner-1");
}

// ---------------------------------------------------------------------------
// Sentinel: one unhealthy Sentinel must not hide a healthy one.
// ---------------------------------------------------------------------------

/// A Sentinel watching `primary_port` as `mymaster`, killed on drop.
struct Sentinel {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    fn start(primary_port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {primary_port} 1\n",
                dir.path().display(),
            ),
        )
        .unwrap();
        let child = Command::new(server_binary())
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start valkey-server --sentinel");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = Conn::connect(&format!("127.0.0.1:{port}"))
                && let Ok(r) = c.try_cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"])
                && format!("{r:?}").contains(&primary_port.to_string())
            {
                break;
            }
            assert!(Instant::now() < deadline, "sentinel did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            port,
            _dir: dir,
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn acquire_through_sentinels(
    first: u16,
    second: u16,
    name: &str,
) -> Result<Reply, StoreError> {
    let store = ValkeyStore::connect(&config(format!(
        "redis-sentinel://127.0.0.1:{first}?sentinelServiceName=mymaster&node=127.0.0.1:{second}"
    )))
    .await?;
    store
        .acquire(&AcquireRequest::new(target(name), "a", TTL))
        .await
}

/// docs/valkey.md: "Every new connection asks the Sentinels for the primary";
/// the URL lists several Sentinels so that one being down does not take the
/// lease service down. A first Sentinel that accepts and never answers eats
/// the whole connect deadline: the second, healthy one is never asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_first_sentinel_does_not_hide_a_healthy_second_one() {
    let primary = ValkeyServer::start();
    let good = Sentinel::start(primary.port);
    let silent = FaultProxy::silent();
    let r = acquire_through_sentinels(silent.port(), good.port, "silent-sentinel").await;
    assert!(
        matches!(&r, Ok(reply) if reply.outcome == Outcome::Acquired),
        "a healthy Sentinel and primary were reachable, got {r:?}"
    );
}

/// Same clause: a first Sentinel that still names a primary that is gone
/// (stale view, or it monitors a dead address) ends the connect with an error
/// instead of asking the next Sentinel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_naming_a_dead_primary_does_not_hide_one_naming_the_live_primary() {
    let primary = ValkeyServer::start();
    let stale = Sentinel::start(free_port()); // monitors an address nobody listens on
    let good = Sentinel::start(primary.port);
    let r = acquire_through_sentinels(stale.port, good.port, "stale-sentinel").await;
    assert!(
        matches!(&r, Ok(reply) if reply.outcome == Outcome::Acquired),
        "the second Sentinel names a live primary, got {r:?}"
    );
}

/// A password-protected primary watched by Sentinels that have no password
/// of their own (the usual layout: `sentinel auth-pass` for the data nodes,
/// Sentinels open on a private network). The client sends the data password
/// to the Sentinels too (`AUTH` on every connection of the dialer), which a
/// Sentinel without a password refuses, so the deployment is unusable. There
/// is no way to give Sentinels their own credentials (or none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_without_a_password_in_front_of_a_protected_primary() {
    let primary = ValkeyServer::start_with(&["--requirepass", "s3cret"]);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {} 1\nsentinel auth-pass mymaster s3cret\n",
            dir.path().display(),
            primary.port
        ),
    )
    .unwrap();
    let child = Command::new(server_binary())
        .arg(&conf)
        .arg("--sentinel")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let sentinel = Sentinel {
        child,
        port,
        _dir: dir,
    };
    std::thread::sleep(Duration::from_millis(500));
    let store = ValkeyStore::connect(&ValkeyConfig {
        password: Some(targetlease::store::valkey::Secret::new("s3cret")),
        ..config(format!(
            "redis-sentinel://127.0.0.1:{}?sentinelServiceName=mymaster",
            sentinel.port
        ))
    })
    .await;
    let store = match store {
        Ok(s) => s,
        Err(e) => panic!("sentinel without a password, protected primary: {e}"),
    };
    let r = store
        .acquire(&AcquireRequest::new(target("sentinel-auth"), "a", TTL))
        .await;
    assert!(
        matches!(&r, Ok(reply) if reply.outcome == Outcome::Acquired),
        "{r:?}"
    );
}

// ---------------------------------------------------------------------------
// Cluster: endpoints the spec allows.
// ---------------------------------------------------------------------------

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
    let lease_key = store.keys().lease(&t);
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
    // The old owner now answers the client's EVALSHA with a redirection.
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
        .find(|t| c.owner_of_slot(c.keyslot(&store.keys().lease(t))) != 0)
        .unwrap();
    let before: u64 = c
        .nodes
        .iter()
        .map(|n| calls(n, "evalsha") + calls(n, "eval"))
        .sum();
    let r = store
        .acquire(&AcquireRequest::new(t.clone(), "a", TTL))
        .await;
    let after: u64 = c
        .nodes
        .iter()
        .map(|n| calls(n, "evalsha") + calls(n, "eval"))
        .sum();
    assert_eq!(before, after, "no script ran on any node");
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

// ---------------------------------------------------------------------------
// A scripted fake server, for replies a real server would not send.
// ---------------------------------------------------------------------------

/// What the fake answers to one command.
#[derive(Clone)]
enum Answer {
    /// These bytes.
    Bytes(Vec<u8>),
    /// `+` followed by an endless line (no CRLF), until the client goes away.
    EndlessLine,
    /// Nothing, ever.
    Silence,
    /// `PING` and `SCRIPT LOAD` answered as a server would; `-ERR` otherwise.
    Default,
}

struct Fake {
    port: u16,
    /// Bytes the fake managed to write for `EndlessLine`.
    streamed: Arc<AtomicU64>,
    /// Commands received, by name.
    seen: Arc<std::sync::Mutex<Vec<String>>>,
    connections: Arc<AtomicUsize>,
}

fn parse_command(buf: &[u8]) -> Option<(Vec<Vec<u8>>, usize)> {
    fn line(buf: &[u8], from: usize) -> Option<(&[u8], usize)> {
        let rest = buf.get(from..)?;
        let end = rest.windows(2).position(|w| w == b"\r\n")?;
        Some((&rest[..end], from + end + 2))
    }
    if buf.first() != Some(&b'*') {
        return None;
    }
    let (n, mut at) = line(buf, 1)?;
    let n: usize = std::str::from_utf8(n).ok()?.parse().ok()?;
    let mut args = Vec::new();
    for _ in 0..n {
        if buf.get(at) != Some(&b'$') {
            return None;
        }
        let (len, after) = line(buf, at + 1)?;
        let len: usize = std::str::from_utf8(len).ok()?.parse().ok()?;
        if buf.len() < after + len + 2 {
            return None;
        }
        args.push(buf[after..after + len].to_vec());
        at = after + len + 2;
    }
    Some((args, at))
}

fn bulk(b: &[u8]) -> Vec<u8> {
    let mut out = format!("${}\r\n", b.len()).into_bytes();
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
    out
}

impl Fake {
    /// A fake standalone server answering each command by `answer(name)`
    /// (`Answer::Default`: `PING` and `SCRIPT LOAD` as a real server would).
    async fn start(answer: impl Fn(&str) -> Answer + Send + Sync + 'static) -> Fake {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let streamed = Arc::new(AtomicU64::new(0));
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let answer = Arc::new(answer);
        let (st, sn, cn) = (streamed.clone(), seen.clone(), connections.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                cn.fetch_add(1, Ordering::SeqCst);
                let (answer, st, sn) = (answer.clone(), st.clone(), sn.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = vec![0u8; 65536];
                    loop {
                        while let Some((args, used)) = parse_command(&buf) {
                            buf.drain(..used);
                            let name = String::from_utf8_lossy(&args[0]).to_uppercase();
                            sn.lock().unwrap().push(name.clone());
                            let a = match (name.as_str(), answer(&name)) {
                                ("PING", Answer::Default) => Answer::Bytes(b"+PONG\r\n".to_vec()),
                                ("SCRIPT", Answer::Default) => {
                                    let sha =
                                        sha1_smol::Sha1::from(&args[2][..]).digest().to_string();
                                    Answer::Bytes(bulk(sha.as_bytes()))
                                }
                                (_, Answer::Default) => {
                                    Answer::Bytes(b"-ERR unexpected\r\n".to_vec())
                                }
                                (_, a) => a,
                            };
                            match a {
                                Answer::Default => unreachable!(),
                                Answer::Bytes(b) => {
                                    if sock.write_all(&b).await.is_err() {
                                        return;
                                    }
                                }
                                Answer::Silence => {
                                    // Keep reading (and discarding) until the client leaves.
                                    loop {
                                        match sock.read(&mut chunk).await {
                                            Ok(0) | Err(_) => return,
                                            Ok(_) => {}
                                        }
                                    }
                                }
                                Answer::EndlessLine => {
                                    let _ = sock.write_all(b"+").await;
                                    let junk = vec![b'a'; 1 << 20];
                                    let until =
                                        tokio::time::Instant::now() + Duration::from_secs(20);
                                    while tokio::time::Instant::now() < until {
                                        match sock.write_all(&junk).await {
                                            Ok(()) => {
                                                st.fetch_add(junk.len() as u64, Ordering::SeqCst);
                                            }
                                            Err(_) => return,
                                        }
                                    }
                                    return;
                                }
                            }
                        }
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                });
            }
        });
        Fake {
            port,
            streamed,
            seen,
            connections,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn seen(&self, name: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|n| *n == name)
            .count()
    }
}

/// resp.rs: "bounded, so a confused or hostile peer cannot make it allocate
/// without limit". A reply that is one endless simple-string line (no CRLF)
/// is buffered whole until the deadline: the client takes in far more than
/// its largest accepted reply (64 MiB bulk) before giving up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_reply_line_is_refused_early_not_buffered_until_the_deadline() {
    let fake = Fake::start(|name| match name {
        "EVALSHA" => Answer::EndlessLine,
        _ => Answer::Default,
    })
    .await;
    let store = ValkeyStore::connect(&ValkeyConfig {
        timeout: Duration::from_secs(8),
        ..config(fake.url())
    })
    .await
    .unwrap();
    let started = Instant::now();
    let r = store
        .acquire(&AcquireRequest::new(target("endless"), "a", TTL))
        .await;
    let took = started.elapsed();
    assert!(matches!(r, Err(StoreError::OutcomeUnknown(_))), "{r:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let taken = fake.streamed.load(Ordering::SeqCst);
    eprintln!("client took in {} MiB in {took:?}", taken >> 20);
    assert!(
        taken < 96 << 20,
        "the client buffered {} MiB of one reply line before failing",
        taken >> 20
    );
}

/// docs/protocol.md: a reply that cannot be decoded after a write is
/// `outcome_unknown`; for a read `backend_unavailable`/`corrupt_state`; the
/// RESP2 client must fail closed on RESP3 frames (a push before the reply).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_frames_fail_closed_for_writes_and_reads() {
    let push = b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nx\r\n".to_vec();
    let p = push.clone();
    let fake = Fake::start(move |name| match name {
        "EVALSHA" | "EVALSHA_RO" => Answer::Bytes(p.clone()),
        _ => Answer::Default,
    })
    .await;
    let store = ValkeyStore::connect(&config(fake.url())).await.unwrap();
    let w = store
        .acquire(&AcquireRequest::new(target("resp3"), "a", TTL))
        .await;
    assert!(matches!(w, Err(StoreError::OutcomeUnknown(_))), "{w:?}");
    let r = store.get(&target("resp3")).await;
    assert!(
        matches!(r, Err(StoreError::BackendUnavailable(_))),
        "a read with an unreadable reply: {r:?}"
    );
}

/// docs/protocol.md: "`backend_unavailable` always means nothing happened;
/// `outcome_unknown` is only ever given for a mutation that may have
/// happened". A `MOVED` answer (e.g. a `redis://` URL pointing at a cluster
/// node) proves the script did not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirection_in_standalone_mode_is_not_unknown() {
    let fake = Fake::start(|name| match name {
        "EVALSHA" => Answer::Bytes(b"-MOVED 1234 127.0.0.1:1\r\n".to_vec()),
        _ => Answer::Default,
    })
    .await;
    let store = ValkeyStore::connect(&config(fake.url())).await.unwrap();
    let r = store
        .acquire(&AcquireRequest::new(target("moved"), "a", TTL))
        .await;
    assert!(
        matches!(r, Err(StoreError::BackendUnavailable(_))),
        "MOVED means it did not run: {r:?}"
    );
}

/// Deadlines (issue 11, defect 6): a server that answers the handshake and
/// then never answers the script preload: `connect` ends within the
/// operation timeout, and the connection is not left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_silent_after_the_handshake_is_bounded() {
    let fake = Fake::start(|name| match name {
        "SCRIPT" => Answer::Silence,
        _ => Answer::Default,
    })
    .await;
    let started = Instant::now();
    let r = ValkeyStore::connect(&config(fake.url())).await;
    assert!(
        matches!(r, Err(StoreError::BackendUnavailable(_))),
        "{:?}",
        r.err()
    );
    assert!(started.elapsed() < CONNECT_TIMEOUT + TIMEOUT + SLACK);
    assert!(
        fake.seen("SCRIPT") >= 1,
        "the handshake passed, the preload hung"
    );
    assert_eq!(fake.connections.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------
// Durability waits on a shared, pipelined connection.
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Scripts: validate before write, keys.
// ---------------------------------------------------------------------------

/// docs/protocol.md "Validate before write": metadata accepted by
/// `validate()` must read back through the scripts (Lua counts depth on the
/// raw text). Brackets and escaped quotes inside strings must not count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_at_the_depth_limit_with_brackets_in_strings_reads_back() {
    let server = ValkeyServer::start();
    let store = ValkeyStore::connect(&config(server.url())).await.unwrap();
    let mut v = serde_json::json!({"s": "[[[{{{\\\"[[[", "k\\\"[{": "]}]}"});
    for i in 0..62 {
        v = if i % 2 == 0 {
            serde_json::json!([v])
        } else {
            serde_json::json!({ "a": v })
        };
    }
    let meta = serde_json::json!({ "top": v }).as_object().unwrap().clone();
    // One more level is refused up front: this one sits exactly at the limit.
    let mut over = AcquireRequest::new(target("deeper"), "a", TTL);
    over.metadata = Some(
        serde_json::json!({ "x": meta.clone() })
            .as_object()
            .unwrap()
            .clone(),
    );
    assert!(over.validate().is_err(), "65 levels must be refused");
    let mut req = AcquireRequest::new(target("deep"), "a", TTL);
    req.metadata = Some(meta.clone());
    match req.validate() {
        Ok(()) => {
            let r = store.acquire(&req).await.unwrap();
            assert_eq!(r.outcome, Outcome::Acquired, "{}", r.message);
            let g = store.get(&target("deep")).await.unwrap();
            assert_eq!(g.outcome, Outcome::Found, "{}", g.message);
            assert_eq!(g.lease.unwrap().metadata, Some(meta));
        }
        Err(e) => panic!("built to sit at the limit, refused: {e:?}"),
    }
}

/// Keys are escaped so that no two targets share keys: `}` and its escape
/// spelled out literally are two targets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escaped_and_literal_escape_names_are_distinct_targets() {
    let server = ValkeyServer::start();
    let store = ValkeyStore::connect(&config(server.url())).await.unwrap();
    let a = Target::new("n%7D", "}");
    let b = Target::new("n}", "%7D");
    let c = Target::new("n", "}:x");
    for (t, o) in [(&a, "a"), (&b, "b"), (&c, "c")] {
        let r = store
            .acquire(&AcquireRequest::new(t.clone(), o, TTL))
            .await
            .unwrap();
        assert_eq!(r.outcome, Outcome::Acquired, "{t:?}");
        assert_eq!(r.lease.unwrap().fencing_token, 1, "{t:?} shares a counter");
    }
}

// ---------------------------------------------------------------------------
// Idle connections closed by the server.
// ---------------------------------------------------------------------------

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

#[test]
fn scripts_are_exported_for_the_fake() {
    // (keeps the SCRIPTS import honest: the fake answers SCRIPT LOAD with the real sha)
    assert_eq!(SCRIPTS.all().len(), 6);
}

// ---------------------------------------------------------------------------
// Connections "closed" on a missed deadline.
// ---------------------------------------------------------------------------

fn connected_clients(server: &ValkeyServer) -> u64 {
    let text = server.conn().cmd(&["INFO", "clients"]).text();
    text.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

/// docs/valkey.md: "A call that gets no reply in time closes its connection
/// (… a stuck connection must not hold up the next one)". The link keeps a
/// duplicate of the socket (`dial::Probe`, `try_clone` = dup), so dropping the
/// stream sends no FIN: the server keeps the connection (and keeps running
/// whatever was queued on it) until that pool slot happens to be used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_on_a_missed_deadline_is_really_closed() {
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
    let r = store.get(&t).await;
    server.freeze(false);
    assert!(matches!(r, Err(StoreError::BackendUnavailable(_))), "{r:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Only the connection asking remains.
    assert_eq!(
        connected_clients(&server),
        1,
        "the client said it closed its connection, the server still has it"
    );
}

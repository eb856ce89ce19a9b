//! A scripted fake server, for replies a real server would not send; scripts validate before they write.

use super::*;

/// What the fake answers to one command.
#[derive(Clone)]
enum Answer {
    /// These bytes.
    Bytes(Vec<u8>),
    /// `+` followed by an endless line (no CRLF), until the client goes away.
    EndlessLine,
    /// Nothing, ever.
    Silence,
    /// `PING` and `FUNCTION LIST`/`LOAD` answered as a server would; `-ERR` otherwise.
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

impl Fake {
    /// A fake standalone server answering each command by `answer(name)`
    /// (`Answer::Default`: `PING` and `FUNCTION LOAD` as a real server would).
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
                                // LIST: the library is there; LOAD: loaded.
                                ("FUNCTION", Answer::Default) => {
                                    let name = SCRIPTS.library.name.as_bytes();
                                    Answer::Bytes(if args[1].eq_ignore_ascii_case(b"LIST") {
                                        let mut r = b"*1\r\n*4\r\n".to_vec();
                                        r.extend(bulk(b"library_name"));
                                        r.extend(bulk(name));
                                        r.extend(bulk(b"library_code"));
                                        r.extend(bulk(SCRIPTS.library.source.as_bytes()));
                                        r
                                    } else {
                                        bulk(name)
                                    })
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

/// resp.rs: "bounded, so a confused or hostile peer cannot make it allocate
/// without limit". A reply that is one endless simple-string line (no CRLF)
/// is buffered whole until the deadline: the client takes in far more than
/// its largest accepted reply (64 MiB bulk) before giving up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_reply_line_is_refused_early_not_buffered_until_the_deadline() {
    let fake = Fake::start(|name| match name {
        "FCALL" => Answer::EndlessLine,
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
        "FCALL" | "FCALL_RO" => Answer::Bytes(p.clone()),
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
        "FCALL" => Answer::Bytes(b"-MOVED 1234 127.0.0.1:1\r\n".to_vec()),
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

/// Deadlines: a server that answers the handshake and
/// then never answers the library preload: `connect` ends within the
/// operation timeout, and the connection is not left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_silent_after_the_handshake_is_bounded() {
    let fake = Fake::start(|name| match name {
        "FUNCTION" => Answer::Silence,
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
        fake.seen("FUNCTION") >= 1,
        "the handshake passed, the preload hung"
    );
    assert_eq!(fake.connections.load(Ordering::SeqCst), 1);
}

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

#[test]
fn scripts_are_exported_for_the_fake() {
    // (keeps the SCRIPTS import honest: the fake answers FUNCTION LOAD with the real name)
    assert_eq!(SCRIPTS.all().len(), 7);
}

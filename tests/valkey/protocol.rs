//! Valkey-only protocol promises the generic contract cannot express: exact
//! 64-bit tokens, a counter that fails closed at its maximum, corrupt
//! counters or request-cache entries refused without being touched, and
//! stored fields the client could not decode refused before any write.

use crate::support::resp;
use crate::support::valkey_server;

use std::time::Duration;

use resp::Resp;
use targetlease::store::valkey::{ValkeyConfig, ValkeyStore};
use targetlease::store::{
    AcquireRequest, CommitRequest, LeaseStore, Outcome, ReleaseRequest, RenewRequest, Target,
};
use valkey_server::ValkeyServer;

async fn store(server: &ValkeyServer) -> ValkeyStore {
    ValkeyStore::connect(&ValkeyConfig {
        url: server.url(),
        ..ValkeyConfig::default()
    })
    .await
    .expect("connect to the test valkey-server")
}

fn acquire(t: &Target, owner: &str) -> AcquireRequest {
    AcquireRequest::new(t.clone(), owner, Duration::from_secs(30))
}

#[tokio::test]
async fn tokens_are_exact_beyond_2_pow_53() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let t = Target::new("ns", "big");
    let fence = s.keys().fence(&t);
    server.conn().cmd(&["SET", &fence, "9007199254740993"]);
    let lease = s.acquire(&acquire(&t, "a")).await.unwrap().lease.unwrap();
    assert_eq!(lease.fencing_token, 9_007_199_254_740_994);
    assert_eq!(
        server.conn().cmd(&["GET", &fence]).text(),
        "9007199254740994"
    );
    // The exact tuple still renews and releases.
    let released = s
        .release(&ReleaseRequest::new(t.clone(), lease.handle().unwrap()))
        .await
        .unwrap();
    assert_eq!(released.outcome, Outcome::Released);
}

#[tokio::test]
async fn a_counter_at_its_maximum_fails_closed_instead_of_wrapping() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let t = Target::new("ns", "max");
    let fence = s.keys().fence(&t);
    let max = i64::MAX.to_string();
    server.conn().cmd(&["SET", &fence, &max]);
    let r = s.acquire(&acquire(&t, "a")).await.unwrap();
    assert_eq!(r.outcome, Outcome::CorruptState);
    assert!(r.message.contains("exhausted"), "{}", r.message);
    assert_eq!(
        server.conn().cmd(&["GET", &fence]).text(),
        max,
        "counter untouched"
    );
    assert_eq!(
        server.conn().cmd(&["EXISTS", &s.keys().lease(&t)]).int(),
        0,
        "no lease written"
    );
}

#[tokio::test]
async fn corrupt_counters_are_refused_and_left_alone() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let cases: [(&str, &[&str]); 3] = [
        ("not-a-number", &["SET", "{fence}", "twelve"]),
        ("with-expiry", &["SET", "{fence}", "5", "PX", "600000"]),
        ("wrong-type", &["HSET", "{fence}", "token", "5"]),
    ];
    for (name, cmd) in cases {
        let t = Target::new("ns", name);
        let fence = s.keys().fence(&t);
        let args: Vec<String> = cmd.iter().map(|a| a.replace("{fence}", &fence)).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        server.conn().cmd(&args);
        let before = server.conn().cmd(&["DUMP", &fence]);
        let r = s.acquire(&acquire(&t, "a")).await.unwrap();
        assert_eq!(r.outcome, Outcome::CorruptState, "{name}");
        assert_eq!(
            server.conn().cmd(&["DUMP", &fence]),
            before,
            "{name}: counter untouched"
        );
        assert_eq!(
            server.conn().cmd(&["EXISTS", &s.keys().lease(&t)]).int(),
            0,
            "{name}"
        );
    }
}

/// A request cache entry that is not the packed string (garbage, or a hash
/// holding the fields a replay needs) is refused: never replayed, never
/// taken as a new request.
#[tokio::test]
async fn an_unreadable_request_cache_entry_fails_closed() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let as_hash: &[&str] = &["HSET", "", "fp", "00", "lease_id", "x", "token", "1"];
    for (name, write) in [("garbage", &["SET", "", "garbage"][..]), ("hash", as_hash)] {
        let t = Target::new("ns", name);
        let req = acquire(&t, "a");
        let key = s.keys().request(&t, "acquire", "a", &req.request_id);
        let mut write = write.to_vec();
        write[1] = &key;
        server.conn().cmd(&write);
        let r = s.acquire(&req).await.unwrap();
        assert_eq!(r.outcome, Outcome::CorruptState, "{name}: {}", r.message);
        assert_eq!(
            server.conn().cmd(&["EXISTS", &s.keys().lease(&t)]).int(),
            0,
            "{name}"
        );
    }
}

#[tokio::test]
async fn the_lease_record_carries_its_expiry_as_a_backend_ttl() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let t = Target::new("ns", "ttl");
    let lease = s.acquire(&acquire(&t, "a")).await.unwrap().lease.unwrap();
    let mut c = server.conn();
    let key = s.keys().lease(&t);
    let pexpiretime = c.cmd(&["PEXPIRETIME", &key]).int();
    assert_eq!(
        pexpiretime as u64, lease.expires_at_ms,
        "TTL and stored expiry agree"
    );
    assert_eq!(
        c.cmd(&["PTTL", &s.keys().fence(&t)]).int(),
        -1,
        "the counter never expires"
    );
    let fields = match c.cmd(&["HGETALL", &key]) {
        Resp::Array(Some(items)) => items.iter().map(Resp::text).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    assert!(
        fields.windows(2).any(|w| w[0] == "v" && w[1] == "1"),
        "{fields:?}"
    );
}

/// Everything a write could change: the lease record and its TTL, the
/// commit record, and the number of keys (request cache entries).
fn state(server: &ValkeyServer, s: &ValkeyStore, t: &Target) -> String {
    let mut c = server.conn();
    let lease = s.keys().lease(t);
    let commit = s.keys().commit(t, "k");
    format!(
        "{:?} {:?} {:?} {:?}",
        c.cmd(&["DUMP", &lease]),
        c.cmd(&["PEXPIRETIME", &lease]),
        c.cmd(&["DUMP", &commit]),
        c.cmd(&["DBSIZE"])
    )
}

#[tokio::test]
async fn stored_fields_the_client_cannot_decode_are_refused_before_any_write() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let deep = format!("{}1{}", "{\"a\":".repeat(70), "}".repeat(70));
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        ("non-JSON meta", "meta", b"not json".to_vec()),
        ("non-UTF-8 meta", "meta", b"{\"a\":\"\xff\"}".to_vec()),
        ("array meta", "meta", b"[1]".to_vec()),
        ("too deep meta", "meta", deep.into_bytes()),
        ("infinite number", "meta", b"{\"a\":1e400}".to_vec()),
        ("non-UTF-8 owner", "owner", b"al\xffce".to_vec()),
    ];
    for (i, (what, field, value)) in cases.into_iter().enumerate() {
        let t = Target::new("ns", format!("undecodable-{i}"));
        let lease = s
            .acquire(&acquire(&t, "alice"))
            .await
            .unwrap()
            .lease
            .unwrap();
        let holder = lease.handle().unwrap();
        let c = s
            .commit(&CommitRequest::new(t.clone(), holder.token, "k", "v1"))
            .await
            .unwrap();
        assert_eq!(c.outcome, Outcome::Committed);
        let key = s.keys().lease(&t);
        server
            .conn()
            .try_cmd_bytes(&[b"HSET", key.as_bytes(), field.as_bytes(), &value])
            .unwrap();
        let before = state(&server, &s, &t);

        let ttl = Duration::from_secs(300);
        let renew = s
            .renew(&RenewRequest::new(t.clone(), holder.clone(), ttl))
            .await;
        let commit = s
            .commit(&CommitRequest::new(t.clone(), holder.token, "k", "v2"))
            .await;
        let get = s.get(&t).await;
        let other = s.acquire(&acquire(&t, "bob")).await;
        for (op, r) in [
            ("renew", renew),
            ("commit", commit),
            ("get", get),
            ("acquire", other),
        ] {
            match r {
                Ok(r) => assert_eq!(r.outcome, Outcome::CorruptState, "{what}: {op}: {r:?}"),
                Err(e) => panic!("{what}: {op} must be a definite corrupt_state, got {e:?}"),
            }
        }
        assert_eq!(
            state(&server, &s, &t),
            before,
            "{what}: nothing was written"
        );

        // The exact holder may still clear it (the cleanup rule), when its
        // identity reads; the reply carries nothing undecodable.
        let release = s
            .release(&ReleaseRequest::new(t.clone(), holder))
            .await
            .unwrap_or_else(|e| panic!("{what}: release: {e:?}"));
        if field == "owner" {
            assert_eq!(release.outcome, Outcome::CorruptState, "{what}");
            assert_eq!(
                state(&server, &s, &t),
                before,
                "{what}: nothing was written"
            );
        } else {
            assert_eq!(release.outcome, Outcome::Released, "{what}");
            assert!(release.lease.is_none());
            assert_eq!(server.conn().cmd(&["EXISTS", &key]).int(), 0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_calls_share_one_connection_and_each_gets_its_own_reply() {
    let server = ValkeyServer::start();
    let s = std::sync::Arc::new(store(&server).await);
    let mut tasks = Vec::new();
    for i in 0..200 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let t = Target::new("pipelined", format!("t{i}"));
            let owner = format!("owner-{i}");
            let l = s
                .acquire(&acquire(&t, &owner))
                .await
                .unwrap()
                .lease
                .unwrap();
            assert_eq!(
                (l.target.as_str(), l.owner.as_str()),
                (t.name.as_str(), owner.as_str())
            );
            let got = s.get(&t).await.unwrap().lease.unwrap();
            assert_eq!(got.owner, owner);
            let r = s
                .release(&ReleaseRequest::new(t, l.handle().unwrap()))
                .await
                .unwrap();
            assert_eq!(r.outcome, Outcome::Released);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let clients = server.conn().cmd(&["INFO", "clients"]).text();
    assert!(
        clients.contains("connected_clients:2"),
        "one pooled connection (plus this one): {clients}"
    );
}

#[tokio::test]
async fn unreadable_commit_records_read_as_corrupt_and_stay_untouched() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let t = Target::new("ns", "read");
    let key = s.keys().commit(&t, "k");
    let cases: [&[&str]; 5] = [
        &["SET", &key, "a string"],
        &[
            "HSET",
            &key,
            "token",
            "seven",
            "value",
            "v",
            "committed_ms",
            "1",
        ],
        &["HSET", &key, "token", "7", "committed_ms", "1"],
        &[
            "HSET",
            &key,
            "token",
            "0",
            "value",
            "v",
            "committed_ms",
            "1",
        ],
        // A value that is not UTF-8 (byte 0xFF).
        &[
            "EVAL",
            "redis.call('HSET', KEYS[1], 'token', '7', 'value', string.char(255), 'committed_ms', '1')",
            "1",
            &key,
        ],
    ];
    for cmd in cases {
        server.conn().cmd(&["DEL", &key]);
        server.conn().cmd(cmd);
        let before = server.conn().cmd(&["DUMP", &key]);
        let r = s.read(&t, "k").await.expect("an answer");
        assert_eq!(r.outcome, Outcome::CorruptState, "{cmd:?}: {r:?}");
        assert!(r.committed.is_none());
        assert_eq!(server.conn().cmd(&["DUMP", &key]), before, "{cmd:?}");
    }
}

#[tokio::test]
async fn a_lease_record_with_token_zero_is_corrupt_not_live() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let t = Target::new("ns", "zero");
    let key = s.keys().lease(&t);
    let far = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 600_000)
        .to_string();
    server.conn().cmd(&[
        "HSET",
        &key,
        "v",
        "1",
        "lease_id",
        "0123456789abcdef",
        "owner",
        "o",
        "token",
        "0",
        "acquired_ms",
        "1",
        "expires_ms",
        &far,
    ]);
    server.conn().cmd(&["PEXPIRE", &key, "600000"]);
    let got = s.get(&t).await.unwrap();
    assert_eq!(
        got.outcome,
        Outcome::CorruptState,
        "tokens start at 1: {got:?}"
    );
}

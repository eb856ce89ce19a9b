//! Valkey-only protocol promises the generic contract cannot express: exact
//! 64-bit tokens, a counter that fails closed at its maximum, and corrupt
//! counters or request-cache entries refused without being touched.

#[path = "support/resp.rs"]
mod resp;
#[path = "support/valkey_server.rs"]
mod valkey_server;

use std::time::Duration;

use resp::Resp;
use targetlease::store::valkey::{ValkeyConfig, ValkeyStore};
use targetlease::store::{AcquireRequest, LeaseStore, Outcome, ReleaseRequest, Target};
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
        .release(&ReleaseRequest::new(t.clone(), lease.holder().unwrap()))
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

#[tokio::test]
async fn an_unreadable_request_cache_entry_fails_closed() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let t = Target::new("ns", "cache");
    let req = acquire(&t, "a");
    let key = s.keys().request(&t, "acquire", "a", &req.request_id);
    server.conn().cmd(&["SET", &key, "garbage"]);
    let r = s.acquire(&req).await.unwrap();
    assert_eq!(r.outcome, Outcome::CorruptState);
    assert_eq!(server.conn().cmd(&["EXISTS", &s.keys().lease(&t)]).int(), 0);
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

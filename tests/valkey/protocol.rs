//! Valkey-only protocol promises the generic contract cannot express: exact
//! 64-bit tokens, a counter that fails closed at its maximum, corrupt
//! counters or request-cache entries refused without being touched, and
//! stored fields the client could not decode refused before any write.

use crate::support::valkey_server;

use std::time::Duration;

use targetlease::store::valkey::{ValkeyConfig, ValkeyStore};
use targetlease::store::{
    AcquireRequest, CommitRequest, LeaseStore, Outcome, ReleaseRequest, RenewRequest, Target,
};
use valkey_server::ValkeyServer;

pub(crate) async fn store(server: &ValkeyServer) -> ValkeyStore {
    ValkeyStore::connect(&ValkeyConfig {
        url: server.url(),
        ..ValkeyConfig::default()
    })
    .await
    .expect("connect to the test valkey-server")
}

pub(crate) fn acquire(t: &Target, owner: &str) -> AcquireRequest {
    AcquireRequest::new(t.clone(), owner, Duration::from_secs(30))
}

/// The target's hash field `field`, as stored (`None` when absent).
fn field(server: &ValkeyServer, s: &ValkeyStore, t: &Target, field: &str) -> Option<String> {
    let key = s.keys().target(t);
    server.conn().cmd(&["HMGET", &key, field]).texts().remove(0)
}

/// The remaining life of the target's hash field `field` in ms (-1: none,
/// -2: no such field).
fn field_ttl(server: &ValkeyServer, s: &ValkeyStore, t: &Target, field: &str) -> i64 {
    let key = s.keys().target(t);
    server
        .conn()
        .cmd(&["HPTTL", &key, "FIELDS", "1", field])
        .ints()[0]
}

#[tokio::test]
async fn tokens_are_exact_beyond_2_pow_53() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let t = Target::new("ns", "big");
    let key = s.keys().target(&t);
    server
        .conn()
        .cmd(&["HSET", &key, "fence", "9007199254740993"]);
    let lease = s.acquire(&acquire(&t, "a")).await.unwrap().lease.unwrap();
    assert_eq!(lease.fencing_token, 9_007_199_254_740_994);
    assert_eq!(
        field(&server, &s, &t, "fence").as_deref(),
        Some("9007199254740994")
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
    let key = s.keys().target(&t);
    let max = i64::MAX.to_string();
    server.conn().cmd(&["HSET", &key, "fence", &max]);
    let r = s.acquire(&acquire(&t, "a")).await.unwrap();
    assert_eq!(r.outcome, Outcome::CorruptState);
    assert!(r.message.contains("exhausted"), "{}", r.message);
    assert_eq!(
        field(&server, &s, &t, "fence"),
        Some(max),
        "counter untouched"
    );
    assert_eq!(field(&server, &s, &t, "lease"), None, "no lease written");
}

#[tokio::test]
async fn corrupt_counters_are_refused_and_left_alone() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let cases: [(&str, &[&[&str]]); 2] = [
        ("not-a-number", &[&["HSET", "{key}", "fence", "twelve"]]),
        (
            "with-expiry",
            &[&[
                "HSETEX", "{key}", "PX", "600000", "FIELDS", "1", "fence", "5",
            ]],
        ),
    ];
    for (name, cmds) in cases {
        let t = Target::new("ns", name);
        let key = s.keys().target(&t);
        for cmd in cmds {
            let args: Vec<String> = cmd.iter().map(|a| a.replace("{key}", &key)).collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            server.conn().cmd(&args);
        }
        let before = server.conn().cmd(&["DUMP", &key]);
        let r = s.acquire(&acquire(&t, "a")).await.unwrap();
        assert_eq!(r.outcome, Outcome::CorruptState, "{name}");
        assert_eq!(
            server.conn().cmd(&["DUMP", &key]),
            before,
            "{name}: counter untouched, nothing written"
        );
    }
}

/// Something else's key at a target's name (another application, a hand
/// edit) holds no counter this store can trust: every operation is refused
/// and the key is left exactly as it was, never overwritten or deleted.
#[tokio::test]
async fn a_target_key_of_another_type_fails_every_operation_closed() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let t = Target::new("ns", "wrong-type");
    let key = s.keys().target(&t);
    let handle = targetlease::store::LeaseHandle {
        owner: "a".into(),
        lease_id: "0123456789abcdef0123456789abcdef".into(),
        token: 1,
    };
    let ttl = Duration::from_secs(30);
    for planted in [
        &["SET", &key, "a string"][..],
        &["RPUSH", &key, "a list"][..],
    ] {
        server.conn().cmd(&["DEL", &key]);
        server.conn().cmd(planted);
        let before = server.conn().cmd(&["DUMP", &key]);
        let mut revoke = targetlease::store::RevokeRequest::new(t.clone());
        revoke.request_id = "revoke-1".into();
        let answers = [
            ("acquire", s.acquire(&acquire(&t, "a")).await),
            (
                "renew",
                s.renew(&RenewRequest::new(t.clone(), handle.clone(), ttl))
                    .await,
            ),
            (
                "release",
                s.release(&ReleaseRequest::new(t.clone(), handle.clone()))
                    .await,
            ),
            ("revoke", s.revoke(&revoke).await),
            (
                "commit",
                s.commit(&CommitRequest::new(t.clone(), 1, "k", "v")).await,
            ),
            ("get", s.get(&t).await),
        ];
        for (op, r) in answers {
            let r = r.unwrap_or_else(|e| panic!("{op}: a definite answer, got {e:?}"));
            assert_eq!(r.outcome, Outcome::CorruptState, "{op}: {r:?}");
            assert!(
                r.message.contains("target key holds a"),
                "{op}: {}",
                r.message
            );
        }
        let read = s.read(&t, "k").await.unwrap();
        assert_eq!(read.outcome, Outcome::CorruptState, "read: {read:?}");
        assert_eq!(server.conn().cmd(&["DUMP", &key]), before, "{planted:?}");
    }
}

#[tokio::test]
async fn an_unreadable_request_cache_entry_fails_closed() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let t = Target::new("ns", "cache");
    let req = acquire(&t, "a");
    let key = s.keys().target(&t);
    let entry = targetlease::store::valkey::keys::request_field("acquire", "a", &req.request_id);
    server.conn().cmd(&["HSET", &key, &entry, "garbage"]);
    let r = s.acquire(&req).await.unwrap();
    assert_eq!(r.outcome, Outcome::CorruptState);
    assert_eq!(field(&server, &s, &t, "lease"), None);
}

/// The store keeps a hash of the lease id and of the request id, never the
/// ids: whoever can read the server's memory (a dump, a replica, a read-only
/// user) learns nothing that renews, releases or commits — not the lease id,
/// nor the request id a lease id the store picked follows from.
#[tokio::test]
async fn neither_the_lease_id_nor_the_request_id_is_stored() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let t = Target::new("ns", "hashed");
    let mut req = acquire(&t, "a");
    req.lease_id = Some("chosen-lease-id-0123456789".into());
    let first = s.acquire(&req).await.unwrap().lease.unwrap();
    let other = Target::new("ns", "hashed-random");
    let picked = acquire(&other, "a");
    let second = s.acquire(&picked).await.unwrap().lease.unwrap();
    for (t, lease, rid) in [
        (&t, first, &req.request_id),
        (&other, second, &picked.request_id),
    ] {
        let id = lease.lease_id.clone().unwrap();
        let key = s.keys().target(t);
        let stored = server.conn().cmd(&["HGETALL", &key]).texts();
        let dump = format!("{:?}", server.conn().cmd(&["DUMP", &key]));
        for text in stored.iter().flatten().chain([&dump]) {
            assert!(!text.contains(&id), "the lease id {id} is stored: {text}");
            assert!(
                !text.contains(rid.as_str()),
                "the request id {rid} is stored: {text}"
            );
        }
        // And the hash kept is enough to prove it.
        let renewed = s
            .renew(&RenewRequest::new(
                t.clone(),
                lease.handle().unwrap(),
                Duration::from_secs(30),
            ))
            .await
            .unwrap();
        assert_eq!(renewed.outcome, Outcome::Renewed);
        assert_eq!(renewed.lease.unwrap().lease_id, Some(id));
    }
}

#[tokio::test]
async fn the_lease_record_carries_its_expiry_as_a_backend_ttl() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let t = Target::new("ns", "ttl");
    let lease = s.acquire(&acquire(&t, "a")).await.unwrap().lease.unwrap();
    let key = s.keys().target(&t);
    let expires = server
        .conn()
        .cmd(&["HPEXPIRETIME", &key, "FIELDS", "1", "lease"])
        .ints()[0];
    assert_eq!(
        expires as u64, lease.expires_at_ms,
        "field TTL and stored expiry agree"
    );
    assert_eq!(
        field_ttl(&server, &s, &t, "fence"),
        -1,
        "the counter never expires"
    );
    assert_eq!(server.conn().cmd(&["PTTL", &key]).int(), -1, "nor the key");
    let record = field(&server, &s, &t, "lease").unwrap();
    assert!(record.starts_with("1:"), "{record}");
}

/// Everything a write could change: the target's whole hash, the expiry of
/// its lease field, and the number of keys.
fn state(server: &ValkeyServer, s: &ValkeyStore, t: &Target) -> String {
    let mut c = server.conn();
    let key = s.keys().target(t);
    format!(
        "{:?} {:?} {:?}",
        c.cmd(&["DUMP", &key]),
        c.cmd(&["HPEXPIRETIME", &key, "FIELDS", "1", "lease"]),
        c.cmd(&["DBSIZE"])
    )
}

/// The lease record of `t` with one part replaced, keeping its expiry.
fn replace_in_record(server: &ValkeyServer, s: &ValkeyStore, t: &Target, part: &str, value: &[u8]) {
    let key = s.keys().target(t);
    let record = field(server, s, t, "lease").unwrap();
    // 1:<token>:<acquired>:<expires>:<max>:<id_sha>:<owner bytes>:<owner><meta>
    let parts: Vec<&str> = record.splitn(8, ':').collect();
    let olen: usize = parts[6].parse().unwrap();
    let (owner, meta) = parts[7].split_at(olen);
    let (owner, meta) = match part {
        "owner" => (value.to_vec(), meta.as_bytes().to_vec()),
        "meta" => (owner.as_bytes().to_vec(), value.to_vec()),
        other => panic!("{other}"),
    };
    let mut out = format!("{}:{}:", parts[..6].join(":"), owner.len()).into_bytes();
    out.extend_from_slice(&owner);
    out.extend_from_slice(&meta);
    server
        .conn()
        .try_cmd_bytes(&[
            b"HSETEX",
            key.as_bytes(),
            b"KEEPTTL",
            b"FIELDS",
            b"1",
            b"lease",
            &out,
        ])
        .unwrap();
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
        ("leading zero", "meta", b"{\"a\":01}".to_vec()),
        ("hex number", "meta", b"{\"a\":0x10}".to_vec()),
        ("plus sign", "meta", b"{\"a\":+1}".to_vec()),
        ("bare dot", "meta", b"{\"a\":1.}".to_vec()),
        ("control in string", "meta", b"{\"a\":\"x\x01y\"}".to_vec()),
        ("bad escape", "meta", b"{\"a\":\"\\q\"}".to_vec()),
        ("non-UTF-8 owner", "owner", b"al\xffce".to_vec()),
    ];
    for (i, (what, part, value)) in cases.into_iter().enumerate() {
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
        replace_in_record(&server, &s, &t, part, &value);
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
        if part == "owner" {
            assert_eq!(release.outcome, Outcome::CorruptState, "{what}");
            assert_eq!(
                state(&server, &s, &t),
                before,
                "{what}: nothing was written"
            );
        } else {
            assert_eq!(release.outcome, Outcome::Released, "{what}");
            assert!(release.lease.is_none());
            assert_eq!(field(&server, &s, &t, "lease"), None);
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

//! Lease records and keys the scripts did not write as they stand: commit
//! records and leases that cannot be read, token 0, a counter missing or
//! behind its lease, a key or field whose expiry disagrees, one larger than
//! any script writes — each refused as corrupt and left untouched — and a
//! server that cannot keep field expiries, refused at connect.

use std::time::Duration;

use super::protocol::{acquire, store};
use crate::support::resp;
use crate::support::valkey_server::{self, ValkeyServer};
use targetlease::store::valkey::{ValkeyConfig, ValkeyStore};
use targetlease::store::{
    CommitRequest, LeaseStore, Outcome, ReleaseRequest, RenewRequest, Target,
};

#[tokio::test]
async fn unreadable_commit_records_read_as_corrupt_and_stay_untouched() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let t = Target::new("ns", "read");
    let key = s.keys().target(&t);
    let cases: [&[&str]; 5] = [
        &["HSET", &key, "c:k", "a string"],
        &["HSET", &key, "c:k", "seven:1:v"],
        &["HSET", &key, "c:k", "7:v"],
        &["HSET", &key, "c:k", "0:1:v"],
        // A value that is not UTF-8 (byte 0xFF).
        &[
            "EVAL",
            "redis.call('HSET', KEYS[1], 'c:k', '7:1:' .. string.char(255))",
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
    let key = s.keys().target(&t);
    let far = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 600_000)
        .to_string();
    server.conn().cmd(&["HSET", &key, "fence", "1"]);
    let plant = |token: &str| {
        let record = format!("1:{token}:1:{far}::{}:1:o", "0".repeat(40));
        server.conn().cmd(&[
            "HSETEX", &key, "PXAT", &far, "FIELDS", "1", "lease", &record,
        ]);
    };
    plant("0");
    let got = s.get(&t).await.unwrap();
    assert_eq!(
        got.outcome,
        Outcome::CorruptState,
        "tokens start at 1: {got:?}"
    );
    // The same record with token 1 is live: the refusal was the token.
    plant("1");
    assert_eq!(s.get(&t).await.unwrap().outcome, Outcome::Found);
}

/// A server without hash-field expiry (apt's Redis 7.0 here; Valkey before
/// 9.0 alike) cannot keep a lease's expiry with it: connecting refuses with
/// a message that names the server and what is needed, before any call.
#[tokio::test]
async fn a_server_without_hash_field_expiry_is_refused_at_connect() {
    let dir = tempfile::tempdir().unwrap();
    let port = valkey_server::free_port();
    let mut child = crate::support::process::start_ready(
        &format!("redis-server on port {port}"),
        std::process::Command::new(crate::support::tools::tool("redis-server"))
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(dir.path()),
        &dir.path().join("redis-server.log"),
        Duration::from_secs(10),
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
    );
    let connected = ValkeyStore::connect(&ValkeyConfig {
        url: format!("redis://127.0.0.1:{port}"),
        ..ValkeyConfig::default()
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    match connected {
        Err(targetlease::store::StoreError::BackendUnavailable(why)) => {
            assert!(why.contains("runs Redis 7."), "{why}");
            assert!(why.contains("Valkey 9.0 or newer"), "{why}");
        }
        Err(e) => panic!("a refusal that names the server: {e:?}"),
        Ok(_) => panic!("connected to a server the scripts cannot run on"),
    }
}

/// The counter is the one thing a lease's token must never go below: a
/// record whose counter is missing or behind it is corrupt for every
/// operation (the holder cannot clean it up: the counter is not the record's
/// fault), until an administrator's revoke removes it and leaves the counter
/// at the record's token — so the next token is still larger.
#[tokio::test]
async fn a_lease_whose_counter_is_missing_or_behind_fails_closed_until_revoked() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let ttl = Duration::from_secs(30);
    let plants: [&[&str]; 2] = [
        &["HDEL", "{key}", "fence"],
        &["HSET", "{key}", "fence", "1"],
    ];
    for (i, planted) in plants.into_iter().enumerate() {
        let t = Target::new("ns", format!("fence-{i}"));
        let key = s.keys().target(&t);
        server.conn().cmd(&["HSET", &key, "fence", "41"]);
        let lease = s.acquire(&acquire(&t, "a")).await.unwrap().lease.unwrap();
        assert_eq!(lease.fencing_token, 42);
        let args: Vec<String> = planted.iter().map(|a| a.replace("{key}", &key)).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        server.conn().cmd(&args);
        let before = server.conn().cmd(&["DUMP", &key]);
        let h = lease.handle().unwrap();
        let answers = [
            ("get", s.get(&t).await),
            (
                "renew",
                s.renew(&RenewRequest::new(t.clone(), h.clone(), ttl)).await,
            ),
            (
                "commit",
                s.commit(&CommitRequest::new(t.clone(), 42, "k", "v")).await,
            ),
            (
                "release",
                s.release(&ReleaseRequest::new(t.clone(), h.clone())).await,
            ),
            ("acquire", s.acquire(&acquire(&t, "b")).await),
        ];
        for (op, r) in answers {
            let r = r.unwrap_or_else(|e| panic!("{planted:?} {op}: {e:?}"));
            assert_eq!(r.outcome, Outcome::CorruptState, "{planted:?} {op}: {r:?}");
        }
        assert_eq!(server.conn().cmd(&["DUMP", &key]), before, "{planted:?}");
        let revoked = s
            .revoke(&targetlease::store::RevokeRequest::new(t.clone()))
            .await
            .unwrap();
        assert_eq!(revoked.outcome, Outcome::Revoked, "{planted:?}");
        let next = s.acquire(&acquire(&t, "b")).await.unwrap().lease.unwrap();
        assert_eq!(
            next.fencing_token, 43,
            "{planted:?}: never below the record's token"
        );
    }
}

/// A target's key carries no expiry: one that has been given one (by hand)
/// would take the counter with it when it fires, so acquire refuses it.
#[tokio::test]
async fn a_target_key_with_an_expiry_is_refused() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let t = Target::new("ns", "key-ttl");
    let first = s.acquire(&acquire(&t, "a")).await.unwrap().lease.unwrap();
    s.release(&ReleaseRequest::new(t.clone(), first.handle().unwrap()))
        .await
        .unwrap();
    let key = s.keys().target(&t);
    assert_eq!(server.conn().cmd(&["PEXPIRE", &key, "600000"]).int(), 1);
    let r = s.acquire(&acquire(&t, "b")).await.unwrap();
    assert_eq!(r.outcome, Outcome::CorruptState, "{r:?}");
    assert!(r.message.contains("expiry"), "{}", r.message);
}

/// A record whose field expiry is not its stored expiry (a hand edit, or a
/// record written by something else) would let the store publish a later
/// expiry than the one the server enforces: it is corrupt.
#[tokio::test]
async fn a_lease_whose_field_expiry_disagrees_with_its_record_is_corrupt() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let t = Target::new("ns", "expiry");
    s.acquire(&acquire(&t, "a")).await.unwrap();
    let key = s.keys().target(&t);
    // The field now expires in 2 s while the record still says 30 s.
    let r = server
        .conn()
        .cmd(&["HPEXPIRE", &key, "2000", "FIELDS", "1", "lease"]);
    assert_eq!(r.ints(), [1]);
    let got = s.get(&t).await.unwrap();
    assert_eq!(got.outcome, Outcome::CorruptState, "{got:?}");
}

/// Calls that name fields of another kind (the counter, the lease) where a
/// request-cache or commit field belongs are refused by the scripts
/// themselves, so no hand-made call can overwrite the counter through them.
#[tokio::test]
async fn scripts_refuse_field_names_of_another_kind() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let t = Target::new("ns", "fields");
    let lease = s.acquire(&acquire(&t, "a")).await.unwrap().lease.unwrap();
    let key = s.keys().target(&t);
    let scripts = &targetlease::store::valkey::scripts::SCRIPTS;
    let token = lease.fencing_token.to_string();
    let before = server.conn().cmd(&["DUMP", &key]);
    let commit = server.conn().cmd(&[
        "FCALL",
        &scripts.commit.function,
        "1",
        &key,
        &token,
        "k",
        "9",
        "60000",
        "fence",
        "q:x",
    ]);
    let read = server
        .conn()
        .cmd(&["FCALL_RO", &scripts.read.function, "1", &key, "lease"]);
    let renew = server.conn().cmd(&[
        "FCALL",
        &scripts.renew.function,
        "1",
        &key,
        "a",
        "x",
        &token,
        "1000",
        "60000",
        "lease",
    ]);
    for (op, r) in [("commit", commit), ("read", read), ("renew", renew)] {
        // A script's reply is one string of NUL-separated fields (lua/lib.lua).
        let first = match &r {
            resp::Resp::Bulk(Some(reply)) => reply.split('\0').next().unwrap_or("").to_owned(),
            other => panic!("{op}: {other:?}"),
        };
        assert_eq!(first, "corrupt_state", "{op}: {r:?}");
    }
    assert_eq!(server.conn().cmd(&["DUMP", &key]), before);
}

//! A lease record larger than any script writes (planted by a user with raw
//! hash writes, as a tenant's Valkey user may) is refused as corrupt before
//! the scripts scan it, and left as it is.

use std::time::Duration;

use super::protocol::store;
use crate::support::valkey_server::ValkeyServer;
use targetlease::store::{LeaseStore, Outcome, Target};

#[tokio::test]
async fn a_planted_record_larger_than_any_script_writes_is_corrupt_and_untouched() {
    let server = ValkeyServer::start();
    let s = store(&server).await;
    let t = Target::new("ns", "planted");
    let key = s.keys().target(&t);
    let far = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 600_000)
        .to_string();
    server.conn().cmd(&["HSET", &key, "fence", "1"]);
    // A well-formed record (token 1, owner "o") with `metadata` as its JSON.
    let plant = |metadata: &str| {
        let record = format!("1:1:1:{far}::{}:1:o{metadata}", "0".repeat(40));
        server.conn().cmd(&[
            "HSETEX", &key, "PXAT", &far, "FIELDS", "1", "lease", &record,
        ]);
    };
    // Small metadata: a live lease, so the refusal below is the size.
    plant(r#"{"note":"small"}"#);
    assert_eq!(s.get(&t).await.unwrap().outcome, Outcome::Found);
    // One megabyte of well-formed JSON: more than a client ever sends.
    plant(&format!(r#"{{"note":"{}"}}"#, "n".repeat(1 << 20)));
    let before = server.conn().cmd(&["DUMP", &key]);
    for _ in 0..3 {
        let got = s.get(&t).await.unwrap();
        assert_eq!(got.outcome, Outcome::CorruptState, "{got:?}");
        assert!(
            got.message.contains("larger than any a script writes"),
            "{got:?}"
        );
    }
    // The acquire that finds it refuses too, and writes nothing.
    let acquired = s
        .acquire(&targetlease::store::AcquireRequest::new(
            t.clone(),
            "other",
            Duration::from_secs(30),
        ))
        .await
        .unwrap();
    assert_eq!(acquired.outcome, Outcome::CorruptState, "{acquired:?}");
    assert_eq!(server.conn().cmd(&["DUMP", &key]), before);
}

/// A caller with FCALL (any tenant's user) but not the client: acquire
/// refuses an owner or metadata past the client's limits, and metadata that
/// is not a JSON object, with an error that says why and nothing written;
/// metadata at the limit is granted and reads back whole.
#[tokio::test]
async fn acquire_refuses_a_raw_callers_oversized_metadata_and_writes_nothing() {
    use crate::support::resp::Resp;
    use targetlease::store::MAX_METADATA_BYTES;
    use targetlease::store::valkey::keys::request_field;
    use targetlease::store::valkey::scripts::SCRIPTS;

    let server = ValkeyServer::start();
    let s = store(&server).await; // loads the lease functions
    let t = Target::new("ns", "raw");
    let key = s.keys().target(&t);
    let function = SCRIPTS.acquire.function.clone();
    // `{"n":"…"}` of exactly `bytes` bytes.
    let meta_of = |bytes: usize| format!(r#"{{"n":"{}"}}"#, "x".repeat(bytes - 8));
    let fcall = |owner: &str, meta: &str| {
        let field = request_field("acquire", owner, "raw-1");
        server.conn().cmd(&[
            "FCALL",
            &function,
            "1",
            &key,
            owner,
            "30000",
            "0",
            "raw-lease-id",
            meta,
            "0",
            "0",
            &field,
        ])
    };
    let cases = [
        (
            "a",
            meta_of(MAX_METADATA_BYTES + 1),
            format!(
                "metadata is {} bytes; at most {MAX_METADATA_BYTES} are allowed",
                MAX_METADATA_BYTES + 1
            ),
        ),
        (
            "a",
            meta_of(1 << 20),
            "metadata is 1048576 bytes".to_string(),
        ),
        (
            "a",
            "not json".to_string(),
            "metadata is not a JSON object".to_string(),
        ),
        (
            &*"o".repeat(257),
            String::new(),
            "owner is 257 bytes; at most 256".to_string(),
        ),
    ];
    for (owner, meta, why) in &cases {
        match fcall(owner, meta) {
            Resp::Error(e) => assert!(e.contains(why), "{e} (expected {why})"),
            other => panic!("{} bytes of metadata were accepted: {other:?}", meta.len()),
        }
        assert_eq!(
            server.conn().cmd(&["EXISTS", &key]),
            Resp::Int(0),
            "nothing written"
        );
    }
    // At the limit: granted, and it reads back whole, not corrupt.
    let at_limit = meta_of(MAX_METADATA_BYTES);
    assert_eq!(at_limit.len(), MAX_METADATA_BYTES);
    match fcall("a", &at_limit) {
        Resp::Bulk(Some(reply)) => assert!(reply.starts_with("acquired\0"), "{reply:?}"),
        other => panic!("metadata at the limit refused: {other:?}"),
    }
    let got = s.get(&t).await.unwrap();
    assert_eq!(got.outcome, Outcome::Found, "{got:?}");
    let lease = got.lease.unwrap();
    assert_eq!(
        serde_json::to_string(&lease.metadata).unwrap().len(),
        MAX_METADATA_BYTES,
        "{lease:?}"
    );
}

/// A raw caller's lease id with a NUL byte (the client never sends one) is
/// refused by every script that would echo it, before anything is written:
/// in the one-string reply a NUL would split the fields, and the decoder
/// would read a wrong token instead of failing.
#[tokio::test]
async fn a_lease_id_holding_a_nul_is_refused_before_anything_is_written() {
    use crate::support::resp::Resp;
    use targetlease::store::valkey::keys::request_field;
    use targetlease::store::valkey::scripts::SCRIPTS;

    let server = ValkeyServer::start();
    let s = store(&server).await; // loads the lease functions
    let t = Target::new("ns", "nul-id");
    let key = s.keys().target(&t);
    let id = "id-part\u{0}5";
    let acquire = server.conn().cmd(&[
        "FCALL",
        &SCRIPTS.acquire.function,
        "1",
        &key,
        "alice",
        "30000",
        "0",
        id,
        "",
        "0",
        "60000",
        &request_field("acquire", "alice", "nul-1"),
    ]);
    assert!(
        matches!(&acquire, Resp::Error(e) if e.contains("lease id holds a NUL byte")),
        "{acquire:?}"
    );
    assert_eq!(
        server.conn().cmd(&["EXISTS", &key]),
        Resp::Int(0),
        "nothing written"
    );

    // Renew and release of a live lease with that id (as if an older
    // version had granted it) are refused too, and change nothing.
    let held = s
        .acquire(&super::protocol::acquire(&t, "alice"))
        .await
        .unwrap();
    let token = held.lease.unwrap().fencing_token.to_string();
    let before = server.conn().cmd(&["DUMP", &key]);
    let renew = server.conn().cmd(&[
        "FCALL",
        &SCRIPTS.renew.function,
        "1",
        &key,
        "alice",
        id,
        &token,
        "30000",
        "60000",
        &request_field("renew", "alice", "nul-2"),
        "0",
    ]);
    let release = server.conn().cmd(&[
        "FCALL",
        &SCRIPTS.release.function,
        "1",
        &key,
        "alice",
        id,
        &token,
        "60000",
        &request_field("release", "alice", "nul-3"),
    ]);
    for (op, r) in [("renew", renew), ("release", release)] {
        assert!(
            matches!(&r, Resp::Error(e) if e.contains("lease id holds a NUL byte")),
            "{op}: {r:?}"
        );
    }
    assert_eq!(
        server.conn().cmd(&["DUMP", &key]),
        before,
        "nothing changed"
    );
}

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

//! `list` over a namespace larger than one etcd answer may be: the client
//! takes answers of at most 4 MiB, so a namespace whose records outgrow
//! that must be read in pages (at one revision), not refused.

use etcd_client::{Client, Txn, TxnOp};
use targetlease::store::LeaseStore;
use targetlease::store::etcd::{EtcdConfig, EtcdStore};

use crate::cases::target;
use crate::etcd_cluster::EtcdCluster;

/// Records written, each [`RECORD_BYTES`] long: 6 MB in all.
const RECORDS: usize = 6000;
const RECORD_BYTES: usize = 1000;
/// Writes per transaction (etcd allows 128).
const PER_TXN: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_reads_a_namespace_larger_than_one_answer() {
    let cluster = tokio::task::spawn_blocking(EtcdCluster::start)
        .await
        .expect("start the etcd cluster");
    // Every page of the listing shares one deadline: a loaded machine
    // needs more than the default 2 s for 6 MB.
    let store = EtcdStore::connect(&EtcdConfig {
        url: cluster.url(),
        timeout: std::time::Duration::from_secs(10),
        ..EtcdConfig::default()
    })
    .await
    .expect("connect");
    let raw = Client::connect(cluster.endpoints(), None)
        .await
        .expect("raw etcd client");
    // Records no request wrote (unreadable, so each is listed as corrupt):
    // their size is what matters here.
    let value = vec![b'x'; RECORD_BYTES];
    let keys: Vec<String> = (0..RECORDS)
        .map(|i| store.keys().lease(&target(&format!("big-{i:05}"))))
        .collect();
    for chunk in keys.chunks(PER_TXN) {
        let puts: Vec<TxnOp> = chunk
            .iter()
            .map(|k| TxnOp::put(k.as_str(), value.clone(), None))
            .collect();
        raw.kv_client()
            .txn(Txn::new().and_then(puts))
            .await
            .expect("write the records");
    }
    let listed = store
        .list(Some("contract"), "big-")
        .await
        .expect("list a namespace of 6 MB of records");
    assert_eq!(listed.len(), RECORDS, "every record is listed once");
    let mut names: Vec<&str> = listed.iter().map(|l| l.target.name.as_str()).collect();
    names.dedup();
    assert_eq!(
        names.len(),
        RECORDS,
        "every record is listed once, in order"
    );
}

//! The contract over a real 3-member etcd cluster, through [`EtcdStore`].
//!
//! etcd lease TTLs are whole seconds with a minimum of ⌈1.5 × election
//! timeout⌉ (1 s here), and expired leases are revoked on a 500 ms ticker:
//! a short lease is 1 s and gone within 3 s. Every other assertion is the
//! suite's own.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, GetOptions, PutOptions};
use targetlease::store::etcd::{EtcdConfig, EtcdStore};
use targetlease::store::{LeaseHandle, LeaseStore, Target};

use crate::etcd_cluster::EtcdCluster;
use crate::{Corruption, Harness};

/// A private etcd cluster per test, a store on it, and a raw client for
/// breaking and inspecting state.
pub struct EtcdHarness {
    _cluster: EtcdCluster,
    store: Arc<EtcdStore>,
    config: EtcdConfig,
    raw: Client,
}

impl EtcdHarness {
    pub async fn new() -> Self {
        let cluster = tokio::task::spawn_blocking(EtcdCluster::start)
            .await
            .expect("start the etcd cluster");
        // The suite tests decisions, not deadlines: 10 s, not the default
        // 2 s, so that 100 clients connecting and contending on a loaded
        // 2-core machine (the test lanes run at once) are answered rather
        // than timed out.
        let config = EtcdConfig {
            url: cluster.url(),
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            ..EtcdConfig::default()
        };
        let store = Arc::new(
            EtcdStore::connect(&config)
                .await
                .expect("connect to the etcd cluster"),
        );
        let raw = Client::connect(cluster.endpoints(), None)
            .await
            .expect("raw etcd client");
        Self {
            _cluster: cluster,
            store,
            config,
            raw,
        }
    }

    async fn lease_record(&self, target: &Target) -> (String, Vec<u8>, i64) {
        let key = self.store.keys().lease(target);
        let got = self.raw.kv_client().get(key.as_str(), None).await.unwrap();
        let kv = got.kvs().first().expect("a lease record to break");
        (key, kv.value().to_vec(), kv.lease())
    }
}

#[async_trait]
impl Harness for EtcdHarness {
    fn store(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }
    async fn another_client(&self) -> Arc<dyn LeaseStore> {
        Arc::new(
            EtcdStore::connect(&self.config)
                .await
                .expect("second connection"),
        )
    }
    async fn advance(&self, by: Duration) {
        tokio::time::sleep(by).await;
    }
    async fn corrupt(&self, target: &Target, how: Corruption, _handle: &LeaseHandle) {
        let (key, value, lease) = self.lease_record(target).await;
        assert_ne!(lease, 0, "a lease record lives on an etcd lease");
        let mut kv = self.raw.kv_client();
        let keep_lease = Some(PutOptions::new().with_ignore_lease());
        match how {
            Corruption::NoExpiry => {
                kv.put(key.as_str(), value, None).await.unwrap();
            }
            Corruption::UnknownVersion => {
                let mut doc: serde_json::Value = serde_json::from_slice(&value).unwrap();
                assert_eq!(doc["v"], 1, "a version 1 record");
                doc["v"] = 99.into();
                let other = serde_json::to_vec(&doc).unwrap();
                kv.put(key.as_str(), other, keep_lease).await.unwrap();
            }
            Corruption::Garbage => {
                kv.put(key.as_str(), "\u{1}not a lease", keep_lease)
                    .await
                    .unwrap();
            }
        }
    }
    async fn lose_counter(&self, target: &Target) {
        let keys = self.store.keys();
        let mut kv = self.raw.kv_client();
        for key in [keys.fence(target), keys.lease(target)] {
            kv.delete(key.as_str(), None).await.unwrap();
        }
    }
    async fn snapshot(&self, target: &Target) -> String {
        let mut out = String::new();
        let mut kv = self.raw.kv_client();
        for (i, key) in self.store.keys().target_keys(target).iter().enumerate() {
            // The first two are exact keys, the others prefixes.
            let opts = (i >= 2).then(|| GetOptions::new().with_prefix());
            for kv in kv.get(key.as_str(), opts).await.unwrap().kvs() {
                out.push_str(&format!(
                    "{}={:?} rev={} on_lease={}\n",
                    String::from_utf8_lossy(kv.key()),
                    String::from_utf8_lossy(kv.value()),
                    kv.mod_revision(),
                    kv.lease() != 0
                ));
            }
        }
        out
    }
    fn short(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn past_short(&self) -> Duration {
        Duration::from_secs(3)
    }
    fn announces_expiry(&self) -> bool {
        true
    }
}

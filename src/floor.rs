//! The durable token floor: tokens never go backwards, even if Valkey forgets.
//!
//! Valkey can lose a fence counter (failover before replication, a restart
//! without AOF, a flush). Every token the operator publishes stays visible in
//! the Kubernetes API: in the status of the TargetLease that holds it, and —
//! once that resource is deleted — in a floor ConfigMap in the operator's
//! namespace, raised by the finalizer before anything is released. An acquire
//! asks the store for a token above the highest of those.
//!
//! Floors are sharded over [`BUCKETS`] ConfigMaps `<name>-<bucket>` by a hash
//! of (namespace, target), read from a watch cache, and pruned of targets a
//! live TargetLease's status already covers whenever a bucket is written.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};

/// Number of floor ConfigMaps; ~20 KB each at 20,000 deleted targets.
pub const BUCKETS: u8 = 64;
/// Label on every floor ConfigMap (the watch selects on it).
pub const FLOOR_LABEL: &str = "targetlease.dev/token-floors";

/// The ConfigMap key of a (namespace, target): a hash, since targets may hold any character.
pub fn floor_key(namespace: &str, target: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{namespace}\u{0}{target}").as_bytes(),
    );
    let hex: String = digest.as_ref()[..20]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("t-{hex}")
}

fn bucket_of(key: &str) -> u8 {
    // Keys are "t-" + hex: two hex digits pick the bucket.
    u8::from_str_radix(key.get(2..4).unwrap_or("00"), 16).unwrap_or(0) % BUCKETS
}

/// Where deleted leases leave their last token.
pub struct FloorStore {
    api: Api<ConfigMap>,
    name: String,
    cache: Store<ConfigMap>,
    /// Floors this process raised (the cache may not show them yet).
    raised: Mutex<HashMap<String, u64>>,
}

/// What the floor ConfigMaps hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FloorFigures {
    /// ConfigMaps.
    pub objects: usize,
    /// Entries.
    pub entries: usize,
    /// Bytes of keys and values.
    pub bytes: usize,
    /// Bytes of keys and values of the largest ConfigMap.
    pub largest_bytes: usize,
}

impl FloorStore {
    /// Floors in ConfigMaps `<name>-<bucket>` of `namespace`, read through `cache`
    /// (a reflector over ConfigMaps labelled [`FLOOR_LABEL`] in that namespace).
    pub fn new(client: kube::Client, namespace: &str, name: &str, cache: Store<ConfigMap>) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            cache,
            raised: Mutex::new(HashMap::new()),
        }
    }

    /// The label selector of the floor ConfigMaps.
    pub fn selector(name: &str) -> String {
        format!("{FLOOR_LABEL}={name}")
    }

    fn bucket_name(&self, key: &str) -> String {
        format!("{}-{:02x}", self.name, bucket_of(key))
    }

    /// The recorded floor of a target (0 when none), from the cache and this
    /// process's own raises.
    pub fn get(&self, namespace: &str, target: &str) -> u64 {
        let key = floor_key(namespace, target);
        let ns = self.api.namespace().unwrap_or_default().to_owned();
        let cached = self
            .cache
            .get(&ObjectRef::new(&self.bucket_name(&key)).within(&ns))
            .and_then(|cm| cm.data.as_ref()?.get(&key)?.parse().ok())
            .unwrap_or(0);
        let raised = self.lock().get(&key).copied().unwrap_or(0);
        cached.max(raised)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.raised.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Raises a target's floor to at least `token`, and drops from the same
    /// bucket every entry `covered` (floor key → highest token in the status of
    /// a live TargetLease) makes redundant. Optimistic concurrency, retried.
    pub async fn raise(
        &self,
        namespace: &str,
        target: &str,
        token: u64,
        covered: &HashMap<String, u64>,
    ) -> Result<(), kube::Error> {
        let key = floor_key(namespace, target);
        let name = self.bucket_name(&key);
        for _ in 0..10 {
            let existing = self.api.get_opt(&name).await?;
            let mut data = existing
                .as_ref()
                .and_then(|cm| cm.data.clone())
                .unwrap_or_default();
            let current: u64 = data.get(&key).and_then(|v| v.parse().ok()).unwrap_or(0);
            if current >= token {
                self.remember(&key, current);
                return Ok(());
            }
            data.insert(key.clone(), token.to_string());
            data.retain(|k, v| {
                *k == key
                    || !covered
                        .get(k)
                        .is_some_and(|live| v.parse::<u64>().is_ok_and(|floor| *live >= floor))
            });
            let result = match existing {
                None => {
                    let cm = self.config_map(&name, data, None);
                    self.api
                        .create(&PostParams::default(), &cm)
                        .await
                        .map(|_| ())
                }
                Some(cm) => {
                    let cm = self.config_map(&name, data, cm.metadata.resource_version);
                    self.api
                        .replace(&name, &PostParams::default(), &cm)
                        .await
                        .map(|_| ())
                }
            };
            match result {
                Ok(()) => {
                    self.remember(&key, token);
                    return Ok(());
                }
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(e),
            }
        }
        Err(kube::Error::Api(
            kube::core::Status::failure("too many conflicts raising the token floor", "Conflict")
                .with_code(409)
                .boxed(),
        ))
    }

    fn remember(&self, key: &str, token: u64) {
        let mut raised = self.lock();
        let slot = raised.entry(key.to_owned()).or_default();
        *slot = (*slot).max(token);
    }

    fn config_map(
        &self,
        name: &str,
        data: BTreeMap<String, String>,
        rv: Option<String>,
    ) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                resource_version: rv,
                labels: Some(BTreeMap::from([
                    (FLOOR_LABEL.to_owned(), self.name.clone()),
                    (
                        "app.kubernetes.io/managed-by".to_owned(),
                        "targetlease".to_owned(),
                    ),
                ])),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        }
    }

    /// Moves the floors of the single ConfigMap `<name>` used before sharding
    /// into the buckets, then deletes it. Runs once when leadership starts.
    pub async fn migrate_unsharded(&self) -> Result<usize, kube::Error> {
        let Some(old) = self.api.get_opt(&self.name).await? else {
            return Ok(0);
        };
        let entries = old.data.clone().unwrap_or_default();
        let mut by_bucket: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
        for (key, value) in &entries {
            if let Ok(token) = value.parse::<u64>() {
                by_bucket
                    .entry(self.bucket_name(key))
                    .or_default()
                    .push((key.clone(), token));
            }
        }
        for (name, floors) in by_bucket {
            self.merge(&name, &floors).await?;
        }
        self.api
            .delete(&self.name, &DeleteParams::default())
            .await?;
        Ok(entries.len())
    }

    async fn merge(&self, name: &str, floors: &[(String, u64)]) -> Result<(), kube::Error> {
        for _ in 0..10 {
            let existing = self.api.get_opt(name).await?;
            let mut data = existing
                .as_ref()
                .and_then(|cm| cm.data.clone())
                .unwrap_or_default();
            for (key, token) in floors {
                let current: u64 = data.get(key).and_then(|v| v.parse().ok()).unwrap_or(0);
                data.insert(key.clone(), current.max(*token).to_string());
            }
            let rv = existing.and_then(|cm| cm.metadata.resource_version);
            let cm = self.config_map(name, data, rv.clone());
            let result = match rv {
                None => self.api.create(&PostParams::default(), &cm).await,
                Some(_) => self.api.replace(name, &PostParams::default(), &cm).await,
            };
            match result {
                Ok(_) => {
                    for (key, token) in floors {
                        self.remember(key, *token);
                    }
                    return Ok(());
                }
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(e),
            }
        }
        Err(kube::Error::Api(
            kube::core::Status::failure("too many conflicts migrating token floors", "Conflict")
                .with_code(409)
                .boxed(),
        ))
    }

    /// Objects and bytes the floor ConfigMaps hold now (from the cache).
    pub fn figures(&self) -> FloorFigures {
        figures(
            self.cache
                .state()
                .iter()
                .map(|cm| cm.data.clone().unwrap_or_default()),
        )
    }
}

/// Objects and bytes of a set of floor ConfigMaps' data.
pub fn figures(buckets: impl Iterator<Item = BTreeMap<String, String>>) -> FloorFigures {
    let mut f = FloorFigures::default();
    for data in buckets {
        let bytes: usize = data.iter().map(|(k, v)| k.len() + v.len()).sum();
        f.objects += 1;
        f.entries += data.len();
        f.bytes += bytes;
        f.largest_bytes = f.largest_bytes.max(bytes);
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_valid_configmap_keys_and_do_not_collide() {
        let a = floor_key("a:b", "c");
        let b = floor_key("a", "b:c");
        assert_ne!(a, b);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        assert_eq!(a.len(), 42);
    }

    /// The figure docs/operator.md quotes: 20,000 distinct deleted targets with
    /// tokens in the millions spread over the buckets, far below the 1 MiB
    /// object limit.
    #[test]
    fn twenty_thousand_targets_fit_comfortably() {
        let mut buckets: BTreeMap<u8, BTreeMap<String, String>> = BTreeMap::new();
        for i in 0..20_000u64 {
            let key = floor_key("team-a", &format!("orders-shard-{i}"));
            buckets
                .entry(bucket_of(&key))
                .or_default()
                .insert(key, (1_000_000 + i).to_string());
        }
        let f = figures(buckets.into_values());
        assert_eq!(f.objects, BUCKETS as usize);
        assert_eq!(f.entries, 20_000);
        assert!(f.largest_bytes < 24 * 1024, "{f:?}");
        println!("floors at 20,000 targets: {f:?}");
    }
}

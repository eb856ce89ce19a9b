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
//! of (namespace, target) and read from a watch cache. A write only ever
//! raises floors ([`bucket`]): entries are never dropped, and a bucket that
//! outgrows [`MAX_BUCKET_BYTES`] folds its lowest entries into a bucket-wide
//! base, so no bucket nears the object size limit and no floor is lowered.

pub mod bucket;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};

/// Number of floor ConfigMaps; ~20 KB each at 20,000 deleted targets.
pub const BUCKETS: u8 = 64;
/// Label on every floor ConfigMap (the watch selects on it).
pub const FLOOR_LABEL: &str = "targetlease.dev/token-floors";
/// Bytes of keys and values a bucket may hold before its lowest entries are
/// folded into its base: about 5,000 targets, a quarter of the 1 MiB limit.
pub const MAX_BUCKET_BYTES: usize = 256 * 1024;

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

/// The bucket of a floor key (keys are "t-" + hex: two hex digits pick it).
pub fn bucket_of(key: &str) -> u8 {
    u8::from_str_radix(key.get(2..4).unwrap_or("00"), 16).unwrap_or(0) % BUCKETS
}

/// Where deleted leases leave their last token.
pub struct FloorStore {
    api: Api<ConfigMap>,
    name: String,
    cache: Store<ConfigMap>,
    max_bucket_bytes: usize,
    /// Floors this process raised that the cache did not show yet.
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
            max_bucket_bytes: MAX_BUCKET_BYTES,
            raised: Mutex::new(HashMap::new()),
        }
    }

    /// The same store with another byte budget per bucket (see [`bucket::compact`]).
    pub fn with_max_bucket_bytes(mut self, max: usize) -> Self {
        self.max_bucket_bytes = max;
        self
    }

    /// The label selector of the floor ConfigMaps.
    pub fn selector(name: &str) -> String {
        format!("{FLOOR_LABEL}={name}")
    }

    /// The name of the ConfigMap holding `key`.
    pub fn bucket_name(&self, key: &str) -> String {
        format!("{}-{:02x}", self.name, bucket_of(key))
    }

    /// The recorded floor of a target (0 when none), from the cache and this
    /// process's own raises. Floors never decrease from one version of a
    /// bucket to the next, so once the cache shows a raise it always will:
    /// the raise is forgotten then.
    pub fn get(&self, namespace: &str, target: &str) -> u64 {
        let key = floor_key(namespace, target);
        let cached = self.cached(&key);
        let mut raised = self.lock();
        match raised.get(&key).copied() {
            Some(r) if r > cached => r,
            Some(_) => {
                raised.remove(&key);
                cached
            }
            None => cached,
        }
    }

    /// The floor of `key` as the cache shows it (0 when it shows none).
    fn cached(&self, key: &str) -> u64 {
        let ns = self.api.namespace().unwrap_or_default();
        self.cache
            .get(&ObjectRef::new(&self.bucket_name(key)).within(ns))
            .and_then(|cm| cm.data.as_ref().map(|d| bucket::floor_in(d, key)))
            .unwrap_or(0)
    }

    /// Forgets every raise of this process that the cache shows now (floors
    /// never decrease from one version of a bucket to the next, so the cache
    /// will always show it); a raise the cache does not show yet stays.
    /// Returns how many stay. Without this, the raises of targets never asked
    /// for again would be kept until the process ends.
    pub fn prune(&self) -> usize {
        let mut raised = self.lock();
        raised.retain(|key, r| self.cached(key) < *r);
        raised.len()
    }

    /// Raises in this process that the cache does not show yet.
    pub fn pending(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.raised.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Raises a target's floor to at least `token`. Read, raise and write
    /// under the version read; a conflict reads again. No other entry is
    /// lowered or dropped (a full bucket folds entries into its base).
    pub async fn raise(
        &self,
        namespace: &str,
        target: &str,
        token: u64,
    ) -> Result<(), kube::Error> {
        let key = floor_key(namespace, target);
        let name = self.bucket_name(&key);
        self.merge(&name, &[(key, token)]).await
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

    /// Raises every floor of `floors` (all in bucket `name`) in one write.
    async fn merge(&self, name: &str, floors: &[(String, u64)]) -> Result<(), kube::Error> {
        for _ in 0..10 {
            let existing = self.api.get_opt(name).await?;
            let data = existing
                .as_ref()
                .and_then(|cm| cm.data.clone())
                .unwrap_or_default();
            let Some(next) = bucket::raised(&data, floors, self.max_bucket_bytes) else {
                for (key, _) in floors {
                    self.remember(key, bucket::floor_in(&data, key));
                }
                return Ok(());
            };
            let rv = existing.and_then(|cm| cm.metadata.resource_version);
            let cm = self.config_map(name, next, rv.clone());
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
                // Another writer went first: raise again on top of what it wrote.
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(e),
            }
        }
        Err(kube::Error::Api(
            kube::core::Status::failure("too many conflicts raising token floors", "Conflict")
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
    use kube::runtime::{reflector, watcher};

    /// A floor store on a cache the test writes, whose client reaches no
    /// API server (pruning reads only the cache).
    fn on_cache(ns: &str) -> (FloorStore, reflector::store::Writer<ConfigMap>) {
        let svc = tower::service_fn(|req: http::Request<kube::client::Body>| async move {
            let refused = format!("no API server here: {} {}", req.method(), req.uri());
            Err::<http::Response<kube::client::Body>, _>(std::io::Error::other(refused))
        });
        let client = kube::Client::new(svc, ns);
        let (cache, writer) = reflector::store();
        (FloorStore::new(client, ns, "floors", cache), writer)
    }

    fn bucket(store: &FloorStore, ns: &str, name: &str, data: &[(&str, u64)]) -> ConfigMap {
        let data = data.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        let mut cm = store.config_map(name, data.collect(), Some("1".into()));
        cm.metadata.namespace = Some(ns.into());
        cm
    }

    /// Raises are forgotten once the cache shows them (the entry or the
    /// bucket's base at least as high), never before.
    #[tokio::test]
    async fn raises_are_pruned_once_the_cache_shows_them_and_never_before() {
        let (store, mut writer) = on_cache("ops");
        let (a, b) = (floor_key("team", "a"), floor_key("team", "b"));
        store.remember(&a, 5);
        store.remember(&b, 7);
        assert_eq!(store.prune(), 2, "the cache shows neither yet");
        assert_eq!((store.get("team", "a"), store.get("team", "b")), (5, 7));

        // The cache shows a's raise, and b's entry lower than this process raised it.
        let (name_a, name_b) = (store.bucket_name(&a), store.bucket_name(&b));
        let mut seen = vec![(a.as_str(), 5), (b.as_str(), 6)];
        if name_a != name_b {
            let cm = bucket(&store, "ops", &name_b, &seen[1..]);
            writer.apply_watcher_event(&watcher::Event::Apply(cm));
            seen.truncate(1);
        }
        writer.apply_watcher_event(&watcher::Event::Apply(bucket(
            &store, "ops", &name_a, &seen,
        )));
        assert_eq!(store.prune(), 1, "only b's raise is still pending");
        assert_eq!(store.get("team", "a"), 5, "now from the cache");
        assert_eq!(store.get("team", "b"), 7, "never the lower cached 6");

        // A base that covers b counts as showing it.
        let cm = bucket(&store, "ops", &name_b, &[(bucket::BASE_KEY, 9)]);
        writer.apply_watcher_event(&watcher::Event::Apply(cm));
        assert_eq!(store.prune(), 0);
        assert_eq!(store.get("team", "b"), 9);
    }

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

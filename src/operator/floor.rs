//! The durable token floor: tokens never go backwards, even if Valkey forgets.
//!
//! Valkey can lose a fence counter (failover before replication, a restart
//! without AOF, a flush). Every token the operator publishes stays visible in
//! the Kubernetes API: in the status of the TargetLease that holds it, and —
//! once that resource is deleted — in a floor ConfigMap in the operator's
//! namespace, raised by the finalizer before anything is released. An acquire
//! asks the store for a token above the highest of those.
//!
//! Each tenant namespace has a ConfigMap of its own, `<name>.<namespace>`
//! ([`FloorStore::config_map_name`]), read from a watch cache: one
//! namespace's deletions never write, grow or fold another's floors. A
//! write only ever raises floors ([`ledger`]); a namespace holds at most
//! [`FloorPolicy::max_entries`] entries (a raise past it folds the oldest
//! into the namespace's own base), and entries of targets nobody used for
//! [`FloorPolicy::retention`] are folded the same way ([`FloorStore::expire`]).
//!
//! Raises of one namespace that arrive together share one write (a group
//! commit, [`FloorStore::raise`]): with every raise its own read and
//! conditional write, concurrent deletions in one namespace conflicted on
//! its ConfigMap and retried, and a mass deletion went at a few per second.

pub mod ledger;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};

pub use ledger::Fold;

/// Label on every floor ConfigMap (the watch selects on it); its value is the
/// name the ConfigMaps' names start with.
pub const FLOOR_LABEL: &str = "targetlease.dev/token-floors";
/// The largest per-namespace cap the operator accepts: at the longest keys,
/// tokens and times, a namespace's ConfigMap then holds about 640 KiB, below
/// the API server's 1 MiB object limit.
pub const MAX_ENTRIES_LIMIT: usize = 8_000;

/// How many floors a namespace keeps, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FloorPolicy {
    /// Entries a namespace's ConfigMap holds at most; a raise that would
    /// pass it first folds the oldest quarter into the namespace's base.
    pub max_entries: usize,
    /// An entry raised this long ago whose target no TargetLease names is
    /// folded into the namespace's base.
    pub retention: Duration,
}

impl Default for FloorPolicy {
    fn default() -> Self {
        Self {
            max_entries: 4_000,
            retention: Duration::from_secs(30 * 86_400),
        }
    }
}

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

/// Where deleted leases leave their last token.
pub struct FloorStore {
    api: Api<ConfigMap>,
    name: String,
    cache: Store<ConfigMap>,
    policy: FloorPolicy,
    /// Floors this process raised that the cache did not show yet, by
    /// (namespace, key).
    raised: Mutex<HashMap<(String, String), u64>>,
    /// Raises waiting for their namespace's next write, by namespace.
    batches: Mutex<HashMap<String, Arc<Batch>>>,
}

/// One namespace's raises not written yet, and the turn to write them.
#[derive(Default)]
struct Batch {
    waiting: Mutex<Waiting>,
    /// Held by the one raise writing for all (the others wait on it).
    writer: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Waiting {
    /// The highest token asked for each key, not written yet.
    floors: BTreeMap<String, u64>,
    /// Tickets handed out (each raise takes the next) and the highest one
    /// a write has covered: every raise whose ticket is at most `written`
    /// is in the ConfigMap.
    issued: u64,
    written: u64,
    /// The highest ticket a failed write carried, and why it failed: the
    /// raises it carried fail at once with it (each retries later, with its
    /// reconcile's backoff) instead of each trying again in turn — against
    /// an API server that times out, one after another, they would hold
    /// every reconcile slot for minutes. Not when the write was refused for
    /// want of leadership (the gate refuses each at once anyway).
    failed: Option<(u64, String)>,
}

/// What the floor ConfigMaps hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FloorFigures {
    /// ConfigMaps (namespaces with floors).
    pub objects: usize,
    /// Entries.
    pub entries: usize,
    /// Bytes of keys and values.
    pub bytes: usize,
    /// Bytes of keys and values of the largest ConfigMap.
    pub largest_bytes: usize,
}

impl FloorStore {
    /// Floors in ConfigMaps `<name>.<tenant namespace>` of `namespace`, read
    /// through `cache` (a reflector over ConfigMaps labelled [`FLOOR_LABEL`]
    /// in that namespace), with the default [`FloorPolicy`].
    pub fn new(client: kube::Client, namespace: &str, name: &str, cache: Store<ConfigMap>) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            cache,
            policy: FloorPolicy::default(),
            raised: Mutex::new(HashMap::new()),
            batches: Mutex::new(HashMap::new()),
        }
    }

    /// The same store with another cap and retention.
    pub fn with_policy(mut self, policy: FloorPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The label selector of the floor ConfigMaps.
    pub fn selector(name: &str) -> String {
        format!("{FLOOR_LABEL}={name}")
    }

    /// The name of the ConfigMap holding the floors of `namespace`.
    pub fn config_map_name(&self, namespace: &str) -> String {
        format!("{}.{namespace}", self.name)
    }

    /// The tenant namespace a floor ConfigMap of this store belongs to.
    fn tenant_of(&self, cm: &ConfigMap) -> Option<String> {
        let name = cm.metadata.name.as_deref()?;
        let ns = name.strip_prefix(&self.name)?.strip_prefix('.')?;
        (!ns.is_empty()).then(|| ns.to_owned())
    }

    /// The recorded floor of a target (0 when none), from the cache and this
    /// process's own raises. Floors never decrease from one version of a
    /// ConfigMap to the next, so once the cache shows a raise it always will:
    /// the raise is forgotten then.
    pub fn get(&self, namespace: &str, target: &str) -> u64 {
        let slot = (namespace.to_owned(), floor_key(namespace, target));
        let cached = self.cached(&slot.0, &slot.1);
        let mut raised = self.lock();
        match raised.get(&slot).copied() {
            Some(r) if r > cached => r,
            Some(_) => {
                raised.remove(&slot);
                cached
            }
            None => cached,
        }
    }

    /// The floor of `key` in `namespace` as the cache shows it (0 when it shows none).
    fn cached(&self, namespace: &str, key: &str) -> u64 {
        self.cached_data(namespace)
            .map_or(0, |d| ledger::floor_in(&d, key))
    }

    fn cached_data(&self, namespace: &str) -> Option<BTreeMap<String, String>> {
        let ns = self.api.namespace().unwrap_or_default();
        let name = self.config_map_name(namespace);
        self.cache
            .get(&ObjectRef::new(&name).within(ns))
            .map(|cm| cm.data.clone().unwrap_or_default())
    }

    /// Forgets every raise of this process that the cache shows now (floors
    /// never decrease from one version of a ConfigMap to the next, so the
    /// cache will always show it); a raise the cache does not show yet stays.
    /// Returns how many stay. Without this, the raises of targets never asked
    /// for again would be kept until the process ends.
    pub fn prune(&self) -> usize {
        let mut raised = self.lock();
        raised.retain(|(ns, key), r| self.cached(ns, key) < *r);
        raised.len()
    }

    /// Raises in this process that the cache does not show yet.
    pub fn pending(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), u64>> {
        self.raised.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Raises a target's floor to at least `token`, in its namespace's
    /// ConfigMap only, and returns once a write holds it. Read, raise and
    /// write under the version read; a conflict reads again. No floor is
    /// lowered; when the namespace would pass its cap, its oldest entries
    /// are folded into its base first, and what was folded is returned (the
    /// caller says so to the user) to the raise that wrote.
    ///
    /// Raises of one namespace that arrive while a write is under way wait
    /// for it to end; then one of them writes every floor waiting, and the
    /// others find theirs written. A write that fails puts its floors back
    /// for the next raise to write, and fails every raise it carried.
    pub async fn raise(
        &self,
        namespace: &str,
        target: &str,
        token: u64,
    ) -> Result<Option<Fold>, kube::Error> {
        let key = floor_key(namespace, target);
        let batch = self.batch(namespace);
        let ticket = {
            let mut w = batch.waiting();
            let floor = w.floors.entry(key.clone()).or_default();
            *floor = (*floor).max(token);
            w.issued += 1;
            w.issued
        };
        let turn = batch.writer.lock().await;
        let (floors, through) = {
            let mut w = batch.waiting();
            if w.written >= ticket {
                return Ok(None); // written by the raise that went before
            }
            if let Some((failed, why)) = &w.failed
                && *failed >= ticket
            {
                return Err(carried_by_failed_write(why));
            }
            (std::mem::take(&mut w.floors), w.issued)
        };
        let listed: Vec<(String, u64)> = floors.iter().map(|(k, t)| (k.clone(), *t)).collect();
        // Until the write succeeds the floors are only lent: on an error, or
        // if this raise is dropped mid-write, they go back for the next one
        // (else a later raise could find its ticket "written" without them),
        // and before the turn is let go (`Lent` holds it).
        let mut lent = Lent {
            batch: &batch,
            floors: Some(floors),
            _turn: turn,
        };
        let max = self.policy.max_entries;
        let wrote = match self
            .merge(namespace, |data| ledger::raised(data, &listed, now(), max))
            .await
        {
            Ok(wrote) => wrote,
            Err(e) => {
                if !caused_by_not_leader(&e) {
                    batch.waiting().failed = Some((through, e.to_string()));
                }
                return Err(e);
            }
        };
        let floors = lent.floors.take().unwrap_or_default();
        batch.waiting().written = through;
        let mut raised = self.lock();
        for (k, t) in &floors {
            let floor = raised.entry((namespace.to_owned(), k.clone())).or_default();
            *floor = (*floor).max(match &wrote {
                Wrote::Changed(_) => *t,
                Wrote::Unchanged(data) => ledger::floor_in(data, k),
            });
        }
        Ok(match wrote {
            Wrote::Changed(folded) => folded,
            Wrote::Unchanged(_) => None,
        })
    }

    /// The raises of `namespace` waiting for a write, and its turn to write.
    fn batch(&self, namespace: &str) -> Arc<Batch> {
        let mut all = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        all.entry(namespace.to_owned()).or_default().clone()
    }

    /// Folds the entries raised [`FloorPolicy::retention`] ago or earlier
    /// whose target is not `in_use` (by (namespace, key); a TargetLease
    /// names it) into their namespace's base, one write per namespace that
    /// has any. Returns what was folded in each; stops at the first error.
    pub async fn expire(
        &self,
        in_use: &HashSet<(String, String)>,
    ) -> Result<Vec<(String, Fold)>, kube::Error> {
        let retention = i64::try_from(self.policy.retention.as_secs()).unwrap_or(i64::MAX);
        let mut folds = Vec::new();
        for cm in self.cache.state() {
            let Some(ns) = self.tenant_of(&cm) else {
                continue;
            };
            let expire = |data: &BTreeMap<String, String>| {
                ledger::expired(data, now(), retention, |key| {
                    in_use.contains(&(ns.clone(), key.to_owned()))
                })
            };
            // The cache is a safe shortcut: entries only get younger.
            if expire(&cm.data.clone().unwrap_or_default()).is_none() {
                continue;
            }
            // In the namespace's turn, so raises and this never conflict.
            let batch = self.batch(&ns);
            let _turn = batch.writer.lock().await;
            if let Wrote::Changed(Some(fold)) = self.merge(&ns, expire).await? {
                folds.push((ns, fold));
            }
        }
        Ok(folds)
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

    /// Applies `change` to the ConfigMap of `namespace` in one write
    /// conditional on the version read; a conflict reads again.
    async fn merge(
        &self,
        namespace: &str,
        change: impl Fn(&BTreeMap<String, String>) -> Option<ledger::Change>,
    ) -> Result<Wrote, kube::Error> {
        let name = self.config_map_name(namespace);
        for _ in 0..10 {
            let existing = self.api.get_opt(&name).await?;
            let data = existing
                .as_ref()
                .and_then(|cm| cm.data.clone())
                .unwrap_or_default();
            let Some(next) = change(&data) else {
                return Ok(Wrote::Unchanged(data));
            };
            let rv = existing.and_then(|cm| cm.metadata.resource_version);
            let cm = self.config_map(&name, next.data, rv.clone());
            let result = match rv {
                None => self.api.create(&PostParams::default(), &cm).await,
                Some(_) => self.api.replace(&name, &PostParams::default(), &cm).await,
            };
            match result {
                Ok(_) => return Ok(Wrote::Changed(next.folded)),
                // Another writer went first: change again on top of what it wrote.
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
                .filter(|cm| self.tenant_of(cm).is_some())
                .map(|cm| cm.data.clone().unwrap_or_default()),
        )
    }
}

impl Batch {
    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Floors taken from a batch for a write not done yet, with the turn: the
/// floors go back in the batch when it is dropped still holding them, and
/// only then is the turn let go (fields drop after `drop` ran).
struct Lent<'a> {
    batch: &'a Batch,
    floors: Option<BTreeMap<String, u64>>,
    _turn: tokio::sync::MutexGuard<'a, ()>,
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(floors) = self.floors.take() {
            let mut w = self.batch.waiting();
            for (k, t) in floors {
                let floor = w.floors.entry(k).or_default();
                *floor = (*floor).max(t);
            }
        }
    }
}

/// Whether `e` came of this replica not leading (the write gate).
fn caused_by_not_leader(e: &kube::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.is::<crate::operator::leadership::NotLeader>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// The error of a raise whose floor a failed write carried.
fn carried_by_failed_write(why: &str) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure(
            &format!("the floor write that carried this floor failed: {why}"),
            "ServiceUnavailable",
        )
        .with_code(503)
        .boxed(),
    )
}

/// What one write did.
enum Wrote {
    /// It wrote; the entries it folded, if any.
    Changed(Option<Fold>),
    /// Nothing to change in the data it read.
    Unchanged(BTreeMap<String, String>),
}

/// The wall clock in Unix seconds: when a floor was raised. Only ages
/// entries for the cap and the retention; no floor depends on it.
fn now() -> i64 {
    Timestamp::now().as_second()
}

/// Objects and bytes of a set of floor ConfigMaps' data.
pub fn figures(namespaces: impl Iterator<Item = BTreeMap<String, String>>) -> FloorFigures {
    let mut f = FloorFigures::default();
    for data in namespaces {
        let bytes = ledger::bytes(&data);
        f.objects += 1;
        f.entries += ledger::entries(&data);
        f.bytes += bytes;
        f.largest_bytes = f.largest_bytes.max(bytes);
    }
    f
}

#[cfg(test)]
mod tests;

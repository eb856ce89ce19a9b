//! The lease protocol contract, run unchanged against every backend.
//!
//! Each case in `cases/` is generic over [`Harness`]; the `contract!` macro
//! instantiates every case once per backend, so the test names read
//! `memory::concurrent_acquires_have_exactly_one_winner`,
//! `valkey::concurrent_acquires_have_exactly_one_winner`,
//! `etcd::concurrent_acquires_have_exactly_one_winner`, and so on. The Valkey
//! runs need a real `valkey-server`, the etcd run a real 3-member etcd
//! cluster (`etcd` from the tools directory); each fails without it.

use crate::support::cluster;
use crate::support::etcd_cluster;
use crate::support::resp;
use crate::support::valkey_server;
use targetlease_test_support as support;

mod cases;
mod etcd_deadline;
mod etcd_harness;
mod etcd_list;
mod etcd_member_down;
mod etcd_silent_member;
mod etcd_watch;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use targetlease::store::memory::{ManualClock, MemoryStore};
use targetlease::store::valkey::{ValkeyConfig, ValkeyStore};
use targetlease::store::{LeaseHandle, LeaseStore, Target};

/// Ways stored state can be broken on purpose.
#[derive(Clone, Copy, Debug)]
pub enum Corruption {
    /// The lease record lost its expiry (identity fields still readable).
    NoExpiry,
    /// The record carries a version this code does not know (identity readable).
    UnknownVersion,
    /// The lease key holds something unreadable.
    Garbage,
}

/// What a backend must offer the contract suite besides the protocol itself.
#[async_trait]
pub trait Harness: Send + Sync {
    /// The store under test.
    fn store(&self) -> Arc<dyn LeaseStore>;
    /// Another client of the same state (a separate connection where that means something).
    async fn another_client(&self) -> Arc<dyn LeaseStore>;
    /// Lets `by` pass on the store's clock.
    async fn advance(&self, by: Duration);
    /// Breaks the target's lease record; `handle` is the lease it held.
    async fn corrupt(&self, target: &Target, how: Corruption, handle: &LeaseHandle);
    /// An opaque picture of the target's stored state, to prove nothing changed.
    async fn snapshot(&self, target: &Target) -> String;
    /// Loses the target's counter and lease (a flush or an unreplicated failover);
    /// committed values survive, as they would downstream.
    async fn lose_counter(&self, target: &Target);
    /// A lease ttl that ends soon: the shortest the backend really keeps.
    fn short(&self) -> Duration {
        cases::SHORT
    }
    /// How long to wait for a [`Harness::short`] lease to be gone from the
    /// backend on any machine (its own expiry mechanism included).
    fn past_short(&self) -> Duration {
        cases::PAST_SHORT
    }
    /// Whether the store announces an expiry to waiters (it sees expiry
    /// happen), not only releases and revokes.
    fn announces_expiry(&self) -> bool {
        false
    }
}

/// The reference backend with a manual clock.
pub struct MemoryHarness {
    clock: ManualClock,
    store: Arc<MemoryStore>,
}

impl MemoryHarness {
    pub async fn new() -> Self {
        let clock = ManualClock::new(1_700_000_000_000);
        let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
        Self { clock, store }
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    fn store(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }
    async fn another_client(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }
    async fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }
    async fn corrupt(&self, target: &Target, how: Corruption, handle: &LeaseHandle) {
        let readable = match how {
            Corruption::NoExpiry | Corruption::UnknownVersion => Some(handle.clone()),
            Corruption::Garbage => None,
        };
        self.store.put_corrupt_lease(target, readable);
    }
    async fn lose_counter(&self, _target: &Target) {
        self.store.forget_counters();
    }
    async fn snapshot(&self, target: &Target) -> String {
        format!(
            "{:?}",
            self.store.get(target).await.map(|r| (r.outcome, r.lease))
        )
    }
}

/// Where a Valkey harness keeps its keys: one server, or a Cluster.
pub trait Deployment: Send + Sync + Sized + 'static {
    /// Starts a private deployment (blocking).
    fn start() -> Self;
    /// The URL the store connects with.
    fn url(&self) -> String;
    /// A raw connection to the node holding `key`.
    fn conn_for(&self, key: &str) -> resp::Conn;
}

impl Deployment for valkey_server::ValkeyServer {
    fn start() -> Self {
        valkey_server::ValkeyServer::start()
    }
    fn url(&self) -> String {
        valkey_server::ValkeyServer::url(self)
    }
    fn conn_for(&self, _key: &str) -> resp::Conn {
        self.conn()
    }
}

impl Deployment for cluster::Cluster {
    fn start() -> Self {
        cluster::Cluster::start()
    }
    fn url(&self) -> String {
        cluster::Cluster::url(self)
    }
    fn conn_for(&self, key: &str) -> resp::Conn {
        cluster::Cluster::conn_for(self, key)
    }
}

/// A real Valkey deployment (`valkey-server`, or a 3-primary Cluster),
/// private to one test, through our own client.
pub struct ValkeyHarness<D> {
    deployment: D,
    store: Arc<ValkeyStore>,
    config: ValkeyConfig,
}

/// The standalone backend.
pub type StandaloneHarness = ValkeyHarness<valkey_server::ValkeyServer>;
/// The Cluster backend.
pub type ClusterHarness = ValkeyHarness<cluster::Cluster>;

impl<D: Deployment> ValkeyHarness<D> {
    pub async fn new() -> Self {
        let deployment = tokio::task::spawn_blocking(D::start)
            .await
            .expect("start the test deployment");
        let config = ValkeyConfig {
            url: deployment.url(),
            ..ValkeyConfig::default()
        };
        let store = Arc::new(
            ValkeyStore::connect(&config)
                .await
                .expect("connect to the test deployment"),
        );
        Self {
            deployment,
            store,
            config,
        }
    }

    /// The key of `target` (its lease record and counter are fields of
    /// it), and a connection to its node.
    fn key_of(&self, target: &Target) -> (String, resp::Conn) {
        let key = self.store.keys().target(target);
        let conn = self.deployment.conn_for(&key);
        (key, conn)
    }
}

#[async_trait]
impl<D: Deployment> Harness for ValkeyHarness<D> {
    fn store(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }
    async fn another_client(&self) -> Arc<dyn LeaseStore> {
        Arc::new(
            ValkeyStore::connect(&self.config)
                .await
                .expect("second connection"),
        )
    }
    async fn advance(&self, by: Duration) {
        tokio::time::sleep(by).await;
    }
    async fn corrupt(&self, target: &Target, how: Corruption, _handle: &LeaseHandle) {
        let (key, mut c) = self.key_of(target);
        let lease = || ["HGET", key.as_str(), "lease"];
        match how {
            Corruption::NoExpiry => {
                assert_eq!(
                    c.cmd(&["HPERSIST", &key, "FIELDS", "1", "lease"]).ints(),
                    [1]
                );
            }
            Corruption::UnknownVersion => {
                let record = c.cmd(&lease()).text();
                let rest = record.strip_prefix("1:").expect("a version 1 record");
                let other = format!("99:{rest}");
                c.cmd(&["HSETEX", &key, "KEEPTTL", "FIELDS", "1", "lease", &other]);
            }
            Corruption::Garbage => {
                c.cmd(&[
                    "HSETEX",
                    &key,
                    "KEEPTTL",
                    "FIELDS",
                    "1",
                    "lease",
                    "\u{1}not a lease",
                ]);
            }
        }
    }
    async fn lose_counter(&self, target: &Target) {
        let (key, mut c) = self.key_of(target);
        c.cmd(&["HDEL", &key, "lease", "fence"]);
    }
    async fn snapshot(&self, target: &Target) -> String {
        let (key, mut c) = self.key_of(target);
        let flat = c.cmd(&["HGETALL", &key]).texts();
        let mut fields: Vec<(String, String)> = flat
            .chunks(2)
            .map(|kv| (kv[0].clone().unwrap(), kv[1].clone().unwrap()))
            .collect();
        fields.sort();
        let mut out = String::new();
        for (field, value) in fields {
            let ttl = c.cmd(&["HPTTL", &key, "FIELDS", "1", &field]).ints()[0];
            // A live TTL shrinks by itself; only "none" (-1) vs "some" matters here.
            out.push_str(&format!("{field}={value:?} ttl_set={}\n", ttl >= 0));
        }
        out
    }
}

/// Instantiates every contract case for one backend.
macro_rules! contract {
    ($backend:ident, $harness:ty, [$($case:ident),* $(,)?]) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let h = <$harness>::new().await;
                    crate::cases::$case(&h).await;
                }
            )*
        }
    };
}

macro_rules! all_backends {
    ($($case:ident),* $(,)?) => {
        contract!(memory, crate::MemoryHarness, [$($case),*]);
        contract!(valkey, crate::StandaloneHarness, [$($case),*]);
        contract!(valkey_cluster, crate::ClusterHarness, [$($case),*]);
        contract!(etcd, crate::etcd_harness::EtcdHarness, [$($case),*]);
    };
}

all_backends!(
    acquire_grants_a_token_and_then_reports_held,
    concurrent_acquires_have_exactly_one_winner,
    acquire_release_races_never_repeat_a_token,
    expiry_then_reacquire_gives_a_larger_token,
    stale_owner_can_do_nothing_after_a_reacquire,
    renew_extends_and_requires_the_exact_tuple,
    release_frees_the_target_and_keeps_the_counter,
    acquire_replay_returns_the_original_lease,
    acquire_replay_after_expiry_or_supersession_reports_no_active_lease,
    refusals_are_not_cached,
    interrupted_acquire_is_resolved_by_its_request_id,
    reused_request_id_with_other_inputs_is_a_conflict,
    an_acquire_replay_needs_every_input_again,
    renew_and_release_replays_return_the_original_result,
    corrupt_records_fail_closed_and_change_nothing,
    holder_release_and_admin_revoke_clean_up_corrupt_records,
    max_lifetime_caps_every_renewal,
    an_extend_only_renewal_never_shortens_a_lease,
    input_bounds_are_enforced_and_nothing_is_written,
    fenced_commit_accepts_only_the_live_token,
    revoke_ends_the_lease_but_never_lowers_the_token,
    token_floor_raises_the_next_token,
    commit_refuses_a_lower_token_even_after_counter_loss,
    a_caller_chosen_lease_id_is_used_and_replayed,
    conflicts_never_reveal_the_lease_id,
    tenants_are_isolated,
    health_reports_server_time,
    acquire_replay_needs_the_same_lease_id_and_token,
    revoke_replays_and_never_ends_a_later_lease,
    revoke_with_a_token_ends_only_that_lease,
    metadata_that_cannot_be_read_back_is_refused_up_front,
    committed_values_read_back_with_their_token_without_a_lease,
    list_reads_every_record_like_get_and_never_shows_a_lease_id,
    an_ending_lease_is_announced_to_the_targets_waiters,
    an_expiry_is_announced_only_where_the_store_sees_it,
);

//! Token floors per tenant: one namespace that deletes targets by the
//! hundred neither grows, rewrites nor raises another namespace's floors;
//! its own stay under its cap (folded into its own base, with a Warning),
//! and floors of targets unused for the retention fold the same way.

use std::collections::BTreeMap;

use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams};
use targetlease::operator::floor::{floor_key, ledger};

use super::*;

const FLOORS: &str = "targetlease-token-floors";

/// TargetLeases of one namespace, and its floors (in the env's namespace).
pub(crate) struct Tenant {
    client: kube::Client,
    floor_ns: String,
    pub ns: String,
}

impl Tenant {
    pub async fn new(env: &OperatorEnv, prefix: &str) -> Self {
        Self {
            client: env.client.clone(),
            floor_ns: env.ns.clone(),
            ns: env.cp.namespace(prefix).await,
        }
    }

    /// The env's own namespace.
    pub fn of(env: &OperatorEnv) -> Self {
        Self {
            client: env.client.clone(),
            floor_ns: env.ns.clone(),
            ns: env.ns.clone(),
        }
    }

    fn api(&self) -> Api<TargetLease> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub async fn create(&self, name: &str, target: &str) {
        let tl: TargetLease = serde_json::from_value(json!({
            "apiVersion": "targetlease.dev/v1alpha1",
            "kind": "TargetLease",
            "metadata": { "name": name, "namespace": self.ns },
            "spec": { "target": target, "holder": { "identity": name } },
        }))
        .unwrap();
        self.api()
            .create(&Default::default(), &tl)
            .await
            .unwrap_or_else(|e| panic!("create {}/{name}: {e}", self.ns));
    }

    /// Waits until `name` is Held; its token.
    pub async fn held(&self, name: &str) -> u64 {
        let api = self.api();
        let what = format!("{}/{name} Held", self.ns);
        eventually(&what, SOON, || {
            let api = api.clone();
            async move {
                let tl = api.get(name).await.ok()?;
                let (phase, _, token) = summary(&tl);
                (phase == Some(Phase::Held)).then_some(token).flatten()
            }
        })
        .await
    }

    async fn delete_and_wait(&self, name: &str) {
        let api = self.api();
        api.delete(name, &DeleteParams::default()).await.unwrap();
        let what = format!("{}/{name} gone", self.ns);
        eventually(&what, SOON, || {
            let api = api.clone();
            async move { api.get_opt(name).await.ok()?.is_none().then_some(()) }
        })
        .await;
    }

    /// Create → Held → delete → gone: leaves a floor behind. Its token.
    pub async fn cycle(&self, name: &str, target: &str) -> u64 {
        self.create(name, target).await;
        let token = self.held(name).await;
        self.delete_and_wait(name).await;
        token
    }

    /// This namespace's floor ConfigMap: its data and resourceVersion.
    pub async fn floors(&self) -> Option<(BTreeMap<String, String>, String)> {
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.floor_ns);
        let cm = cms
            .get_opt(&format!("{FLOORS}.{}", self.ns))
            .await
            .unwrap()?;
        Some((cm.data.clone().unwrap_or_default(), cm.resource_version()?))
    }

    pub async fn warnings(&self, reason: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.ns);
        let all = events.list(&ListParams::default()).await.unwrap().items;
        all.into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning")
            })
            .collect()
    }
}

/// Promises (docs/security.md, "Tenants"): a tenant that cycles many
/// targets create → Held → delete leaves another tenant's floors untouched
/// (not one write to them), its next tokens what they were, and its own
/// storage bounded by the cap: the oldest of its floors are folded into its
/// own base, each time with a Warning Event on the TargetLease whose
/// deletion did it. After Valkey forgets everything, a fresh operator reads
/// every floor back.
#[tokio::test]
async fn a_tenant_cycling_targets_leaves_other_tenants_floors_and_tokens_alone() {
    const CAP: usize = 8;
    let mut env = OperatorEnv::start_on_own_control_plane("floor-ops").await;
    env.watch_every_namespace();
    env.start_operator_with(&["--floor-max-entries", &CAP.to_string()]);
    let alice = Tenant::new(&env, "alice").await;
    let mallory = Tenant::new(&env, "mallory").await;

    // Alice: two deleted targets (one used twice), one target still in use.
    assert_eq!(alice.cycle("a0", "orders").await, 1);
    assert_eq!(alice.cycle("a1", "orders").await, 2);
    assert_eq!(alice.cycle("a2", "billing").await, 1);
    alice.create("live", "reports").await;
    assert_eq!(alice.held("live").await, 1);
    let (alice_before, alice_version) = alice.floors().await.expect("alice's floors");
    assert_eq!(ledger::entries(&alice_before), 2, "{alice_before:?}");

    // Mallory: one target used three times first (the oldest floor, and the
    // highest), then many distinct targets, some named like alice's, five
    // at a time.
    for i in 0..3 {
        mallory.cycle(&format!("hot-{i}"), "hot").await;
    }
    let targets: Vec<String> = ["orders", "billing", "reports"]
        .into_iter()
        .map(String::from)
        .chain((0..27).map(|i| format!("m-{i}")))
        .collect();
    for batch in targets.chunks(5) {
        let names: Vec<String> = batch.iter().map(|t| format!("x-{t}")).collect();
        let cycles = names.iter().zip(batch).map(|(n, t)| mallory.cycle(n, t));
        futures::future::join_all(cycles).await;
    }

    // Alice's floors: not one write, not one byte more.
    let (alice_after, alice_version_after) = alice.floors().await.unwrap();
    assert_eq!(alice_after, alice_before, "alice's floors unchanged");
    assert_eq!(alice_version_after, alice_version, "not even rewritten");

    // Mallory's own: bounded by the cap, folded into her own base (at least
    // the oldest, highest floor: hot's 3; each fold makes her next targets
    // start above it, so it creeps up), with Warnings saying so.
    let (theirs, _) = mallory.floors().await.unwrap();
    assert!(
        ledger::entries(&theirs) <= CAP,
        "{} entries",
        ledger::entries(&theirs)
    );
    assert!(ledger::base(&theirs) >= 3, "{theirs:?}");
    assert!(
        ledger::bytes(&theirs) <= CAP * 82 + 30,
        "{} bytes",
        ledger::bytes(&theirs)
    );
    let folds = mallory.warnings("FloorsFolded").await;
    assert!(!folds.is_empty(), "a Warning for each fold");
    let note = folds[0].note.clone().unwrap_or_default();
    assert!(
        note.contains(&mallory.ns)
            && note.contains("folded")
            && note.contains("Other namespaces are not affected"),
        "{note}"
    );
    assert!(alice.warnings("FloorsFolded").await.is_empty());
    let all: Vec<String> = Api::<ConfigMap>::namespaced(env.client.clone(), &env.ns)
        .list(&ListParams::default().labels(&format!("targetlease.dev/token-floors={FLOORS}")))
        .await
        .unwrap()
        .items
        .iter()
        .map(|cm| cm.name_any())
        .collect();
    assert_eq!(all.len(), 2, "one ConfigMap per namespace: {all:?}");

    // Valkey forgets everything; a fresh operator reads every floor back:
    // alice's next tokens are what they would have been without mallory
    // (a never-used target starts at 1), mallory's are above her own base.
    env.kill_operator(0);
    env.valkey.restart(); // no persistence: every counter is gone
    env.start_operator_with(&["--floor-max-entries", &CAP.to_string()]);
    let next = [
        ("n-orders", "orders", 3),
        ("n-billing", "billing", 2),
        ("n-fresh", "fresh", 1),
    ];
    for (name, target, _) in next {
        alice.create(name, target).await;
    }
    for (name, target, token) in next {
        assert_eq!(alice.held(name).await, token, "alice's {target}");
    }
    let reacquired = alice.api();
    eventually(
        "alice's live lease reacquired above its token",
        SOON,
        || {
            let api = reacquired.clone();
            async move {
                let tl = api.get("live").await.ok()?;
                (summary(&tl) == (Some(Phase::Held), Some("live".into()), Some(2))).then_some(())
            }
        },
    )
    .await;
    for (name, target) in [
        ("n-hot", "hot"),
        ("n-never", "never-used"),
        ("n-newest", "m-26"),
    ] {
        let floor = ledger::floor_in(&theirs, &floor_key(&mallory.ns, target));
        mallory.create(name, target).await;
        assert_eq!(
            mallory.held(name).await,
            floor + 1,
            "mallory's {target}: above her floors"
        );
    }
}

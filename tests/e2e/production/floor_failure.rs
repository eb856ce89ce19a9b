//! A deletion whose token-floor write is refused: the API server's own
//! admission (a ValidatingAdmissionPolicy, as an administrator's policy or
//! a missing RBAC rule would) turns down every ConfigMap write of the
//! floor namespace.

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, PostParams};
use targetlease::operator::floor::{floor_key, ledger};

use super::floor_tenants::Tenant;
use super::*;
use crate::support::operator_env::http_get;

/// Refuses every ConfigMap create and update in `ns` while it exists.
struct FrozenConfigMaps {
    client: kube::Client,
    name: String,
}

impl FrozenConfigMaps {
    async fn install(env: &OperatorEnv) -> Self {
        let name = format!("freeze-floors-{}", env.ns);
        let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": { "resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"],
                }] },
                "validations": [{ "expression": "false", "message": "token floors frozen by the test" }],
            },
        }))
        .unwrap();
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": { "namespaceSelector": { "matchLabels": {
                    "kubernetes.io/metadata.name": env.ns,
                } } },
            },
        }))
        .unwrap();
        let pp = PostParams::default();
        Api::<ValidatingAdmissionPolicy>::all(env.client.clone())
            .create(&pp, &policy)
            .await
            .unwrap();
        Api::<ValidatingAdmissionPolicyBinding>::all(env.client.clone())
            .create(&pp, &binding)
            .await
            .unwrap();
        // The policy takes effect once the API server has loaded it.
        let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
        eventually("the policy refuses ConfigMap writes", SOON, || {
            let cms = cms.clone();
            async move {
                let probe: ConfigMap =
                    serde_json::from_value(json!({ "metadata": { "generateName": "probe-" } }))
                        .unwrap();
                match cms.create(&PostParams::default(), &probe).await {
                    Err(kube::Error::Api(e)) if e.message.contains("frozen by the test") => {
                        Some(())
                    }
                    Ok(created) => {
                        let _ = cms
                            .delete(&created.name_any(), &DeleteParams::default())
                            .await;
                        None
                    }
                    Err(_) => None,
                }
            }
        })
        .await;
        Self {
            client: env.client.clone(),
            name,
        }
    }

    async fn remove(self) {
        let dp = DeleteParams::default();
        let _ = Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone())
            .delete(&self.name, &dp)
            .await;
        let _ = Api::<ValidatingAdmissionPolicy>::all(self.client.clone())
            .delete(&self.name, &dp)
            .await;
    }
}

/// `targetlease_api_writes_total{kind=…}` of operator 0.
fn writes(env: &OperatorEnv, kind: &str) -> u64 {
    let (_, body) = http_get(env.admin_port(0), "/metrics").expect("the operator's metrics");
    let series = format!("targetlease_api_writes_total{{kind=\"{kind}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Promise (docs/operator.md "Deleting a TargetLease"): a deletion whose
/// floor write fails keeps its finalizer, says why on the resource (the
/// `Held` condition's reason `FloorNotWritten` and a Warning Event naming
/// the token), unpublishes once (marks, then status: one unmark, no
/// rewrite at each retry), releases nothing before the floor covers the
/// token, and never shows Held again — not while the store lets the
/// unrenewed lease run out. Once writes are allowed again it finishes, and
/// the next token is above the floor.
#[tokio::test]
async fn a_deletion_whose_floor_write_is_refused_keeps_its_finalizer_and_never_shows_held() {
    let mut env = OperatorEnv::start("floor-refused").await;
    let history = History::record(&env);
    let tenant = Tenant::of(&env);
    env.create_pod(
        "web-0",
        &[("app", "web"), ("job.targetlease.dev/candidate", "true")],
        true,
    )
    .await;
    env.create(
        "job",
        lease_for("t")
            .identity("job")
            .pod("web-0")
            .durations("4s", "1s"),
    )
    .await;
    assert_eq!(tenant.held("job").await, 1);
    let marked = |pod: &k8s_openapi::api::core::v1::Pod| {
        pod.labels().contains_key("job.targetlease.dev/leader")
    };
    // The pod is marked just after status shows Held (docs/operator.md
    // "What the operator publishes, and in which order").
    let pods = env.pods();
    eventually("web-0 marked as the holder", SOON, || async {
        pods.get("web-0").await.ok().filter(|p| marked(p))
    })
    .await;

    let frozen = FrozenConfigMaps::install(&env).await;
    let (unmarks, statuses) = (writes(&env, "pod_unmark"), writes(&env, "status"));
    env.delete("job").await;
    let stuck = env.wait_reason("job", "FloorNotWritten", SOON).await;
    let store = env.store().await;
    let target = Target::new(&env.ns, "t");
    assert_eq!(
        store.get(&target).await.unwrap().outcome,
        Outcome::Found,
        "nothing is released before the floor covers the token"
    );
    let held = condition(&stuck, "Held").unwrap();
    assert_eq!(held.status, "False");
    assert!(
        held.message.contains("fencing token 1") && held.message.contains("frozen by the test"),
        "{}",
        held.message
    );
    assert!(
        stuck
            .finalizers()
            .iter()
            .any(|f| f == "targetlease.dev/release")
    );
    assert!(!marked(&env.pods().get("web-0").await.unwrap()), "unmarked");

    // The lease runs out in the store (nobody renews what is unpublished);
    // the deletion keeps waiting, retrying, and changes nothing it published.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(store.get(&target).await.unwrap().outcome, Outcome::NotFound);
    let still = env.api().get("job").await.expect("kept by its finalizer");
    assert_eq!(
        still.resource_version(),
        stuck.resource_version(),
        "no rewrite per retry"
    );
    assert_eq!(writes(&env, "pod_unmark") - unmarks, 1, "unmarked once");
    assert_eq!(
        writes(&env, "status") - statuses,
        2,
        "Held withdrawn once, the reason written once"
    );
    assert!(writes(&env, "floor") >= 2, "the floor write is retried");
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    let warned = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .any(|e| {
            e.reason.as_deref() == Some("FloorNotWritten")
                && e.type_.as_deref() == Some("Warning")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("fencing token 1"))
        });
    assert!(warned, "a Warning Event says why the deletion waits");
    let versions = history.of("job");
    let withdrawn = versions
        .iter()
        .position(|tl| {
            summary(tl).0 != Some(Phase::Held) && tl.metadata.deletion_timestamp.is_some()
        })
        .expect("Held withdrawn");
    assert!(
        versions[withdrawn..]
            .iter()
            .all(|tl| summary(tl).0 != Some(Phase::Held)),
        "never Held again once withdrawn"
    );

    frozen.remove().await;
    env.wait_gone("job", Duration::from_secs(60)).await;
    let (floors, _) = tenant.floors().await.expect("the floor, written at last");
    assert_eq!(ledger::floor_in(&floors, &floor_key(&env.ns, "t")), 1);
    env.valkey.restart(); // forgets the counter: only the floor remembers
    env.create("next", lease_for("t").identity("next")).await;
    assert_eq!(tenant.held("next").await, 2);
}

//! The operator's ConfigMap rights: its token-floor ConfigMaps, one per
//! namespace, and nothing else, with and without a watched namespace.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::cluster::{SOON, client_from, service_account_kubeconfig};
use crate::helm::*;
use crate::support::chart_identity::apply;
use crate::support::kube_env::{self, eventually};

const FLOORS: &str = "targetlease-token-floors";

fn floor_map(name: &str, label: Option<&str>) -> ConfigMap {
    let labels = label.map(|l| json!({ "targetlease.dev/token-floors": l }));
    serde_json::from_value(json!({
        "metadata": { "name": name, "labels": labels.unwrap_or(json!({})) },
        "data": { "base": "1" },
    }))
    .unwrap()
}

fn refused_by_floors_policy<T>(r: &Result<T, kube::Error>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 403
        && s.message.contains("ValidatingAdmissionPolicy")
        && s.message.contains("only its token-floor ConfigMaps"))
}

/// Promise (docs/security.md, "What the chart lets the operator do"): the
/// operator's ServiceAccount creates and updates its namespaces' floor
/// ConfigMaps and no other ConfigMap of the release namespace. Without a
/// watched namespace RBAC must allow updates of any name (floors are named
/// after namespaces not known at install): the chart's token-floors policy
/// refuses the rest. With one, RBAC names its one ConfigMap too.
#[tokio::test]
async fn the_operator_may_write_no_configmap_but_its_token_floors() {
    let cp = kube_env::shared().await;
    for watch in [false, true] {
        let ns = cp.namespace("chart-floors").await;
        let watch_arg = format!("operator.watchNamespace={ns}");
        let mut args: Vec<&str> = Vec::new();
        if watch {
            args.extend(["--set", watch_arg.as_str()]);
        }
        args.extend_from_slice(&RBAC_TEMPLATES);
        let rendered = template(&ns, &ns, &args);
        assert!(
            rendered
                .find_policy("ValidatingAdmissionPolicy", "token-floors")
                .is_some()
        );
        // Only the release namespace's identity and the ConfigMap policy: the
        // other policies, unscoped without a watched namespace, would bind
        // every namespace of the shared control plane.
        let identity: Vec<_> = rendered
            .0
            .iter()
            .filter(|d| {
                ["ServiceAccount", "Role", "RoleBinding"].contains(&d["kind"].as_str().unwrap())
                    || d["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.ends_with("-token-floors"))
            })
            .cloned()
            .collect();
        apply(&cp.client(), &identity).await;
        let sa = rendered.get("ServiceAccount")["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = service_account_kubeconfig(cp, &ns, &sa, dir.path()).await;
        let operator: Api<ConfigMap> = Api::namespaced(client_from(&kubeconfig).await, &ns);
        let admin: Api<ConfigMap> = Api::namespaced(cp.client(), &ns);
        let pp = PostParams::default();

        // The policy loads asynchronously: wait until it refuses.
        let probes = std::sync::atomic::AtomicU32::new(0);
        eventually("the token-floors policy to be enforced", SOON, || {
            let n = probes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let probe = floor_map(&format!("probe-{n}"), Some(FLOORS));
            let operator = operator.clone();
            async move {
                refused_by_floors_policy(&operator.create(&PostParams::default(), &probe).await)
                    .then_some(())
            }
        })
        .await;

        // Its own: created, then updated.
        let own = format!("{FLOORS}.{ns}");
        let created = operator
            .create(&pp, &floor_map(&own, Some(FLOORS)))
            .await
            .unwrap_or_else(|e| panic!("watch={watch}: the operator creates {own}: {e}"));
        operator
            .replace(&own, &pp, &created)
            .await
            .unwrap_or_else(|e| panic!("watch={watch}: the operator updates {own}: {e}"));

        // Anything else: refused, by the policy (create cannot be limited by
        // name in RBAC) or by RBAC.
        for (what, cm) in [
            ("another ConfigMap", floor_map("dashboard", None)),
            (
                "a floor name without the label",
                floor_map(&format!("{FLOORS}.x"), None),
            ),
            ("the label on another name", floor_map("evil", Some(FLOORS))),
            (
                "another release's floors",
                floor_map(&format!("other.{ns}"), Some("other")),
            ),
        ] {
            let r = operator.create(&pp, &cm).await;
            assert!(refused_by_floors_policy(&r), "watch={watch}: {what}: {r:?}");
        }
        let foreign = admin
            .create(&pp, &floor_map("settings", None))
            .await
            .unwrap();
        let r = operator.replace("settings", &pp, &foreign).await;
        assert!(
            matches!(&r, Err(kube::Error::Api(s)) if s.code == 403),
            "watch={watch}: an update of another ConfigMap: {r:?}"
        );
        if watch {
            // RBAC names the watched namespace's ConfigMap only.
            let other = admin
                .create(
                    &pp,
                    &floor_map(&format!("{FLOORS}.elsewhere"), Some(FLOORS)),
                )
                .await
                .unwrap();
            let r = operator
                .replace(&other.metadata.name.clone().unwrap(), &pp, &other)
                .await;
            assert!(
                matches!(&r, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("cannot update")),
                "another namespace's floors: {r:?}"
            );
        }
    }
}

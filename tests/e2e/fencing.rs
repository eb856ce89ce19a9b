//! The Kubernetes fencing recipe (examples/fencing/kubernetes.sh, explained in
//! docs/fencing.md) against the real API server: a write with an older token
//! than the last one is refused, and a write prepared from a stale read is
//! refused by the resourceVersion precondition, then re-decided.

use std::process::Command;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::support::kube_env;

fn recipe(kubeconfig: &std::path::Path, ns: &str, token: u64, value: &str) -> i32 {
    recipe_with(kubeconfig, ns, &token.to_string(), value)
}

/// The recipe with TOKEN given verbatim.
fn recipe_with(kubeconfig: &std::path::Path, ns: &str, token: &str, value: &str) -> i32 {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/fencing/kubernetes.sh"
    );
    let out = Command::new("bash")
        .arg(script)
        .arg(token)
        .arg("orders")
        .arg("state")
        .arg(value)
        .env("KUBECONFIG", kubeconfig)
        .env("PATH", crate::support::tools::path_with_tools())
        .env("NAMESPACE", ns)
        .output()
        .expect("run the recipe (needs bash, kubectl, jq)");
    out.status.code().unwrap_or(-1)
}

async fn state(api: &Api<ConfigMap>) -> (String, String) {
    let cm = api.get("orders").await.unwrap();
    let token =
        cm.metadata.annotations.unwrap_or_default()["targetlease.dev/fencing-token"].clone();
    (token, cm.data.unwrap_or_default()["state"].clone())
}

#[tokio::test]
async fn the_kubernetes_recipe_refuses_older_tokens_and_stale_reads() {
    let cp = kube_env::shared().await;
    let ns = cp.namespace("fencing").await;
    let api: Api<ConfigMap> = Api::namespaced(cp.client(), &ns);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": "orders" }, "data": { "state": "initial" }
    }))
    .unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap();
    let kc = cp.kubeconfig_path();

    assert_eq!(recipe(kc, &ns, 5, "from-5"), 0, "a first token writes");
    assert_eq!(recipe(kc, &ns, 7, "from-7"), 0, "a newer token writes");
    assert_eq!(
        recipe(kc, &ns, 7, "again-7"),
        0,
        "the same holder writes again"
    );
    assert_eq!(
        recipe(kc, &ns, 6, "stale-6"),
        1,
        "an older token is refused"
    );
    assert_eq!(recipe(kc, &ns, 9_223_372_036_854_775_806, "huge"), 0);
    assert_eq!(
        recipe(kc, &ns, 8, "stale-8"),
        1,
        "tokens compare as integers"
    );
    assert_eq!(
        state(&api).await,
        ("9223372036854775806".into(), "huge".into())
    );

    // The precondition the recipe relies on: a write prepared from a read
    // that is no longer current is refused (409), whatever its token.
    let stale_read = api.get("orders").await.unwrap();
    assert_eq!(recipe(kc, &ns, 9_223_372_036_854_775_807, "newest"), 0);
    let mut late = stale_read;
    late.metadata.annotations.get_or_insert_default().insert(
        "targetlease.dev/fencing-token".into(),
        "9223372036854775807".into(),
    );
    late.data
        .get_or_insert_default()
        .insert("state".into(), "lost-update".into());
    match api.replace("orders", &PostParams::default(), &late).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 409, "{e:?}"),
        other => panic!("a write from a stale read must be refused: {other:?}"),
    }
    assert_eq!(state(&api).await.1, "newest");
}

/// An annotation (anyone who may edit the object can set it) or a TOKEN that
/// is not a token is never evaluated: bash arithmetic would run code hidden
/// in it, wrap an overflow to a small number or read `010` as octal, and
/// each of those would let an older token write. The recipe stops (exit 2)
/// and writes nothing.
#[tokio::test]
async fn the_kubernetes_recipe_never_evaluates_an_unreadable_token() {
    let cp = kube_env::shared().await;
    let ns = cp.namespace("fencing-bad").await;
    let api: Api<ConfigMap> = Api::namespaced(cp.client(), &ns);
    let kc = cp.kubeconfig_path();
    let marker = std::env::temp_dir().join(format!("targetlease-fencing-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let injected = format!("token[$(touch {})0]", marker.display());
    for annotation in [
        injected.as_str(),
        "18446744073709551617",
        "9223372036854775808",
        "010",
        "-5",
        "abc",
    ] {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {
                "name": "orders",
                "annotations": { "targetlease.dev/fencing-token": annotation }
            },
            "data": { "state": "initial" }
        }))
        .unwrap();
        let _ = api.delete("orders", &Default::default()).await;
        api.create(&PostParams::default(), &cm).await.unwrap();
        assert_eq!(recipe(kc, &ns, 9, "from-9"), 2, "annotation {annotation:?}");
        assert_eq!(
            state(&api).await,
            (annotation.to_owned(), "initial".into()),
            "annotation {annotation:?}"
        );
        assert!(!marker.exists(), "the annotation ran a command");
    }
    for token in ["0", "010", "-1", "9223372036854775808", "x[$(true)]"] {
        assert_eq!(recipe_with(kc, &ns, token, "bad"), 2, "TOKEN {token:?}");
    }
    assert_eq!(state(&api).await.1, "initial");
}

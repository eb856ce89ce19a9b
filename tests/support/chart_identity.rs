//! Runs an operator as a ServiceAccount holding exactly the Helm chart's
//! RBAC: renders the chart with the real `helm`, applies what it renders, and
//! writes a kubeconfig with a TokenRequest token (optionally pointing at a
//! proxy in front of the API server), so the API server's audit log names
//! each process by its own user.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};

use super::kube_env::ControlPlane;

/// `helm template RELEASE charts/targetlease -n NAMESPACE ARGS…`, parsed.
pub fn helm_template(release: &str, namespace: &str, args: &[&str]) -> Vec<Value> {
    static HOME: OnceLock<tempfile::TempDir> = OnceLock::new();
    let home = HOME.get_or_init(|| tempfile::tempdir().expect("helm home"));
    let bin = super::tools::tool("helm");
    let chart = crate::repo().join("charts/targetlease");
    let out = Command::new(bin)
        .args(["template", release])
        .arg(&chart)
        .args(["--namespace", namespace, "--kube-version", "1.33.0"])
        .args(args)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "helm template {release} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("helm prints UTF-8");
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).expect("helm renders valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// Server-side applies every document with `client`.
pub async fn apply(client: &Client, docs: &[Value]) {
    for doc in docs {
        let obj: DynamicObject = serde_json::from_value(doc.clone()).expect("an object");
        let types = obj.types.clone().expect("apiVersion and kind");
        let (group, version) = types
            .api_version
            .split_once('/')
            .unwrap_or(("", &types.api_version));
        let gvk = GroupVersionKind::gvk(group, version, &types.kind);
        let (ar, caps) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .unwrap_or_else(|e| panic!("discover {gvk:?}: {e}"));
        let api: Api<DynamicObject> = match obj.namespace() {
            Some(ns) if caps.scope == kube::discovery::Scope::Namespaced => {
                Api::namespaced_with(client.clone(), &ns, &ar)
            }
            _ => Api::all_with(client.clone(), &ar),
        };
        api.patch(
            &obj.name_any(),
            &PatchParams::apply("chart-tests").force(),
            &Patch::Apply(&obj),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {} {}: {e}", types.kind, obj.name_any()));
    }
}

/// Creates ServiceAccount `namespace/name` with the chart's RBAC for an
/// operator watching `namespace` (no admission policy); returns its user name.
pub async fn chart_service_account(cp: &ControlPlane, namespace: &str, name: &str) -> String {
    let sa = format!("serviceAccount.name={name},operator.watchNamespace={namespace}");
    let docs = helm_template(
        &format!("{name}-rbac"),
        namespace,
        &[
            "--set",
            &sa,
            "--show-only",
            "templates/serviceaccount.yaml",
            "--show-only",
            "templates/rbac.yaml",
        ],
    );
    assert_eq!(docs.len(), 5, "SA, two roles, two bindings");
    apply(&cp.client(), &docs).await;
    format!("system:serviceaccount:{namespace}:{name}")
}

/// A kubeconfig file for `namespace/sa` (TokenRequest token, one hour) that
/// reaches the API server at `server` (the control plane's own URL, or a
/// proxy's `https://127.0.0.1:PORT`: its certificate names 127.0.0.1).
pub async fn service_account_kubeconfig(
    cp: &ControlPlane,
    namespace: &str,
    sa: &str,
    server: &str,
    dir: &Path,
) -> PathBuf {
    let sas: Api<ServiceAccount> = Api::namespaced(cp.client(), namespace);
    let tr = serde_json::from_value(json!({ "spec": { "expirationSeconds": 3600 } })).unwrap();
    let token = sas
        .create_token_request(sa, &PostParams::default(), &tr)
        .await
        .expect("TokenRequest")
        .status
        .expect("token")
        .token;
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "test", "cluster": {
            "server": server,
            "certificate-authority": cp.dir().join("pki/ca.crt"),
        } }],
        "users": [{ "name": sa, "user": { "token": token } }],
        "contexts": [{ "name": sa, "context": { "cluster": "test", "user": sa, "namespace": namespace } }],
        "current-context": sa,
    });
    let path = dir.join(format!(
        "{sa}-{}.kubeconfig",
        server.rsplit(':').next().unwrap()
    ));
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig).unwrap()).unwrap();
    path
}

//! The chart on a real API server: install and upgrade, the admission policy
//! against tenants, and the operator running as the chart's ServiceAccount.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use serde_json::{Value, json};
use targetlease::crd::{Phase, TargetLease};
use targetlease::store::valkey::{ValkeyConfig, ValkeyStore};
use targetlease::store::{LeaseStore, Outcome, Target};

use crate::helm::*;
use crate::support::kube_env::{self, ControlPlane, eventually};
use crate::support::operator_env::{OperatorEnv, apply_example, summary};

const SOON: Duration = Duration::from_secs(30);

/// Server-side applies every rendered document with the admin client.
async fn apply(client: &Client, docs: &[Value]) {
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

/// A chart release's identity and access in `ns`: ServiceAccount, RBAC and
/// the admission policy (scoped to `ns` so parallel tests do not interfere).
struct Release {
    rendered: Rendered,
    service_account: String,
}

async fn install_identity(cp: &ControlPlane, ns: &str) -> Release {
    let watch = format!("operator.watchNamespace={ns}");
    let mut args = vec!["--set", watch.as_str()];
    args.extend_from_slice(&VAP_APIS);
    args.extend_from_slice(&RBAC_TEMPLATES);
    args.extend_from_slice(&["--show-only", "templates/deployment.yaml"]);
    let rendered = template(ns, ns, &args);
    assert!(rendered.find("ValidatingAdmissionPolicy").is_some());
    let identity: Vec<_> = rendered
        .0
        .iter()
        .filter(|d| d["kind"] != "Deployment")
        .cloned()
        .collect();
    assert_eq!(
        identity.len(),
        7,
        "SA, 2 roles, 2 bindings, policy, binding"
    );
    apply(&cp.client(), &identity).await;
    let service_account = rendered.get("ServiceAccount")["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    Release {
        rendered,
        service_account,
    }
}

/// A kubeconfig file holding a TokenRequest token of `ns/sa`.
async fn service_account_kubeconfig(cp: &ControlPlane, ns: &str, sa: &str, dir: &Path) -> PathBuf {
    let sas: Api<ServiceAccount> = Api::namespaced(cp.client(), ns);
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
            "server": cp.server_url(),
            "certificate-authority": cp.dir().join("pki/ca.crt"),
        } }],
        "users": [{ "name": sa, "user": { "token": token } }],
        "contexts": [{ "name": sa, "context": { "cluster": "test", "user": sa, "namespace": ns } }],
        "current-context": sa,
    });
    let path = dir.join(format!("{sa}.kubeconfig"));
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig).unwrap()).unwrap();
    path
}

async fn client_from(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    Client::try_from(config).expect("client")
}

fn status_patch(holder: &str) -> Value {
    json!({ "status": { "holder": holder, "fencingToken": 999 } })
}

async fn write_status(client: &Client, ns: &str, name: &str) -> Result<(), kube::Error> {
    let api: Api<TargetLease> = Api::namespaced(client.clone(), ns);
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(status_patch("forged")),
    )
    .await
    .map(|_| ())
}

fn refused_by_policy(r: &Result<(), kube::Error>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 403
        && s.message.contains("ValidatingAdmissionPolicy")
        && s.message.contains("only the targetlease operator"))
}

fn refused_by_rbac(r: &Result<(), kube::Error>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 403
        && s.message.contains("cannot patch resource \"targetleases/status\""))
}

/// A Role + RoleBinding giving `sa` the listed rules in `ns`.
async fn grant(cp: &ControlPlane, ns: &str, sa: &str, rules: Value) {
    let name = format!("{sa}-grant");
    apply(
        &cp.client(),
        &[
            json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                    "metadata": { "name": name, "namespace": ns }, "rules": rules }),
            json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                    "metadata": { "name": name, "namespace": ns },
                    "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
                    "subjects": [{ "kind": "ServiceAccount", "name": sa, "namespace": ns }] }),
        ],
    )
    .await;
}

fn tenant_edit_rules(with_status: bool) -> Value {
    let mut rules = vec![
        json!({ "apiGroups": ["targetlease.dev"], "resources": ["targetleases"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"] }),
    ];
    if with_status {
        rules.push(
            json!({ "apiGroups": ["targetlease.dev"], "resources": ["targetleases/status"],
            "verbs": ["get", "update", "patch"] }),
        );
    }
    Value::Array(rules)
}

/// Waits until the rendered policy is enforced in `ns` (it is loaded
/// asynchronously): the admin (system:masters, not exempt) is refused.
async fn wait_policy_enforced(cp: &ControlPlane, ns: &str, probe: &str) {
    let admin = cp.client();
    eventually("the admission policy to be enforced", SOON, || {
        let admin = admin.clone();
        async move { refused_by_policy(&write_status(&admin, ns, probe).await).then_some(()) }
    })
    .await;
}

/// `helm install`, then `helm upgrade` with the same values.
fn helm_install_or_upgrade(cp: &ControlPlane, verb: &str, release: &str, ns: &str) {
    let kubeconfig = cp.kubeconfig_path().display().to_string();
    let watch = format!("operator.watchNamespace={ns}");
    helm_ok(&[
        verb,
        release,
        &chart(),
        "--namespace",
        ns,
        "--kubeconfig",
        &kubeconfig,
        "--set",
        &watch,
    ]);
}

#[tokio::test]
async fn helm_install_and_upgrade_keep_the_lease_id_key_and_pass_pod_security() {
    let cp = kube_env::shared().await;
    let ns = cp.namespace("chart-install").await;
    // The namespace enforces Pod Security "restricted".
    let psa = json!({ "metadata": { "labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    } } });
    Api::<k8s_openapi::api::core::v1::Namespace>::all(cp.client())
        .patch(&ns, &PatchParams::default(), &Patch::Merge(&psa))
        .await
        .expect("label the namespace");
    let release = format!("{ns}-r");
    let secrets: Api<Secret> = Api::namespaced(cp.client(), &ns);
    let name = format!("{release}-targetlease-lease-id-key");

    helm_install_or_upgrade(cp, "install", &release, &ns);
    let installed = secrets.get(&name).await.expect("the generated key");
    assert_eq!(installed.data.clone().unwrap()["key"].0.len(), 64);
    helm_install_or_upgrade(cp, "upgrade", &release, &ns);
    let upgraded = secrets.get(&name).await.unwrap();
    assert_eq!(
        installed.data, upgraded.data,
        "the lease-id key survives upgrades (lookup)"
    );

    // Installed against a real API server: the policy is detected and rendered.
    let kubeconfig = cp.kubeconfig_path().display().to_string();
    let helm_here = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--namespace", &ns, "--kubeconfig", &kubeconfig]);
        helm_ok(&all)
    };
    let manifest = Rendered::parse(&helm_here(&["get", "manifest", &release]));
    assert!(manifest.find("ValidatingAdmissionPolicy").is_some());

    // The pod template is admitted under "restricted" (there is no
    // ReplicaSet controller here: create its pod directly, dry run) ...
    let pods: Api<Pod> = Api::namespaced(cp.client(), &ns);
    let template = manifest.get("Deployment")["spec"]["template"].clone();
    let pod = |spec: Value| -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": "operator", "labels": template["metadata"]["labels"] },
            "spec": spec,
        }))
        .unwrap()
    };
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    pods.create(&dry_run, &pod(template["spec"].clone()))
        .await
        .expect("the chart's pod is admitted under Pod Security restricted");
    // ... and the namespace really enforces it: without the container's
    // securityContext the same pod is refused.
    let mut weaker = template["spec"].clone();
    weaker["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("securityContext");
    let refused = pods.create(&dry_run, &pod(weaker)).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("PodSecurity")),
        "{refused:?}"
    );

    helm_here(&["uninstall", &release]);
    assert!(
        secrets.get_opt(&name).await.unwrap().is_some(),
        "the key is kept on uninstall"
    );
}

#[tokio::test]
async fn only_the_operator_service_account_may_write_status() {
    let cp = kube_env::shared().await;
    let ns = cp.namespace("chart-tenant").await;
    let release = install_identity(cp, &ns).await;
    let dir = tempfile::tempdir().unwrap();

    let probe: TargetLease = serde_json::from_value(json!({
        "apiVersion": "targetlease.dev/v1alpha1", "kind": "TargetLease",
        "metadata": { "name": "probe", "namespace": ns },
        "spec": { "target": "probe", "holder": { "identity": "someone" } },
    }))
    .unwrap();
    crate::support::operator_env::install_crd(&cp.client()).await;
    Api::<TargetLease>::namespaced(cp.client(), &ns)
        .create(&PostParams::default(), &probe)
        .await
        .expect("create the probe TargetLease");
    wait_policy_enforced(cp, &ns, "probe").await;

    // A tenant who may edit TargetLeases but not their status: refused by RBAC.
    let editor = cp.service_account_client(&ns, "tenant-editor").await;
    grant(cp, &ns, "tenant-editor", tenant_edit_rules(false)).await;
    eventually("the editor can edit TargetLeases", SOON, || {
        let api: Api<TargetLease> = Api::namespaced(editor.clone(), &ns);
        async move {
            api.patch(
                "probe",
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { "edited": "yes" } } })),
            )
            .await
            .ok()
        }
    })
    .await;
    let r = write_status(&editor, &ns, "probe").await;
    assert!(refused_by_rbac(&r), "{r:?}");

    // A tenant granted targetleases/status by RBAC: refused by the policy.
    let writer = cp.service_account_client(&ns, "tenant-writer").await;
    grant(cp, &ns, "tenant-writer", tenant_edit_rules(true)).await;
    let r = eventually("RBAC to let the writer through to admission", SOON, || {
        let writer = writer.clone();
        let ns = ns.clone();
        async move {
            let r = write_status(&writer, &ns, "probe").await;
            (!refused_by_rbac(&r)).then_some(r)
        }
    })
    .await;
    assert!(refused_by_policy(&r), "{r:?}");

    // The operator's ServiceAccount, with only the chart's RBAC, may.
    let kubeconfig =
        service_account_kubeconfig(cp, &ns, &release.service_account, dir.path()).await;
    let operator = client_from(&kubeconfig).await;
    write_status(&operator, &ns, "probe")
        .await
        .expect("the operator's ServiceAccount writes status");
    let tl = Api::<TargetLease>::namespaced(cp.client(), &ns)
        .get("probe")
        .await
        .unwrap();
    assert_eq!(summary(&tl).1.as_deref(), Some("forged"));
    // ... and nothing more than its RBAC: it cannot create TargetLeases.
    let mut other = probe.clone();
    other.metadata.name = Some("other".into());
    let r = Api::<TargetLease>::namespaced(operator.clone(), &ns)
        .create(&PostParams::default(), &other)
        .await;
    assert!(
        matches!(&r, Err(kube::Error::Api(s)) if s.code == 403),
        "{r:?}"
    );
}

async fn candidate_pod(env: &OperatorEnv, name: &str) {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "labels": { "app": "web" } },
        "spec": { "containers": [{ "name": "web", "image": "registry.example/web:1.0" }] },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let ready = json!({ "status": { "conditions": [{ "type": "Ready", "status": "True" }] } });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&ready))
        .await
        .expect("set pod readiness");
}

async fn leader_mark(env: &OperatorEnv, name: &str) -> Option<(String, String)> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let pod = pods.get_opt(name).await.unwrap()?;
    Some((
        pod.labels()
            .get("web-leader.targetlease.dev/leader")?
            .clone(),
        pod.annotations()
            .get("web-leader.targetlease.dev/fencing-token")?
            .clone(),
    ))
}

/// The end-to-end flows with the operator authenticated as the chart's
/// ServiceAccount, holding only the chart's RBAC, under the chart's policy.
#[tokio::test]
async fn the_operator_runs_as_the_chart_service_account() {
    let mut env = OperatorEnv::start_without_operator("chart-rbac").await;
    let cp = env.cp;
    let ns = env.ns.clone();
    let release = install_identity(cp, &ns).await;

    // The policy is in force before the operator writes anything.
    env.create(
        "policy-probe",
        json!({ "target": "probe", "holder": { "identity": "x" } }),
    )
    .await;
    wait_policy_enforced(cp, &ns, "policy-probe").await;
    env.delete("policy-probe").await;
    env.wait_gone("policy-probe", SOON).await;

    // Run the binary as the ServiceAccount, with the chart's own settings for
    // the floor ConfigMap and leader election (OperatorEnv sets the namespaces).
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig =
        service_account_kubeconfig(cp, &ns, &release.service_account, dir.path()).await;
    let chart_args: Vec<String> = release
        .rendered
        .args()
        .into_iter()
        .filter(|a| {
            a.starts_with("--floor-configmap")
                || a == "--leader-election"
                || a.starts_with("--leader-election-lease")
        })
        .collect();
    assert_eq!(chart_args.len(), 3, "{chart_args:?}");
    env.run_operators_as(kubeconfig);
    let extra: Vec<&str> = chart_args.iter().map(String::as_str).collect();
    env.start_operator_with(&extra);

    // Apply -> Held with a token, finalizer set.
    let spec = |id: &str| json!({ "target": "orders-db", "holder": { "identity": id } });
    env.create("job-a", spec("job-a")).await;
    let a = env.wait_phase("job-a", Phase::Held, SOON).await;
    assert_eq!(
        summary(&a),
        (Some(Phase::Held), Some("job-a".into()), Some(1))
    );
    assert!(
        a.finalizers()
            .contains(&"targetlease.dev/release".to_string())
    );

    // Two leases on one target hand off when the holder is deleted.
    env.create("job-b", spec("job-b")).await;
    env.wait_phase("job-b", Phase::Pending, SOON).await;
    env.delete("job-a").await;
    env.wait_gone("job-a", SOON).await;
    let b = env.wait_phase("job-b", Phase::Held, SOON).await;
    assert_eq!(summary(&b).2, Some(2));

    // Deletion releases in Valkey and records the token floor in the ConfigMap.
    env.delete("job-b").await;
    env.wait_gone("job-b", SOON).await;
    let store = ValkeyStore::connect(&ValkeyConfig {
        url: env.valkey.url(),
        ..ValkeyConfig::default()
    })
    .await
    .expect("connect to the test valkey");
    let got = store.get(&Target::new(&ns, "orders-db")).await.unwrap();
    assert_eq!(got.outcome, Outcome::NotFound, "released in Valkey");
    let floors = Api::<ConfigMap>::namespaced(cp.client(), &ns)
        .list(
            &ListParams::default().labels("targetlease.dev/token-floors=targetlease-token-floors"),
        )
        .await
        .expect("the token floor ConfigMaps, written by the operator");
    assert!(
        floors
            .items
            .into_iter()
            .any(|cm| cm.data.unwrap_or_default().values().any(|v| v == "2")),
        "floor records token 2"
    );

    // Leader election among pods: mark one, fail over with a larger token.
    candidate_pod(&env, "web-0").await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // distinct creation times
    candidate_pod(&env, "web-1").await;
    apply_example(&env, "leader-election.yaml").await;
    env.wait_for("web-leader", "led by web-0", SOON, |tl| {
        summary(tl) == (Some(Phase::Held), Some("web-0".into()), Some(1))
    })
    .await;
    eventually("web-0 marked", SOON, || async {
        (leader_mark(&env, "web-0").await == Some(("true".into(), "1".into()))).then_some(())
    })
    .await;
    Api::<Pod>::namespaced(cp.client(), &ns)
        .delete("web-0", &Default::default())
        .await
        .unwrap();
    env.wait_for("web-leader", "led by web-1", SOON, |tl| {
        summary(tl) == (Some(Phase::Held), Some("web-1".into()), Some(2))
    })
    .await;
    eventually("web-1 marked", SOON, || async {
        (leader_mark(&env, "web-1").await == Some(("true".into(), "2".into()))).then_some(())
    })
    .await;

    // Events were recorded, and the operator leads through the chart's Lease.
    let events: Api<Event> = Api::namespaced(cp.client(), &ns);
    eventually("an Acquired event", SOON, || {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("Acquired")
                        && e.reporting_controller.as_deref() == Some("targetlease-operator")
                })
                .then_some(())
        }
    })
    .await;
    let lease_name = chart_args
        .iter()
        .find_map(|a| a.strip_prefix("--leader-election-lease="))
        .unwrap();
    let lease = Api::<Lease>::namespaced(cp.client(), &ns)
        .get(lease_name)
        .await
        .expect("the leader-election Lease");
    assert!(
        lease
            .spec
            .and_then(|s| s.holder_identity)
            .is_some_and(|h| !h.is_empty()),
        "a replica holds the Lease"
    );

    let log = env.operator_log(0);
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the operator was refused something:\n{log}"
    );
}

//! The chart on a real API server: install and upgrade, the admission policy
//! against tenants, and the operator running as the chart's ServiceAccount.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};
use targetlease::operator::crd::TargetLease;

use crate::helm::*;
use crate::support::chart_identity::{self, apply};
use crate::support::kube_env::{self, ControlPlane, eventually};
use crate::support::operator_env::summary;

pub const SOON: Duration = Duration::from_secs(30);

/// A chart release's identity and access in `ns`: ServiceAccount, RBAC and
/// the admission policy (scoped to `ns` so parallel tests do not interfere).
pub struct Release {
    pub rendered: Rendered,
    pub service_account: String,
}

pub async fn install_identity(cp: &ControlPlane, ns: &str) -> Release {
    install_release_identity(cp, ns, ns).await
}

/// The same, for a release named `release` (several may share a name).
pub async fn install_release_identity(cp: &ControlPlane, release: &str, ns: &str) -> Release {
    install_identity_watching(cp, release, ns, ns).await
}

/// The same, for release `release` installed in namespace `home`, watching
/// namespace `watched`.
pub async fn install_identity_watching(
    cp: &ControlPlane,
    release: &str,
    home: &str,
    watched: &str,
) -> Release {
    let watch = format!("operator.watchNamespace={watched}");
    let mut args = vec!["--set", watch.as_str()];
    args.extend_from_slice(&RBAC_TEMPLATES);
    args.extend_from_slice(&["--show-only", "templates/deployment.yaml"]);
    let rendered = template(release, home, &args);
    assert!(
        rendered
            .find_policy("ValidatingAdmissionPolicy", "status-writers")
            .is_some()
    );
    for which in ["pod-marks", "lease-metadata", "token-floors"] {
        assert!(
            rendered
                .find_policy("ValidatingAdmissionPolicy", which)
                .is_some()
        );
    }
    let identity: Vec<_> = rendered
        .0
        .iter()
        .filter(|d| d["kind"] != "Deployment")
        .cloned()
        .collect();
    assert_eq!(
        identity.len(),
        13,
        "SA, 2 roles, 2 bindings (watched and release namespace), 4 policies, 4 bindings"
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

/// A kubeconfig holding a TokenRequest token of `ns/sa`, straight to the API server.
pub async fn service_account_kubeconfig(
    cp: &ControlPlane,
    ns: &str,
    sa: &str,
    dir: &Path,
) -> PathBuf {
    chart_identity::service_account_kubeconfig(cp, ns, sa, &cp.server_url(), dir).await
}

pub async fn client_from(kubeconfig: &Path) -> Client {
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
pub async fn wait_policy_enforced(cp: &ControlPlane, ns: &str, probe: &str) {
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
async fn helm_install_and_upgrade_pass_pod_security_and_render_no_key() {
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
    helm_install_or_upgrade(cp, "upgrade", &release, &ns);
    // Helm makes no key (the operator does, once: tests/chart/lease_id_key.rs),
    // so what `helm install` applies is what `helm template` renders.
    assert!(secrets.get_opt(&name).await.unwrap().is_none());

    // Installed against a real API server: the policy is detected and rendered.
    let kubeconfig = cp.kubeconfig_path().display().to_string();
    let helm_here = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--namespace", &ns, "--kubeconfig", &kubeconfig]);
        helm_ok(&all)
    };
    let manifest = Rendered::parse(&helm_here(&["get", "manifest", &release]));
    for which in ["status-writers", "pod-marks", "lease-metadata"] {
        assert!(
            manifest
                .find_policy("ValidatingAdmissionPolicy", which)
                .is_some()
        );
    }

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
    // So is the OpenShift variant (no fixed user, group or fsGroup).
    let openshift = repo().join("contrib/openshift/values.yaml");
    let os = crate::helm::template(&release, &ns, &["-f", openshift.to_str().unwrap()]);
    let os_spec = os.get("Deployment")["spec"]["template"]["spec"].clone();
    assert!(os_spec["securityContext"]["runAsUser"].is_null());
    pods.create(&dry_run, &pod(os_spec))
        .await
        .expect("the OpenShift values are admitted under Pod Security restricted");
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

    assert!(manifest.find("Secret").is_none());
    helm_here(&["uninstall", &release]);
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

/// Two releases of the same name, each watching its own namespace: neither
/// overwrites the other's cluster-scoped objects, each namespace is guarded
/// by its own release's policy, and each operator writes its own status.
#[tokio::test]
async fn two_releases_of_one_name_guard_their_own_namespaces() {
    let cp = kube_env::shared().await;
    crate::support::operator_env::install_crd(&cp.client()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut operators = Vec::new();
    for ns in [
        cp.namespace("chart-twin").await,
        cp.namespace("chart-twin").await,
    ] {
        let release = install_release_identity(cp, "twin", &ns).await;
        let probe: TargetLease = serde_json::from_value(json!({
            "apiVersion": "targetlease.dev/v1alpha1", "kind": "TargetLease",
            "metadata": { "name": "probe", "namespace": ns },
            "spec": { "target": "probe", "holder": { "identity": "someone" } },
        }))
        .unwrap();
        Api::<TargetLease>::namespaced(cp.client(), &ns)
            .create(&PostParams::default(), &probe)
            .await
            .expect("create the probe TargetLease");
        let kubeconfig =
            service_account_kubeconfig(cp, &ns, &release.service_account, dir.path()).await;
        operators.push((ns, client_from(&kubeconfig).await));
    }
    // Both policies are in force: the second install did not replace the first.
    for (ns, _) in &operators {
        wait_policy_enforced(cp, ns, "probe").await;
    }
    for (i, (ns, own)) in operators.iter().enumerate() {
        write_status(own, ns, "probe")
            .await
            .unwrap_or_else(|e| panic!("the operator of {ns} writes its own status: {e}"));
        // The other release's operator watches its own namespace only: it
        // has no permission here at all.
        let (_, other) = &operators[1 - i];
        let r = write_status(other, ns, "probe").await;
        assert!(refused_by_rbac(&r), "{r:?}");
    }
}

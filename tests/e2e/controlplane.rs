//! Integration tests against a real kube-apiserver + etcd (see
//! `tests/support/kube_env.rs` and `docs/controlplane.md`). They fail, never
//! skip, when the control plane cannot start.

use crate::support::kube_env;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{CustomResource, CustomResourceExt, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use kube_env::{ControlPlane, eventually, shared};

/// A tiny stand-in CRD until the generated TargetLease CRD replaces it.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "test.targetlease.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus",
    shortname = "wdg"
)]
pub struct WidgetSpec {
    pub size: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub color: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct WidgetStatus {
    pub observed_size: i32,
    pub phase: String,
}

const TIMEOUT: Duration = Duration::from_secs(60);

/// Server-side applies the Widget CRD (idempotent) and waits for Established.
async fn install_crd(cp: &ControlPlane) {
    let crds: Api<CustomResourceDefinition> = Api::all(cp.client());
    let name = Widget::crd_name();
    crds.patch(
        name,
        &PatchParams::apply("targetlease-tests").force(),
        &Patch::Apply(Widget::crd()),
    )
    .await
    .expect("applying the Widget CRD");
    tokio::time::timeout(
        TIMEOUT,
        await_condition(crds, name, conditions::is_crd_established()),
    )
    .await
    .expect("CRD not Established within 60s")
    .expect("watching the CRD");
}

fn widget(name: &str, size: i32) -> Widget {
    let mut w = Widget::new(name, WidgetSpec { size, color: None });
    w.metadata.labels = Some([("app".to_string(), "widget-test".to_string())].into());
    w
}

fn is_forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403)
}

#[tokio::test]
async fn crd_objects_watch_and_status_server_side_apply() {
    let cp = shared().await;
    install_crd(cp).await;
    let ns = cp.namespace("crd").await;
    let api: Api<Widget> = Api::namespaced(cp.client(), &ns);

    // Create.
    let created = api
        .create(&PostParams::default(), &widget("w1", 1))
        .await
        .expect("create widget");
    assert_eq!(created.spec.size, 1);
    assert!(created.status.is_none());

    // Watch: a watcher (list, then watch) that has already seen size 1 must
    // receive the spec patch as a watch event.
    let saw_initial = Arc::new(AtomicBool::new(false));
    let waiter = tokio::spawn({
        let api = api.clone();
        let saw_initial = saw_initial.clone();
        async move {
            await_condition(api, "w1", move |w: Option<&Widget>| {
                let size = w.map(|w| w.spec.size);
                if size == Some(1) {
                    saw_initial.store(true, Ordering::SeqCst);
                }
                size == Some(2)
            })
            .await
        }
    });
    eventually("the watcher to see the initial object", TIMEOUT, || async {
        saw_initial.load(Ordering::SeqCst).then_some(())
    })
    .await;
    let patched = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2, "color": "red"}})),
        )
        .await
        .expect("merge-patch spec");
    assert_eq!(
        patched.spec,
        WidgetSpec {
            size: 2,
            color: Some("red".into())
        }
    );
    assert!(
        patched.metadata.generation > created.metadata.generation,
        "spec change bumps generation"
    );
    let seen = tokio::time::timeout(TIMEOUT, waiter)
        .await
        .expect("no watch event within 60s")
        .expect("watch task")
        .expect("watch")
        .expect("object exists");
    assert_eq!(seen.spec.size, 2);
    assert_eq!(seen.resource_version(), patched.resource_version());

    // Status through the /status subresource with server-side apply.
    let status_patch = json!({
        "apiVersion": Widget::api_version(&()),
        "kind": Widget::kind(&()),
        "status": { "observed_size": 2, "phase": "Ready" }
    });
    let with_status = api
        .patch_status(
            "w1",
            &PatchParams::apply("targetlease-status").force(),
            &Patch::Apply(&status_patch),
        )
        .await
        .expect("server-side apply on /status");
    assert_eq!(
        with_status.status,
        Some(WidgetStatus {
            observed_size: 2,
            phase: "Ready".into()
        })
    );
    assert_eq!(
        with_status.spec.size, 2,
        "a /status apply leaves spec alone"
    );
    assert_eq!(
        with_status.metadata.generation, patched.metadata.generation,
        "status does not bump generation"
    );
    let managers: Vec<_> = with_status
        .managed_fields()
        .iter()
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.subresource.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        managers.contains(&("targetlease-status".into(), "status".into())),
        "managedFields: {managers:?}"
    );

    // The main resource ignores status changes (status subresource enabled).
    let ignored = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Hacked"}})),
        )
        .await
        .expect("merge-patch with status on the main resource");
    assert_eq!(ignored.status.unwrap().phase, "Ready");

    // A second apply by another manager on the same field conflicts without force.
    let conflict = api
        .patch_status(
            "w1",
            &PatchParams::apply("someone-else"),
            &Patch::Apply(&status_patch),
        )
        .await;
    match conflict {
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        // Same value applied: SSA shares ownership instead of conflicting.
        Ok(_) => {}
        Err(e) => panic!("unexpected error: {e}"),
    }
    let conflict = api
        .patch_status(
            "w1",
            &PatchParams::apply("someone-else"),
            &Patch::Apply(json!({
                "apiVersion": Widget::api_version(&()),
                "kind": Widget::kind(&()),
                "status": { "observed_size": 3, "phase": "Ready" }
            })),
        )
        .await;
    assert!(
        matches!(&conflict, Err(kube::Error::Api(s)) if s.code == 409),
        "expected a 409 field-manager conflict, got {conflict:?}"
    );

    // Schema validation is real: a wrong type is rejected.
    let bad = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": "big"}})),
        )
        .await;
    assert!(
        matches!(&bad, Err(kube::Error::Api(s)) if s.code == 422),
        "got {bad:?}"
    );

    // Delete.
    api.delete("w1", &Default::default())
        .await
        .expect("delete widget");
    eventually("w1 to be gone", TIMEOUT, || async {
        api.get_opt("w1")
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn rbac_is_enforced_for_service_accounts() {
    let cp = shared().await;
    install_crd(cp).await;
    let ns = cp.namespace("rbac").await;
    let sa_client = cp.service_account_client(&ns, "lease-agent").await;
    let as_sa: Api<Widget> = Api::namespaced(sa_client.clone(), &ns);

    // Without any role: refused.
    let err = as_sa
        .create(&PostParams::default(), &widget("denied", 1))
        .await
        .expect_err("a ServiceAccount without a role must not create widgets");
    assert!(is_forbidden(&err), "expected 403, got {err:?}");
    let err = as_sa
        .list(&Default::default())
        .await
        .expect_err("list must be refused");
    assert!(is_forbidden(&err), "expected 403, got {err:?}");

    // Grant a Role in this namespace only.
    let group = Widget::group(&()).to_string();
    let role = Role {
        metadata: ObjectMeta {
            name: Some("widget-editor".into()),
            ..Default::default()
        },
        rules: Some(vec![
            PolicyRule {
                api_groups: Some(vec![group.clone()]),
                resources: Some(vec!["widgets".into()]),
                verbs: ["get", "list", "watch", "create", "patch", "update"]
                    .map(String::from)
                    .to_vec(),
                ..Default::default()
            },
            PolicyRule {
                api_groups: Some(vec![group]),
                resources: Some(vec!["widgets/status".into()]),
                verbs: ["get", "patch", "update"].map(String::from).to_vec(),
                ..Default::default()
            },
        ]),
    };
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some("widget-editor".into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "widget-editor".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "lease-agent".into(),
            namespace: Some(ns.clone()),
            ..Default::default()
        }]),
    };
    let admin = cp.client();
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await
        .expect("create Role");
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create RoleBinding");

    // The RBAC authorizer's caches catch up within moments.
    let created = eventually("the RoleBinding to take effect", TIMEOUT, || async {
        match as_sa
            .create(&PostParams::default(), &widget("allowed", 1))
            .await
        {
            Ok(w) => Some(w),
            Err(e) if is_forbidden(&e) => None,
            Err(e) => panic!("unexpected error: {e}"),
        }
    })
    .await;
    assert_eq!(created.spec.size, 1);

    let status = as_sa
        .patch_status(
            "allowed",
            &PatchParams::apply("lease-agent").force(),
            &Patch::Apply(json!({
                "apiVersion": Widget::api_version(&()),
                "kind": Widget::kind(&()),
                "status": { "observed_size": 1, "phase": "Ready" }
            })),
        )
        .await
        .expect("status apply allowed by the Role");
    assert_eq!(status.status.unwrap().phase, "Ready");

    // Not granted: delete, and anything in another namespace.
    let err = as_sa
        .delete("allowed", &Default::default())
        .await
        .expect_err("delete not granted");
    assert!(is_forbidden(&err), "expected 403, got {err:?}");
    let other_ns = cp.namespace("rbac-other").await;
    let err = Api::<Widget>::namespaced(sa_client, &other_ns)
        .create(&PostParams::default(), &widget("elsewhere", 1))
        .await
        .expect_err("the Role is namespaced");
    assert!(is_forbidden(&err), "expected 403, got {err:?}");
}

#[tokio::test]
async fn kubectl_readyz_answers_ok() {
    let cp = shared().await;
    let out = tokio::process::Command::new(crate::support::tools::tool("kubectl"))
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args(["get", "--raw", "/readyz"])
        .output()
        .await
        .expect("running kubectl from the tools directory");
    assert!(
        out.status.success(),
        "kubectl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}

/// An owned control plane is fully stopped by Drop: processes gone, dir gone.
#[tokio::test]
async fn owned_control_plane_stops_cleanly() {
    let cp = ControlPlane::start().await;
    let dir = cp.dir().to_path_buf();
    let v = cp
        .client()
        .apiserver_version()
        .await
        .expect("apiserver version");
    assert_eq!(v.major, "1");
    let pids: Vec<(String, u32)> = [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "watchdog",
    ]
    .iter()
    .filter_map(|n| {
        let p = std::fs::read_to_string(dir.join(format!("{n}.pid"))).ok()?;
        Some((n.to_string(), p.trim().parse().ok()?))
    })
    .collect();
    assert!(
        pids.iter().any(|(n, _)| n == "kube-apiserver"),
        "pids: {pids:?}"
    );
    assert!(pids.iter().any(|(n, _)| n == "etcd"), "pids: {pids:?}");
    for (n, p) in &pids {
        assert!(running(*p), "{n} ({p}) should be running");
    }
    drop(cp);
    for (n, p) in &pids {
        assert!(!running(*p), "{n} ({p}) still running after stop");
    }
    assert!(!dir.exists(), "{} should be removed", dir.display());
}

/// Alive and not a zombie (an exited process whose parent has not reaped it yet).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            !matches!(state, Some('Z' | 'X') | None)
        }
        Err(_) => false,
    }
}

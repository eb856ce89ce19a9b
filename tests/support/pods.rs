//! Pods stand in for workloads in the end-to-end tests: there is no kubelet,
//! so readiness is set through the status subresource, and deletion is
//! immediate.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use targetlease::operator::crd::Phase;

use super::kube_env::eventually;
use super::operator_env::{OperatorEnv, summary};

impl OperatorEnv {
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Creates a pod with these labels and readiness.
    pub async fn create_pod(&self, name: &str, labels: &[(&str, &str)], ready: bool) {
        let labels: std::collections::BTreeMap<_, _> = labels.iter().cloned().collect();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": name, "labels": labels },
            "spec": { "containers": [{ "name": "app", "image": "registry.example/app:1.0" }] },
        }))
        .unwrap();
        self.pods()
            .create(&Default::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("create pod {name}: {e}"));
        self.set_ready(name, ready).await;
    }

    /// Sets the pod's Ready condition.
    pub async fn set_ready(&self, name: &str, ready: bool) {
        let status = serde_json::json!({
            "status": { "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }] }
        });
        self.pods()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap_or_else(|e| panic!("set readiness of pod {name}: {e}"));
    }

    /// Deletes a pod at once (no kubelet would finish a graceful deletion).
    pub async fn delete_pod(&self, name: &str) {
        self.pods()
            .delete(name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap_or_else(|e| panic!("delete pod {name}: {e}"));
    }

    /// The marks TargetLease `tl` put on pod `pod`: (leader label, token, expires-at).
    pub async fn marks(
        &self,
        pod: &str,
        tl: &str,
    ) -> (Option<String>, Option<String>, Option<String>) {
        use kube::ResourceExt;
        match self.pods().get_opt(pod).await.expect("read pod") {
            None => (None, None, None),
            Some(p) => (
                p.labels()
                    .get(&format!("{tl}.targetlease.dev/leader"))
                    .cloned(),
                p.annotations()
                    .get(&format!("{tl}.targetlease.dev/fencing-token"))
                    .cloned(),
                p.annotations()
                    .get(&format!("{tl}.targetlease.dev/expires-at"))
                    .cloned(),
            ),
        }
    }

    /// Waits until TargetLease `tl` is Held by pod `pod` with `token`, and
    /// then until the pod carries `tl`'s leader label and that token.
    pub async fn wait_led_by(&self, tl: &str, pod: &str, token: u64, within: Duration) {
        self.wait_for(tl, &format!("led by {pod}"), within, |t| {
            summary(t) == (Some(Phase::Held), Some(pod.into()), Some(token))
        })
        .await;
        let token = token.to_string();
        eventually(&format!("{pod} marked"), within, || async {
            let (label, marked, _) = self.marks(pod, tl).await;
            (label.as_deref() == Some("true") && marked.as_deref() == Some(token.as_str()))
                .then_some(())
        })
        .await;
    }
}

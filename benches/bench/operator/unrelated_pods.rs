//! Memory with pods that no TargetLease selects: an operator watching every
//! namespace starts in a cluster holding N such pods, against one started
//! the same way before they existed. Pods need no kubelet: they are created
//! through the API server, and their status (Ready, a container status) is
//! set through the status subresource, as a kubelet would.

use std::ffi::OsStr;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::process::{How, Operator};
use super::{Bench, Results, UnrelatedPods};

/// How long a started operator is left to work through its caches' events
/// before its memory is read.
const SETTLE: Duration = Duration::from_secs(5);
/// The pods' label naming one of `COMPONENTS` groups.
const COMPONENT: &str = "app.kubernetes.io/component";
const COMPONENTS: usize = 50;
/// The C library's malloc, as the memory table names it.
pub const GLIBC: &str = "glibc malloc (the same source, `--no-default-features`)";
/// The allocator (jemalloc, compiled in) tuned otherwise on the same start:
/// (name, environment).
const ALLOCATORS: [(&str, &str); 1] = [(
    "jemalloc with one arena (`_RJEM_MALLOC_CONF=narenas:1`)",
    "_RJEM_MALLOC_CONF=narenas:1",
)];

pub(super) async fn unrelated_pods(b: &Bench<'_>, n: usize, results: &mut Results) {
    let ns = b.cp.namespace("unrelated-pods").await;
    let idle = operator_memory(b, &ns, 0).await;
    eprintln!("bench: {n} unrelated pods in {ns}");
    let pods: Api<Pod> = Api::namespaced(b.client.clone(), &ns);
    let created: Vec<_> = futures::stream::iter(0..n)
        .map(|i| {
            let pods = pods.clone();
            async move { running_pod(&pods, &format!("app-{i:05}"), i).await }
        })
        .buffer_unordered(b.p.create_parallelism)
        .collect()
        .await;
    if let Some(Err(e)) = created.iter().find(|r| r.is_err()) {
        panic!("creating the unrelated pods: {e}");
    }
    let with_pods = operator_memory(b, &ns, 1).await;
    // The same start with another allocator, measured rather than guessed:
    // the C library's (the same source built without jemalloc), and
    // jemalloc tuned otherwise.
    let glibc = super::glibc_exe();
    if std::env::var_os("BENCH_OPERATOR_EXE").is_some() {
        eprintln!("bench: the glibc row is of this tree's source, not of BENCH_OPERATOR_EXE");
    }
    let mem = operator_memory_under(b, &ns, 2, &[], Some(&glibc)).await;
    let mut allocators = vec![(GLIBC.to_string(), mem.0)];
    for (k, (name, env)) in ALLOCATORS.iter().enumerate() {
        let wrapper = [OsStr::new("env"), OsStr::new(env)];
        let mem = operator_memory_under(b, &ns, 3 + k, &wrapper, None).await;
        allocators.push((name.to_string(), mem.0));
    }
    results.unrelated_pods = Some(UnrelatedPods {
        pods: n,
        idle_hwm_kb: idle.0,
        idle_rss_kb: idle.1,
        hwm_kb: with_pods.0,
        rss_kb: with_pods.1,
        allocators,
    });
    eprintln!(
        "bench: operator VmHWM {} kB with {n} unrelated pods, {} kB without",
        with_pods.0, idle.0
    );
    // Unscheduled pods go at once: later steps see a quiet cluster. In
    // slices, so no one request runs into the API server's timeout.
    for component in 0..COMPONENTS {
        let slice = ListParams::default().labels(&format!("{COMPONENT}=svc-{component}"));
        pods.delete_collection(&DeleteParams::default(), &slice)
            .await
            .expect("delete the unrelated pods");
    }
}

/// (VmHWM, VmRSS) in kB of an operator watching every namespace, once it is
/// ready (every cache listed) and has had `SETTLE` to handle the events.
async fn operator_memory(b: &Bench<'_>, ns: &str, k: usize) -> (u64, u64) {
    operator_memory_under(b, ns, k, &[], None).await
}

async fn operator_memory_under(
    b: &Bench<'_>,
    ns: &str,
    k: usize,
    wrapper: &[&OsStr],
    exe: Option<&std::path::Path>,
) -> (u64, u64) {
    let how = How {
        watch: None,
        wrapper,
        concurrency: None,
        exe,
    };
    let mut op = Operator::start_watching(&b.cp, &b.valkey, ns, b.dir.path(), 100 + k, &how);
    assert!(
        op.wait_ready(Duration::from_secs(120)).await,
        "operator watching all namespaces not ready"
    );
    tokio::time::sleep(SETTLE).await;
    let mem = op.rss();
    op.stop();
    mem
}

/// A pod shaped like a Deployment's: owner labels and annotations, one
/// container with ports, env, resources and probes; then Running and Ready.
async fn running_pod(pods: &Api<Pod>, name: &str, i: usize) -> Result<(), kube::Error> {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/name": "shop",
                COMPONENT: format!("svc-{}", i % COMPONENTS),
                "pod-template-hash": "5d4f8b7c9",
            },
            "annotations": {
                "kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z",
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9090",
            },
        },
        "spec": {
            "containers": [{
                "name": "app",
                "image": "registry.example/shop/app:1.42.0",
                "ports": [{ "name": "http", "containerPort": 8080 }, { "name": "metrics", "containerPort": 9090 }],
                "env": [
                    { "name": "LOG_LEVEL", "value": "info" },
                    { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                    { "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
                    { "name": "DATABASE_URL", "value": "postgres://db.shop.svc:5432/shop" },
                ],
                "resources": {
                    "requests": { "cpu": "100m", "memory": "128Mi" },
                    "limits": { "memory": "256Mi" },
                },
                "readinessProbe": { "httpGet": { "path": "/readyz", "port": 8080 }, "periodSeconds": 5 },
                "livenessProbe": { "httpGet": { "path": "/livez", "port": 8080 }, "periodSeconds": 10 },
            }],
        },
    }))
    .expect("a valid pod");
    pods.create(&PostParams::default(), &pod).await?;
    let status = json!({ "status": {
        "phase": "Running",
        "podIP": format!("10.1.{}.{}", i / 250, i % 250 + 1),
        "conditions": [
            { "type": "PodScheduled", "status": "True" },
            { "type": "Initialized", "status": "True" },
            { "type": "ContainersReady", "status": "True" },
            { "type": "Ready", "status": "True" },
        ],
        "containerStatuses": [{
            "name": "app",
            "ready": true,
            "restartCount": 0,
            "image": "registry.example/shop/app:1.42.0",
            "imageID": "registry.example/shop/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "state": { "running": { "startedAt": "2026-01-01T00:00:00Z" } },
        }],
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

//! One end-to-end environment: a namespace on the shared control plane, a
//! private real Valkey, the CRD installed, and the real `targetlease operator`
//! binary running against both (watching only that namespace).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::Value;
use targetlease::operator::crd::{Phase, TargetLease};

use super::kube_env::{self, ControlPlane};
use super::valkey_server::ValkeyServer;

pub mod control_plane;

pub struct OperatorEnv {
    pub cp: &'static ControlPlane,
    pub ns: String,
    pub valkey: ValkeyServer,
    pub client: Client,
    dir: tempfile::TempDir,
    operators: Vec<Child>,
    admin_ports: Vec<u16>,
    /// Operators started from now on use this kubeconfig (default: the admin
    /// one) and get `POD_NAMESPACE` like a pod would: see `run_operators_as`.
    operator_kubeconfig: Option<PathBuf>,
    /// More environment for operators started from now on (the fault
    /// matrix's fail points).
    pub operator_env: Vec<(String, String)>,
    /// The `targetlease` binary operators started from now on run (default:
    /// [`super::cli::bin`]; the fault matrix's is built with fail points).
    pub binary: PathBuf,
    /// `cp` is this env's own, stopped with it (`start_on_own_control_plane`).
    owns_control_plane: bool,
    /// Operators started from now on watch every namespace (only on a
    /// control plane of the env's own: `watch_every_namespace`).
    watch_all: bool,
    /// The namespace operators started from now on run in, as the chart's
    /// release namespace (floors, leader election, `POD_NAMESPACE`), when it
    /// is not the watched one (`ns`).
    pub release_namespace: Option<String>,
}

/// Installs (or updates) the generated CRD and waits until it is Established.
pub async fn install_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = targetlease::operator::crd::definition();
    crds.patch(
        "targetleases.targetlease.dev",
        &PatchParams::apply("targetlease-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("apply the TargetLease CRD");
    let established = await_condition(
        crds,
        "targetleases.targetlease.dev",
        conditions::is_crd_established(),
    );
    tokio::time::timeout(Duration::from_secs(30), established)
        .await
        .expect("CRD established in time")
        .expect("watch the CRD");
}

impl OperatorEnv {
    pub async fn start(prefix: &str) -> Self {
        let mut env = Self::start_without_operator(prefix).await;
        env.start_operator();
        env
    }

    /// Namespace, Valkey and CRD, but no operator yet.
    pub async fn start_without_operator(prefix: &str) -> Self {
        Self::start_without_operator_on(kube_env::shared().await, prefix).await
    }

    async fn start_without_operator_on(cp: &'static ControlPlane, prefix: &str) -> Self {
        let client = cp.client();
        install_crd(&client).await;
        let ns = cp.namespace(prefix).await;
        let valkey = ValkeyServer::start();
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("lease-id-key"),
            "test-lease-id-key-0123456789abcdef\n",
        )
        .unwrap();
        Self {
            cp,
            ns,
            valkey,
            client,
            dir,
            operators: Vec::new(),
            admin_ports: Vec::new(),
            operator_kubeconfig: None,
            operator_env: Vec::new(),
            binary: super::cli::bin().into(),
            owns_control_plane: false,
            watch_all: false,
            release_namespace: None,
        }
    }

    pub fn key_file(&self) -> PathBuf {
        self.dir.path().join("lease-id-key")
    }

    /// Starts one more operator process; returns its index.
    pub fn start_operator(&mut self) -> usize {
        self.start_operator_with(&[])
    }

    pub fn start_operator_with(&mut self, extra: &[&str]) -> usize {
        let valkey = self.valkey.url();
        self.start_operator_on(&valkey, extra)
    }

    /// Starts one more operator process talking to Valkey at `valkey_url`
    /// (e.g. a proxy in front of a server of the test's own).
    pub fn start_operator_on(&mut self, valkey_url: &str, extra: &[&str]) -> usize {
        let log = std::fs::File::create(
            self.dir
                .path()
                .join(format!("operator-{}.log", self.operators.len())),
        )
        .expect("log file");
        let admin_port = super::valkey_server::free_port();
        let home = self.release_namespace.as_deref().unwrap_or(&self.ns);
        let child = Command::new(&self.binary)
            .arg("operator")
            .args(["--admin-addr", &format!("127.0.0.1:{admin_port}")])
            .env("POD_NAME", format!("operator-{}", self.operators.len()))
            .args(["--valkey-url", valkey_url])
            .arg("--lease-id-key-file")
            .arg(self.key_file())
            .args(["--floor-namespace", home])
            .args(if self.watch_all {
                vec![]
            } else {
                vec!["--watch-namespace", &self.ns]
            })
            .args(extra)
            .env(
                "KUBECONFIG",
                self.operator_kubeconfig
                    .as_deref()
                    .unwrap_or(self.cp.kubeconfig_path()),
            )
            .envs(
                self.operator_kubeconfig
                    .as_ref()
                    .map(|_| ("POD_NAMESPACE", home)),
            )
            .env("RUST_LOG", "targetlease=debug")
            .envs(self.operator_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start targetlease operator");
        self.operators.push(child);
        self.admin_ports.push(admin_port);
        self.operators.len() - 1
    }

    /// Operators started from now on authenticate with `kubeconfig` (e.g. a
    /// ServiceAccount token, so RBAC applies) and see `POD_NAMESPACE` set to
    /// the env's namespace, as the Helm chart's pods do.
    pub fn run_operators_as(&mut self, kubeconfig: PathBuf) {
        self.operator_kubeconfig = Some(kubeconfig);
    }

    /// Port of operator `i`'s admin server.
    pub fn admin_port(&self, i: usize) -> u16 {
        self.admin_ports[i]
    }

    /// Sends SIGTERM to operator `i` and waits for it to exit.
    pub fn stop_operator(&mut self, i: usize) -> std::process::ExitStatus {
        let pid = self.operators[i].id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        self.operators[i].wait().expect("wait for the operator")
    }

    /// Kills an operator process with SIGKILL (a crash).
    pub fn kill_operator(&mut self, i: usize) {
        let _ = self.operators[i].kill();
        let _ = self.operators[i].wait();
    }

    pub fn operator_log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("operator-{i}.log")))
            .unwrap_or_default()
    }

    pub fn api(&self) -> Api<TargetLease> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Merge-patches the spec of TargetLease `name` (a spec edit, as kubectl
    /// would send it).
    pub async fn patch_spec(&self, name: &str, spec: Value) -> TargetLease {
        self.api()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "spec": spec })),
            )
            .await
            .unwrap_or_else(|e| panic!("patch the spec of TargetLease {name}: {e}"))
    }

    /// Creates a TargetLease from a JSON spec.
    pub async fn create(&self, name: &str, spec: impl Into<Value>) -> TargetLease {
        let obj: TargetLease = serde_json::from_value(serde_json::json!({
            "apiVersion": "targetlease.dev/v1alpha1",
            "kind": "TargetLease",
            "metadata": { "name": name, "namespace": self.ns },
            "spec": spec.into(),
        }))
        .expect("a valid TargetLease document");
        self.api()
            .create(&Default::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("create TargetLease {name}: {e}"))
    }

    pub async fn delete(&self, name: &str) {
        self.api()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete TargetLease {name}: {e}"));
    }

    /// Waits until the lease satisfies `pred`, printing the operator log on timeout.
    pub async fn wait_for(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&TargetLease) -> bool,
    ) -> TargetLease {
        let api = self.api();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(tl) = api.get(name).await
                && pred(&tl)
            {
                return tl;
            }
            if tokio::time::Instant::now() >= deadline {
                let current = api.get(name).await.map(|t| format!("{:?}", t.status));
                panic!(
                    "timed out after {timeout:?} waiting for {name} to be {what}; now {current:?}\noperator log:\n{}",
                    self.operator_log(0)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn wait_phase(&self, name: &str, phase: Phase, timeout: Duration) -> TargetLease {
        self.wait_for(name, phase.as_str(), timeout, |tl| {
            tl.status.as_ref().and_then(|s| s.phase) == Some(phase)
        })
        .await
    }

    /// Waits until the `Held` condition has this reason (phases pass through
    /// transient reasons, e.g. Pending/Acquiring before Pending/TargetHeld).
    pub async fn wait_reason(&self, name: &str, reason: &str, timeout: Duration) -> TargetLease {
        self.wait_for(name, reason, timeout, |tl| {
            tl.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Held" && c.reason == reason)
            })
        })
        .await
    }

    pub async fn wait_gone(&self, name: &str, timeout: Duration) {
        let api = self.api();
        kube_env::eventually(&format!("{name} deleted"), timeout, || {
            let api = api.clone();
            async move {
                api.get_opt(name)
                    .await
                    .ok()
                    .flatten()
                    .is_none()
                    .then_some(())
            }
        })
        .await
    }
}

impl Drop for OperatorEnv {
    fn drop(&mut self) {
        for c in &mut self.operators {
            let _ = c.kill();
            let _ = c.wait();
        }
        if self.owns_control_plane {
            self.stop_own_control_plane();
        }
    }
}

/// Phase, holder and token of a lease, for compact assertions.
pub fn summary(tl: &TargetLease) -> (Option<Phase>, Option<String>, Option<u64>) {
    let s = tl.status.clone().unwrap_or_default();
    (s.phase, s.holder, s.fencing_token)
}

/// The condition of `type_` in the lease's status, if any.
pub fn condition(
    tl: &TargetLease,
    type_: &str,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    let status = tl.status.as_ref()?;
    status.conditions.iter().find(|c| c.type_ == type_).cloned()
}

/// Applies every document of a YAML file from `examples/` into the env's
/// namespace (server-side apply); returns (kind, name) of each.
pub async fn apply_example(env: &OperatorEnv, file: &str) -> Vec<(String, String)> {
    apply_yaml(env, &example(file), file).await
}

/// The text of a file of `examples/`.
pub fn example(file: &str) -> String {
    let path = crate::repo().join("examples").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Applies every document of a YAML text into the env's namespace.
pub async fn apply_yaml(env: &OperatorEnv, text: &str, file: &str) -> Vec<(String, String)> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    use serde::Deserialize;
    let mut applied = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value = Value::deserialize(doc).expect("valid YAML");
        if value.is_null() {
            continue;
        }
        let obj: DynamicObject = serde_json::from_value(value).expect("a Kubernetes object");
        let types = obj.types.clone().expect("apiVersion and kind");
        let (group, version) = match types.api_version.split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), types.api_version.clone()),
        };
        let plural = format!("{}s", types.kind.to_lowercase());
        let gvk = GroupVersionKind::gvk(&group, &version, &types.kind);
        let ar = ApiResource::from_gvk_with_plural(&gvk, &plural);
        let api: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.ns, &ar);
        let name = obj.metadata.name.clone().expect("metadata.name");
        api.patch(
            &name,
            &PatchParams::apply("targetlease-tests").force(),
            &Patch::Apply(&obj),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {} {name} from {file}: {e}", types.kind));
        applied.push((types.kind, name));
    }
    applied
}

/// A plain HTTP/1.0 GET on loopback: (status code, body); None when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(conn, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

impl OperatorEnv {
    /// A store client on the env's Valkey.
    pub async fn store(&self) -> targetlease::store::valkey::ValkeyStore {
        targetlease::store::valkey::ValkeyStore::connect(
            &targetlease::store::valkey::ValkeyConfig {
                url: self.valkey.url(),
                ..Default::default()
            },
        )
        .await
        .expect("connect to the test valkey")
    }

    /// The lease id key the env's operators derive lease ids with.
    pub fn lease_id_key(&self) -> targetlease::operator::lease_id::LeaseIdKey {
        let text = std::fs::read_to_string(self.key_file()).unwrap();
        targetlease::operator::lease_id::LeaseIdKey::new(text.trim_end().as_bytes()).unwrap()
    }

    /// Stops (SIGSTOP) or resumes (SIGCONT) operator `i`.
    pub fn pause_operator(&self, i: usize, paused: bool) {
        let pid = self.operators[i].id().to_string();
        let sig = if paused { "-STOP" } else { "-CONT" };
        let _ = Command::new("kill").args([sig, &pid]).status();
    }
}

/// Every version of every TargetLease in a namespace, as a watch delivered it.
pub struct History {
    seen: std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, TargetLease)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl History {
    pub fn record(env: &OperatorEnv) -> Self {
        use futures::StreamExt;
        use kube::runtime::watcher;
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let api = env.api();
        let sink = seen.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher::watcher(api, watcher::Config::default()).boxed();
            while let Some(ev) = events.next().await {
                if let Ok(watcher::Event::Apply(tl) | watcher::Event::InitApply(tl)) = ev {
                    sink.lock().unwrap().push((std::time::Instant::now(), tl));
                }
            }
        });
        Self { seen, task }
    }

    /// The versions of `name`, in the order the watch delivered them.
    pub fn of(&self, name: &str) -> Vec<TargetLease> {
        use kube::ResourceExt;
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, tl)| tl.name_any() == name)
            .map(|(_, tl)| tl.clone())
            .collect()
    }
}

impl Drop for History {
    fn drop(&mut self) {
        self.task.abort();
    }
}

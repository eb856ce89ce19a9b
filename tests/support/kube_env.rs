//! A real Kubernetes control plane (etcd + kube-apiserver, plus
//! kube-controller-manager for namespace deletion and garbage collection) for
//! integration tests, started on loopback by `scripts/controlplane.sh`.
//!
//! Binaries come from the tools directory ([`super::tools`]), where
//! `scripts/setup.sh` builds them. If they are missing, starting panics with
//! instructions: tests never skip.
//!
//! ```ignore
//! use targetlease_test_support as support;
//! use support::kube_env::{ControlPlane, shared};
//!
//! #[tokio::test]
//! async fn my_test() {
//!     let cp = shared().await;              // one control plane per test binary
//!     let ns = cp.namespace("my-test").await; // a fresh namespace per test
//!     let admin = cp.client();             // system:masters
//!     let sa = cp.service_account_client(&ns, "agent").await; // RBAC applies
//! }
//! ```
//!
//! Nothing outlives the test process: `start` passes our pid to the script,
//! whose watchdog stops the control plane and deletes its directory at most
//! about a second after the process exits, whether or not `Drop` ran (statics
//! are never dropped). An owned [`ControlPlane`] is also stopped on `Drop`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::tools::{tool, tools_dir};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn repo_root() -> PathBuf {
    crate::repo().to_owned()
}

fn script() -> PathBuf {
    repo_root().join("scripts/controlplane.sh")
}

/// A running control plane. Stopped on `Drop` (and by the script's watchdog
/// when the test process exits).
pub struct ControlPlane {
    dir: PathBuf,
    kubeconfig: PathBuf,
    config: Config,
    stopped: bool,
}

static NAMESPACE_SEQ: AtomicU32 = AtomicU32::new(0);
static SHARED: tokio::sync::OnceCell<ControlPlane> = tokio::sync::OnceCell::const_new();

/// The control plane shared by all tests of this test binary, started on
/// first use. Never dropped: the watchdog stops it when the process exits.
pub async fn shared() -> &'static ControlPlane {
    SHARED
        .get_or_init(|| async { ControlPlane::start().await })
        .await
}

impl ControlPlane {
    /// Starts a new control plane in a fresh temporary directory.
    /// Panics with the script's output (including log tails) on failure.
    /// A start that fails for a transient reason (a port race, a loaded
    /// machine) is tried again, up to three times; every failure is reported.
    pub async fn start() -> ControlPlane {
        let mut failures = Vec::new();
        for attempt in 1..=3 {
            match Self::try_start().await {
                Ok(cp) => return cp,
                Err(e) => {
                    eprintln!("control plane start attempt {attempt} failed: {e}");
                    failures.push(e.to_string());
                }
            }
        }
        panic!(
            "could not start the test Kubernetes control plane:\n{}",
            failures.join("\n---\n")
        )
    }

    pub async fn try_start() -> Result<ControlPlane, BoxError> {
        // Missing binaries are no transient failure: panic at once.
        tool("etcd");
        tool("kube-apiserver");

        // A unique, empty directory that the script owns and deletes on stop.
        let dir = tempfile::Builder::new()
            .prefix("targetlease-cp-")
            .tempdir()?
            .keep();
        let script = script();
        let out = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || {
                Command::new("bash")
                    .arg(&script)
                    .arg("start")
                    .arg(&dir)
                    .env("TARGETLEASE_TOOLS_DIR", tools_dir())
                    .env("CONTROLPLANE_WATCH_PID", std::process::id().to_string())
                    .env("CONTROLPLANE_OWN_DIR", "1")
                    .output()
            }
        })
        .await??;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(format!(
                "`scripts/controlplane.sh start {}` failed ({}):\n{}{}",
                dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }

        let kubeconfig = dir.join("kubeconfig");
        let kc = Kubeconfig::read_from(&kubeconfig)?;
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        Ok(ControlPlane {
            dir,
            kubeconfig,
            config,
            stopped: false,
        })
    }

    /// Admin (system:masters) client config.
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// A new admin client, bound to the caller's tokio runtime.
    pub fn client(&self) -> Client {
        Client::try_from(self.config()).expect("building an admin kube::Client")
    }

    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The directory holding the kubeconfig, pids, certs (`pki/`) and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `https://127.0.0.1:PORT`
    pub fn server_url(&self) -> String {
        self.config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_string()
    }

    /// Creates a fresh namespace named `{prefix}-{pid}-{n}` and returns its name.
    pub async fn namespace(&self, prefix: &str) -> String {
        let n = NAMESPACE_SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(self.client())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        name
    }

    /// A client that authenticates as ServiceAccount `namespace/name` with a
    /// bearer token from the TokenRequest API, so RBAC applies to it. Creates
    /// the ServiceAccount if needed (the namespace must exist).
    pub async fn service_account_client(&self, namespace: &str, name: &str) -> Client {
        self.try_service_account_client(namespace, name)
            .await
            .unwrap_or_else(|e| panic!("service account client for {namespace}/{name}: {e}"))
    }

    pub async fn try_service_account_client(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Client, BoxError> {
        let sas: Api<ServiceAccount> = Api::namespaced(self.client(), namespace);
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        match sas.create(&PostParams::default(), &sa).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        let tr = TokenRequest {
            spec: TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..Default::default()
            },
            ..Default::default()
        };
        let tr = sas
            .create_token_request(name, &PostParams::default(), &tr)
            .await?;
        let token = tr.status.ok_or("TokenRequest returned no status")?.token;

        let mut config = self.config();
        // Same server and CA; only the credentials change.
        config.auth_info =
            serde_json::from_value::<AuthInfo>(serde_json::json!({ "token": token }))?;
        config.default_namespace = namespace.to_string();
        Ok(Client::try_from(config)?)
    }

    /// Stops the control plane and deletes its directory. Idempotent.
    pub fn stop(&mut self) -> Result<(), BoxError> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        let out = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "`scripts/controlplane.sh stop {}` failed ({}): {}",
                self.dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        Ok(())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("warning: {e}");
        }
    }
}

/// Starts kube-apiserver again in control-plane directory `dir` with the
/// command line `argv` it ran with, records its pid there, and waits until it
/// serves `/readyz`. In its own session, as `scripts/controlplane.sh` starts
/// it, so the control plane's watchdog (not this process) stops it; its
/// stdout and stderr go on in `dir/kube-apiserver.log`. A server that exits
/// first, or does not serve within 120 s, panics with why: its exit status
/// or signal, the end of its log and what else ran.
pub fn start_apiserver_again(dir: &Path, argv: &[String]) {
    let log = dir.join("kube-apiserver.log");
    let mut cmd = Command::new("setsid");
    cmd.args(argv);
    let mut child = super::process::log_to(&mut cmd, &log)
        .spawn()
        .expect("restart kube-apiserver");
    std::fs::write(dir.join("kube-apiserver.pid"), child.id().to_string()).expect("pid file");
    let port = std::fs::read_to_string(dir.join("kube-apiserver.port")).expect("apiserver port");
    let ready = || {
        Command::new("curl")
            .args(["-sS", "--max-time", "2", "--cacert"])
            .arg(dir.join("pki/ca.crt"))
            .arg("--cert")
            .arg(dir.join("pki/admin.crt"))
            .arg("--key")
            .arg(dir.join("pki/admin.key"))
            .arg(format!("https://127.0.0.1:{}/readyz", port.trim()))
            .output()
            .is_ok_and(|o| o.stdout == b"ok")
    };
    let started = super::process::wait_ready(
        "kube-apiserver (restarted)",
        &mut child,
        &log,
        Duration::from_secs(120),
        ready,
    );
    // Reaped if it exited; otherwise the watchdog stops it.
    std::mem::forget(child);
    if let Err(why) = started {
        panic!("kube-apiserver did not come back: {why}");
    }
}

/// Polls `f` every 200ms until it returns `Some`, panicking after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

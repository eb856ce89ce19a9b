//! The node every test of this binary shares, set up the way
//! docs/install.md sets up any cluster: `scripts/node.sh start`, the
//! operator image built by the project's own OCI builder
//! (`scripts/node-images.sh`, from the `targetlease` binary cargo built for
//! these tests) under the chart's default name and loaded into the node, a
//! Valkey listening on loopback and on the node's bridge address, and
//! `helm install` of the chart as it ships (no image setting) in a
//! namespace that enforces Pod Security `restricted`.
//!
//! Pods reach the API server at `<bridge>:6443` (node.sh forwards it to the
//! loopback API server; there is no kube-proxy), so the chart is told where
//! it is with `extraEnv` (KUBERNETES_SERVICE_HOST/PORT), as any pod that
//! talks to the API server must be here. The node cannot pull images: the
//! stock `busybox:1.36` the examples name is the node's own busybox under
//! that name. Nothing outlives the test process: node.sh's watchdog and
//! Valkey's wrapper watch our pid.

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::resp::{Conn, Resp};
use crate::support::tools::tool;
use crate::support::valkey_server::{free_port, server_binary};

/// The operator's namespace (Pod Security `restricted` enforced).
pub const OPERATOR_NS: &str = "targetlease-system";
/// The Helm release, so the chart's objects are named `targetlease…`.
pub const RELEASE: &str = "targetlease";
/// The operator image `scripts/node-images.sh` builds: the chart's default
/// (`image.repository`, tag = appVersion), which the examples name too.
pub const OPERATOR_IMAGE: &str = concat!(
    "ghcr.io/targetlease/targetlease:",
    env!("CARGO_PKG_VERSION")
);

pub struct Node {
    pub dir: PathBuf,
    /// The node's address on its private bridge; pods reach the host there.
    pub bridge: String,
    pub valkey_port: u16,
    /// The operator's pods as `helm install --wait` left them (the kill test
    /// may restart one before the chart test looks).
    pub operator_pods_at_install: Vec<Value>,
    kubectl: PathBuf,
    helm: PathBuf,
}

static NODE: OnceLock<Result<Node, String>> = OnceLock::new();
static TURN: Mutex<()> = Mutex::new(());

/// The shared node, started on first use, and this test's turn on it.
pub fn node() -> (&'static Node, MutexGuard<'static, ()>) {
    let turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    match NODE.get_or_init(Node::start) {
        Ok(node) => (node, turn),
        Err(reason) => panic!("the node could not start, so this test cannot run: {reason}"),
    }
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn tail(bytes: &[u8], lines: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn run(what: &str, cmd: &mut Command) -> Result<Output, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what}: cannot run: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{what} failed ({}):\n{}\n{}",
            out.status,
            tail(&out.stdout, 20),
            tail(&out.stderr, 60)
        ))
    }
}

impl Node {
    fn start() -> Result<Node, String> {
        let uid = run("id -u", Command::new("id").arg("-u"))?;
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            return Err("the node needs root (containers, mounts, a bridge, cgroups)".into());
        }
        let pid = std::process::id().to_string();
        let dir = PathBuf::from(format!("/tmp/tl-node-test.{pid}"));
        let t = Instant::now();
        run(
            "scripts/node.sh start",
            Command::new(repo().join("scripts/node.sh"))
                .arg("start")
                .arg(&dir)
                .env("NODE_WATCH_PID", &pid),
        )?;
        eprintln!("node: started in {:.1}s", t.elapsed().as_secs_f64());
        let subnet = std::fs::read_to_string(dir.join("subnet"))
            .map_err(|e| format!("{}/subnet: {e}", dir.display()))?;
        let bridge = format!("{}.1", subnet.trim());

        let t = Instant::now();
        run(
            "scripts/node-images.sh",
            Command::new(repo().join("scripts/node-images.sh"))
                .arg(env!("CARGO_BIN_EXE_targetlease"))
                .arg(dir.join("tl-images"))
                .arg(&dir),
        )?;
        eprintln!(
            "node: images built and imported in {:.1}s",
            t.elapsed().as_secs_f64()
        );

        let valkey_port = start_valkey(&dir, &bridge, &pid)?;
        let mut node = Node {
            dir,
            bridge,
            valkey_port,
            operator_pods_at_install: Vec::new(),
            kubectl: tool("kubectl"),
            helm: tool("helm"),
        };
        let t = Instant::now();
        node.install_chart()?;
        node.operator_pods_at_install =
            node.pods(OPERATOR_NS, "app.kubernetes.io/instance=targetlease");
        eprintln!(
            "node: chart installed, both replicas Ready, in {:.1}s",
            t.elapsed().as_secs_f64()
        );
        Ok(node)
    }

    fn install_chart(&self) -> Result<(), String> {
        self.try_kubectl(&["create", "namespace", OPERATOR_NS], None)?;
        self.try_kubectl(
            &[
                "label",
                "namespace",
                OPERATOR_NS,
                "pod-security.kubernetes.io/enforce=restricted",
                "pod-security.kubernetes.io/enforce-version=latest",
            ],
            None,
        )?;
        // As docs/install.md has it: the image as loaded, only Valkey set
        // (and, here, where the API server is).
        let values = self.dir.join("values.yaml");
        std::fs::write(
            &values,
            format!(
                "store: {{url: \"{}\"}}\n\
                 extraEnv:\n\
                 \x20 - {{name: KUBERNETES_SERVICE_HOST, value: \"{}\"}}\n\
                 \x20 - {{name: KUBERNETES_SERVICE_PORT, value: \"6443\"}}\n",
                self.valkey_url_for_pods(),
                self.bridge
            ),
        )
        .map_err(|e| format!("{}: {e}", values.display()))?;
        run(
            "helm install",
            Command::new(&self.helm)
                .arg("--kubeconfig")
                .arg(self.kubeconfig())
                .args(["install", RELEASE])
                .arg(repo().join("charts/targetlease"))
                .args(["--namespace", OPERATOR_NS, "--wait", "--timeout", "5m"])
                .arg("--values")
                .arg(&values),
        )
        .map_err(|e| format!("{e}\n{}", self.describe(OPERATOR_NS)))?;
        Ok(())
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// Valkey as pods reach it (the bridge address).
    pub fn valkey_url_for_pods(&self) -> String {
        format!("redis://{}:{}", self.bridge, self.valkey_port)
    }

    /// Valkey as the host reaches it.
    pub fn valkey_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.valkey_port)
    }

    pub fn try_kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        let mut cmd = Command::new(&self.kubectl);
        // A bound on every request (exec included), so a hung call fails the
        // test instead of blocking it: kubectl waits forever by default.
        cmd.arg("--kubeconfig")
            .arg(self.kubeconfig())
            .arg("--request-timeout=120s")
            .args(args);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| format!("kubectl: {e}"))?;
        let mut input = child.stdin.take().expect("stdin is piped");
        if let Some(text) = stdin {
            input
                .write_all(text.as_bytes())
                .map_err(|e| format!("kubectl stdin: {e}"))?;
        }
        drop(input);
        let out = child
            .wait_with_output()
            .map_err(|e| format!("kubectl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "kubectl {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    pub fn kubectl(&self, args: &[&str]) -> String {
        self.try_kubectl(args, None)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&all)).expect("kubectl -o json prints JSON")
    }

    pub fn apply(&self, namespace: &str, yaml: &str) {
        self.try_kubectl(&["apply", "-n", namespace, "-f", "-"], Some(yaml))
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// A namespace of this test's own.
    pub fn namespace(&self, name: &str) -> String {
        self.kubectl(&["create", "namespace", name]);
        name.to_string()
    }

    /// Pods, events and recent operator logs, for a failure message.
    pub fn describe(&self, namespace: &str) -> String {
        let pods = self
            .try_kubectl(&["-n", namespace, "describe", "pods"], None)
            .unwrap_or_else(|e| e);
        let logs = self
            .try_kubectl(
                &[
                    "-n",
                    OPERATOR_NS,
                    "logs",
                    "--tail=30",
                    "--prefix",
                    "-l",
                    "app.kubernetes.io/name=targetlease",
                ],
                None,
            )
            .unwrap_or_else(|e| e);
        format!("--- pods in {namespace} ---\n{pods}\n--- operator logs ---\n{logs}")
    }

    /// The targetlease CLI on the host.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_targetlease"))
            .args(args)
            .args(["--valkey-url", &self.valkey_url()])
            .output()
            .expect("run targetlease")
    }

    /// Pods of `selector` in `namespace`, as JSON items.
    pub fn pods(&self, namespace: &str, selector: &str) -> Vec<Value> {
        let list = self.json(&["-n", namespace, "get", "pods", "-l", selector]);
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// Follows one object with `kubectl get -w`, keeping every version seen
    /// with the instant it arrived.
    pub fn watch(&self, namespace: &str, resource: &str, name: &str) -> Watch {
        let mut child = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(["-n", namespace, "get", resource, name, "-w", "-o", "json"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl get -w");
        let stdout = child.stdout.take().expect("stdout is piped");
        let seen: Arc<Mutex<Vec<(Instant, Value)>>> = Arc::default();
        let sink = Arc::clone(&seen);
        std::thread::spawn(move || {
            let stream = serde_json::Deserializer::from_reader(BufReader::new(stdout));
            for object in stream.into_iter::<Value>().map_while(Result::ok) {
                sink.lock().unwrap().push((Instant::now(), object));
            }
        });
        Watch { child, seen }
    }
}

/// Versions of one object, as `kubectl get -w` delivered them.
pub struct Watch {
    child: Child,
    seen: Arc<Mutex<Vec<(Instant, Value)>>>,
}

impl Watch {
    pub fn seen(&self) -> Vec<(Instant, Value)> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Valkey on loopback and the bridge address (pods reach it there), under
/// a wrapper that stops it when the test process is gone.
fn start_valkey(dir: &Path, bridge: &str, pid: &str) -> Result<u16, String> {
    let port = free_port();
    let data = dir.join("valkey");
    std::fs::create_dir_all(&data).map_err(|e| format!("{}: {e}", data.display()))?;
    let log = std::fs::File::create(dir.join("valkey.log")).map_err(|e| e.to_string())?;
    let wrapper = r#"v="$1"; shift; "$v" "$@" & child=$!
while kill -0 "$WATCH" 2>/dev/null && kill -0 "$child" 2>/dev/null; do sleep 1; done
kill "$child" 2>/dev/null"#;
    Command::new("bash")
        .args(["-c", wrapper, "valkey-watch"])
        .arg(server_binary())
        .args(["--port", &port.to_string(), "--bind"])
        .arg(format!("127.0.0.1 {bridge}"))
        .args(["--protected-mode", "no", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&data)
        .env("WATCH", pid)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("valkey-server: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(mut c) = Conn::connect(&format!("{bridge}:{port}"))
            && c.try_cmd(&["PING"]).ok() == Some(Resp::Simple("PONG".into()))
        {
            return Ok(port);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "valkey-server did not answer on {bridge}:{port} (see {}/valkey.log)",
                dir.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `f` every 100ms until it returns `Some`, panicking after `timeout`
/// with `what` and the state `context` describes.
pub fn eventually<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
    context: impl FnOnce() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}\n{}",
                context()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// GET http://ADDR/PATH: the body of a 200 answer, else `None`.
pub fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    (head.split_whitespace().nth(1) == Some("200")).then(|| body.to_string())
}

/// The pod's Ready condition.
pub fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

pub fn name(object: &Value) -> String {
    object["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
